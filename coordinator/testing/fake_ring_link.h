// FakeRingLink: an in-process RingLink for the engine's unit tests. Once every stage has
// received a micro-batch's plan, it answers at once (on the sending thread) with one result
// per stage; the last stage's tokens come from a fixed function of each sampling chunk's last
// input token and position (FakeNextToken), so a sequence recomputed after a failure continues
// exactly as it would have. Plan-ahead: the last stage's tokens go to stage 0 by a back edge
// (a map here) that fills the placeholders of decodes planned ahead, as a stage does
// (stage/token_back_edge.h). Faults: fail the ring after a number of last-stage results, or
// answer with a stage error; a test can hold the fault back (a notification) until it has
// submitted every request the failure is meant to find running.
//
// Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "coordinator/ring_link.h"

namespace ringserve {

// The fake model: the token after `token` at position `position`.
int32_t FakeNextToken(int32_t token, int32_t position, int vocab_size);

struct FakeRingOptions {
  int num_stages = 2;
  int vocab_size = 97;
  // After this many micro-batches have finished, the next one fails the ring (-1: never).
  int fail_after_micro_batches = -1;
  // With fail_after_micro_batches: report a stage error result instead of a link failure.
  bool fail_as_stage_error = false;
  // With fail_after_micro_batches: the failing micro-batch waits (on the sending thread, which
  // holds no engine lock) until this gate opens, so that a test's requests are all admitted
  // before the ring fails; after `fault_gate_wait` (a test that never opened it) it fails anyway.
  std::shared_ptr<absl::Notification> fault_gate{};
  absl::Duration fault_gate_wait = absl::Seconds(10);
  // Time each micro-batch takes (on the sending thread), as a slower ring would.
  absl::Duration step_time = absl::ZeroDuration();
  // Called when the link is closed (the link may be destroyed right after).
  std::function<void()> on_close{};
  // A stream ends while the link closes, as GrpcRingLink's do: Close starts a stream reader
  // that reports the failure under the link's lock (GrpcRingLink::Fail), then takes that lock
  // itself (GrpcRingLink::Close). A caller of Close (or of the destructor) that holds a lock
  // the failure handler takes would deadlock there; the fake gives up after `close_wait`,
  // counts it in `close_deadlocks` and returns (the reader then finishes on its own).
  bool stream_ends_on_close = false;
  absl::Duration close_wait = absl::Seconds(2);
  std::shared_ptr<std::atomic<int>> close_deadlocks{};
};

class FakeRingLink final : public RingLink {
 public:
  explicit FakeRingLink(FakeRingOptions options) : options_(options) {}
  ~FakeRingLink() override { Close(/*stop_stages=*/false); }  // as GrpcRingLink

  int num_stages() const override { return options_.num_stages; }
  absl::Status Open(Handlers handlers) override;
  void Send(int stage, v1::StepPlan plan) override;
  void Close(bool stop_stages) override;

 private:
  // stream_ends_on_close: the stream reader that reports the failure while Close runs.
  void EndStreamWhileClosing(std::function<void(absl::Status)> on_failure);

  const FakeRingOptions options_;
  std::mutex mu_;
  // stream_ends_on_close: the link's lock as its stream reader and Close take it (shared: a
  // reader Close gave up on may outlive the link).
  std::shared_ptr<std::timed_mutex> stream_mu_ = std::make_shared<std::timed_mutex>();
  Handlers handlers_;
  bool closed_ = false;
  bool failed_ = false;
  int done_ = 0;
  std::map<uint64_t, std::vector<v1::StepPlan>> pending_;  // micro-batch id -> plans so far
  // Plan-ahead: micro-batch id -> the (seq id, token) pairs its last stage sampled.
  std::map<uint64_t, std::vector<std::pair<uint64_t, int32_t>>> back_edge_;
};

}  // namespace ringserve
