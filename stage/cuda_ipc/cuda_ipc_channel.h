// The `cuda_ipc` activation channel (stage/device_channel.h) for stages on one host: the
// receiving stage exports a small ring of device buffers ("slots") through a CUDA IPC memory
// handle; the sending stage maps them and copies its activations straight into the next free
// slot, GPU to GPU (or within one GPU: several stage processes may share a device, which NCCL
// refuses). A TcpLink per hop carries the control messages:
//
//   receiver -> sender, once:  tag 0, "RSIP" u32 | version u32 | num_slots u32 | pad u32 |
//                              slot_bytes u64 | cudaIpcMemHandle_t (64 bytes)
//   sender -> receiver:        tag = micro_batch_id, slot u32 | pad u32 | bytes u64
//                              (sent once the copy into the slot has completed)
//   receiver -> sender:        tag = micro_batch_id, empty (the slot may be reused; sent when
//                              the next message is received, so never on the critical path)
//
// Slots are used round robin; the sender waits for a slot's acknowledgement before reusing it,
// so at most num_slots micro-batches are in transit on a hop. The sender enqueues its copy on
// the caller's stream (after its compute) and waits for it before the control message goes
// out; the receiver enqueues its copy out of the slot on its stream and returns at once (the
// forward pass follows on the same stream).
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "stage/device_channel.h"
#include "stage/tcp_channel.h"

namespace ringserve {

struct CudaIpcOptions {
  int device = 0;          // this stage's CUDA ordinal
  int num_slots = 4;       // receiver: slots in the ring
  int64_t slot_bytes = 0;  // receiver: bytes per slot (the largest micro-batch's activations)
};

// Receiving side of hop (sender_index -> sender_index + 1), over a link from
// TcpListener::AcceptLink: allocates the slots on `options.device` and sends their handle.
absl::StatusOr<std::unique_ptr<DeviceActivationReceiver>> CudaIpcAccept(
    std::unique_ptr<TcpLink> link, const CudaIpcOptions& options, absl::Duration timeout);

// Sending side, over a link from TcpConnectLink: reads the handle and maps the receiver's slots
// into this process on `options.device`. FailedPrecondition naming both sides when the memory
// cannot be mapped (different hosts, or GPUs without peer access).
absl::StatusOr<std::unique_ptr<DeviceActivationSender>> CudaIpcConnect(
    std::unique_ptr<TcpLink> link, const CudaIpcOptions& options, absl::Duration timeout);

}  // namespace ringserve
