// The data plane between neighbouring GPU stages: like activation_channel.h, but the bytes live
// in device memory on both ends, so activations go GPU to GPU without touching the host.
// Implementations: cuda_ipc (stages on one host, any GPUs, including several stage processes on
// ONE GPU; stage/channels/cuda_ipc/cuda_ipc_channel.h) and nccl (one GPU per stage, same host or
// across hosts; stage/channels/nccl/nccl_channel.h).
//
// Both ends are bound to one CUDA device (the stage's). A transfer is ordered after everything
// already enqueued on the caller's `stream` (the model's compute stream): Send waits for the
// source to be ready on that stream, and Recv makes the data visible to work enqueued on that
// stream afterwards. Neither blocks the CPU longer than needed to keep that order and to
// enforce `timeout`.
//
// Failure model (as activation_channel.h): every error (wrong micro-batch id, wrong byte count,
// peer gone, timeout, CUDA/NCCL error) is returned as a status, never a hang; after an error the
// channel is broken and every later call fails fast.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/gpu_stream.h"

namespace ringserve {

// Sending end (owned by the stage that produces activations). Not thread-safe: one caller.
class DeviceActivationSender {
 public:
  virtual ~DeviceActivationSender() = default;
  // Sends `bytes` bytes at device pointer `source` as micro-batch `micro_batch_id`, after the
  // work already on `stream`. When it returns OK, `source` may be overwritten by later work on
  // `stream`. DeadlineExceeded when the peer does not take the bytes within `timeout`.
  virtual absl::Status Send(uint64_t micro_batch_id, const void* source, size_t bytes,
                            GpuStream stream, absl::Duration timeout) = 0;
  // Closes the connection: the receiver's pending and later Recv calls fail.
  virtual void Close() = 0;
  virtual int64_t bytes_sent() const = 0;
  // As ActivationSender::Abort and bytes_moved (activation_channel.h); the GPU channels keep
  // the defaults (their calls end at their timeout; progress unknown).
  virtual void Abort() {}
  virtual int64_t bytes_moved() const { return -1; }
};

// Receiving end (owned by the stage that consumes activations). Not thread-safe: one caller.
class DeviceActivationReceiver {
 public:
  virtual ~DeviceActivationReceiver() = default;
  // Receives micro-batch `micro_batch_id`, exactly `bytes` bytes, into device pointer
  // `destination`; work enqueued on `stream` after the call sees the data. DataLoss for a wrong
  // id or size; Unavailable when the peer closed or dropped; DeadlineExceeded after `timeout`.
  virtual absl::Status Recv(uint64_t micro_batch_id, void* destination, size_t bytes,
                            GpuStream stream, absl::Duration timeout) = 0;
  virtual void Close() = 0;
  virtual int64_t bytes_received() const = 0;
  virtual void Abort() {}
  virtual int64_t bytes_moved() const { return -1; }
};

}  // namespace ringserve
