// The `cuda_ipc` activation channel (stage/channels/device_channel.h) for stages on one host: the
// receiving stage exports a small ring of device buffers ("slots") through a CUDA IPC memory
// handle; the sending stage maps them and copies its activations straight into the next free
// slot, GPU to GPU (or within one GPU: several stage processes may share a device, which NCCL
// refuses). A TcpLink per hop carries the control messages:
//
//   receiver -> sender, once:  tag 0, "RSIP" u32 | version u32 (2) | num_slots u32 | pad u32 |
//                              slot_bytes u64 | cudaIpcMemHandle_t (64 bytes) |
//                              per slot (16 at most): cudaIpcEventHandle_t "written",
//                              cudaIpcEventHandle_t "consumed" (64 bytes each; unused: zero)
//   sender -> receiver:        tag = micro_batch_id, slot u32 | pad u32 | bytes u64
//                              (sent as soon as the copy into the slot is enqueued)
//   receiver -> sender:        tag = micro_batch_id, empty (the slot may be reused; sent when
//                              the next message is received, so never on the critical path)
//
// The handoff happens on the GPU, never on a CPU: the sender enqueues its copy into the slot
// after its compute and records the slot's interprocess "written" event; the receiver enqueues
// a wait for that event, its copy out of the slot, and records "consumed"; before the sender
// reuses a slot its stream waits for "consumed". So a stage launches its forward pass while the
// previous stage still computes, and the GPU runs the stages back to back (several stage
// processes on one GPU take turns without the CPU round trips in between). Slots are used round
// robin; the sender waits for a slot's acknowledgement before reusing it, so at most num_slots
// micro-batches are in transit on a hop.
//
// Transfers between two GPUs run on a copy stream of the sender's own, so they overlap the
// sender's next forward pass (a prefill hop over PCIe takes milliseconds): the compute stream
// only copies the activations into one of two local staging buffers (device-local, at copy
// bandwidth) and goes on; the copy stream waits for that, copies the staging buffer into the
// slot over the link and records "written". The compute stream waits for a staging buffer's
// previous transfer before it refills it. Between stages on ONE GPU the slot is written straight
// from the compute stream (a second copy would only add work); CudaIpcOptions::copy_stream
// forces either way.
//
// A peer that dies with a "written" record still pending leaves the receiver's stream waiting;
// the receiver then sees the closed link on its next Recv.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "stage/channels/device_channel.h"
#include "stage/channels/tcp_channel.h"

namespace ringserve {

// Sender: whether transfers run on a copy stream of their own (see above).
enum class CopyStreamMode {
  kAuto,    // when the receiver's slots are on another GPU
  kAlways,  // also on one GPU (tests, measurements)
  kNever,
};
// "auto", "always" or "never" (RINGSERVE_CUDA_IPC_COPY_STREAM for a stage); nullopt otherwise.
std::optional<CopyStreamMode> ParseCopyStreamMode(std::string_view text);

struct CudaIpcOptions {
  int device = 0;          // this stage's CUDA ordinal
  int num_slots = 4;       // receiver: slots in the ring (1 to 16)
  int64_t slot_bytes = 0;  // receiver: bytes per slot (the largest micro-batch's activations)
  CopyStreamMode copy_stream = CopyStreamMode::kAuto;  // sender
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
