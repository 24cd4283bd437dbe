// What a stage process builds from its ConfigureRequest: the model slice on the asked device
// (cpu, or cuda:N when this build has the CUDA backend) and the activation channel ends to its
// neighbours (tcp, or cuda_ipc / nccl between CUDA stages). Keeps stage_service.cc free of
// backend details and of the CUDA headers.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/stage.pb.h"
#include "stage/channels/stage_channels.h"
#include "stage/channels/tcp_channel.h"
#include "stage/model/model_slice.h"

namespace ringserve {

// Checks `device` and `channel` of a request against what this build offers: "cpu" or "cuda:N"
// (N >= 0) with the CUDA backend; "tcp" for any device, "cuda_ipc" and "nccl" only with a cuda
// device (and nccl only when built with NCCL). InvalidArgument or Unimplemented naming the field.
absl::Status CheckBackend(const v1::ConfigureRequest& request);

// Loads the slice that `request` names. A CUDA slice takes its KV pool size from the request,
// or (kv_num_blocks 0) from memory_fraction of the device's memory; its activation buffers hold
// max_batch_tokens tokens. `summary` gets a human-readable line (device, memory).
absl::StatusOr<std::unique_ptr<ModelSlice>> LoadStageSlice(const v1::ConfigureRequest& request,
                                                           std::string* summary);

// Memory a stage on `device` plans with: the GPU's total memory (cuda:N; every stage on it
// shares it) or the host's available memory (cpu: MemAvailable). Errors name the device.
absl::StatusOr<int64_t> StageDeviceMemoryBytes(const std::string& device);

// Bytes one stored weight or K/V value takes on `device`'s backend: 4 on the CPU (fp32), 2 on
// CUDA (bf16).
int StageValueBytes(const std::string& device);

// Joins the ring: accepts the previous stage on `listener` (unless first) while connecting to
// `next_endpoint` (unless last), with the channel kind of `request`. `slice` is the loaded slice
// (sizes the cuda_ipc slots). Errors name the neighbour.
absl::StatusOr<StageChannels> ConnectStageChannels(const v1::ConfigureRequest& request,
                                                   const ModelSlice& slice, TcpListener* listener,
                                                   const std::string& next_endpoint,
                                                   absl::Duration timeout,
                                                   const RingSecret* secret = nullptr);

}  // namespace ringserve
