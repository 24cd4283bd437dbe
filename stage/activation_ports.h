// How a stage's activations move between its slice's activation buffer
// (stage/model/activation_buffer.h) and its channel ends (stage/channels/), decided once, when
// the step executor is built, from where the buffer lives and which ends the stage has:
//
//   host channel end,   host buffer    the channel reads and writes the buffer directly
//   host channel end,   device buffer  through a host staging vector (a tcp hop between GPUs)
//   device channel end, device buffer  GPU to GPU, ordered on the buffer's stream
//   device channel end, host buffer    refused: FailedPrecondition
//
// A port moves the buffer's tokens() rows, as the slice's Prepare sized them. Not thread-safe
// (one executor thread); the byte counters may be read, and Abort called, from any thread.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "stage/channels/stage_channels.h"
#include "stage/model/activation_buffer.h"

namespace ringserve {

// The previous stage's output into the buffer.
class InputPort {
 public:
  virtual ~InputPort() = default;
  // Receives micro-batch `micro_batch_id` into the buffer's tokens() rows. Errors as the
  // channel's Recv (DataLoss, Unavailable, DeadlineExceeded) or the copy's.
  virtual absl::Status Receive(uint64_t micro_batch_id, absl::Duration timeout) = 0;
  virtual void Close() = 0;
  virtual int64_t bytes_received() const = 0;
  // The channel's Abort and bytes_moved (activation_channel.h).
  virtual void Abort() = 0;
  virtual int64_t bytes_moved() const = 0;
};

// The buffer to the next stage.
class OutputPort {
 public:
  virtual ~OutputPort() = default;
  // Sends the buffer's tokens() rows as micro-batch `micro_batch_id`. A device port returns
  // once the copy is ordered on the buffer's stream (device_channel.h).
  virtual absl::Status Send(uint64_t micro_batch_id, absl::Duration timeout) = 0;
  virtual void Close() = 0;
  virtual int64_t bytes_sent() const = 0;
  // The channel's Abort and bytes_moved (activation_channel.h).
  virtual void Abort() = 0;
  virtual int64_t bytes_moved() const = 0;
};

// Takes the receiving end out of `channels` (null on the first stage: returns null).
// FailedPrecondition for a device end with a host buffer, or both kinds of end at once.
absl::StatusOr<std::unique_ptr<InputPort>> MakeInputPort(StageChannels& channels,
                                                         ActivationBuffer& buffer);
// Takes the sending end out of `channels` (null on the last stage: returns null). Errors as
// MakeInputPort's.
absl::StatusOr<std::unique_ptr<OutputPort>> MakeOutputPort(StageChannels& channels,
                                                           ActivationBuffer& buffer);

}  // namespace ringserve
