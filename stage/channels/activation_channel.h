// The data plane between neighbouring stages: one stage's output activations become the next
// stage's input. A channel moves opaque byte buffers tagged with the micro-batch id; the
// receiver always knows from the plan how many bytes to expect, so no metadata travels with the
// data beyond a checked frame header. Implementations: tcp (stage/channels/tcp_channel.h); cuda_ipc
// and nccl plug in behind the same interfaces.
//
// Failure model: every error (wrong micro-batch id, wrong byte count, checksum mismatch, peer
// gone, timeout) is returned as a status, never a hang; after an error the channel is broken
// and every later call fails fast. Abort (from another thread) ends a call blocked on a peer
// that takes or sends nothing, without waiting for its timeout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace ringserve {

// Sending end (owned by the stage that produces activations). Not thread-safe: one caller.
class ActivationSender {
 public:
  virtual ~ActivationSender() = default;
  // Sends `data` (host memory) as micro-batch `micro_batch_id`. Blocks until the bytes are
  // handed to the transport; DeadlineExceeded when the peer does not take them in `timeout`.
  virtual absl::Status Send(uint64_t micro_batch_id, std::span<const std::byte> data,
                            absl::Duration timeout) = 0;
  // Closes the connection: the receiver's pending and later Recv calls fail.
  virtual void Close() = 0;
  virtual int64_t bytes_sent() const = 0;
  // Thread-safe (the one call that may come from another thread while Send blocks): the
  // blocked Send fails at once (Cancelled), and so does every later call; the owner still
  // calls Close. Default: nothing (the Send ends at its timeout).
  virtual void Abort() {}
  // Thread-safe: bytes the transport has taken so far, frame headers and partial messages
  // included, so that a transfer that progresses shows while Send blocks; -1 when the channel
  // cannot tell (the default).
  virtual int64_t bytes_moved() const { return -1; }
};

// Receiving end (owned by the stage that consumes activations). Not thread-safe: one caller.
class ActivationReceiver {
 public:
  virtual ~ActivationReceiver() = default;
  // Receives micro-batch `micro_batch_id` into `out` (host memory), which must be exactly the
  // size the sender sent. DataLoss for a wrong id, size or checksum; Unavailable when the
  // peer closed or dropped; DeadlineExceeded after `timeout` without the complete message.
  virtual absl::Status Recv(uint64_t micro_batch_id, std::span<std::byte> out,
                            absl::Duration timeout) = 0;
  virtual void Close() = 0;
  virtual int64_t bytes_received() const = 0;
  // As ActivationSender::Abort and bytes_moved, for Recv.
  virtual void Abort() {}
  virtual int64_t bytes_moved() const { return -1; }
};

}  // namespace ringserve
