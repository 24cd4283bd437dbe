// FakeRingLink: an in-process RingLink for the engine's unit tests. Once every stage has
// received a micro-batch's plan, it answers at once (on the sending thread) with one result
// per stage; the last stage's tokens come from a fixed function of each sampling chunk's last
// input token and position (FakeNextToken), so a sequence recomputed after a failure continues
// exactly as it would have. Plan-ahead: the last stage's tokens go to stage 0 by a back edge
// (a map here) that fills the placeholders of decodes planned ahead, as a stage does
// (stage/token_back_edge.h). Faults: fail the ring after a number of last-stage results, or
// answer with a stage error.
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

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
  // Time each micro-batch takes (on the sending thread), as a slower ring would.
  absl::Duration step_time = absl::ZeroDuration();
  // Called when the link is closed (the link may be destroyed right after).
  std::function<void()> on_close{};
};

class FakeRingLink final : public RingLink {
 public:
  explicit FakeRingLink(FakeRingOptions options) : options_(options) {}

  int num_stages() const override { return options_.num_stages; }
  absl::Status Open(Handlers handlers) override;
  void Send(int stage, v1::StepPlan plan) override;
  void Close(bool stop_stages) override;

 private:
  const FakeRingOptions options_;
  std::mutex mu_;
  Handlers handlers_;
  bool closed_ = false;
  bool failed_ = false;
  int done_ = 0;
  std::map<uint64_t, std::vector<v1::StepPlan>> pending_;  // micro-batch id -> plans so far
  // Plan-ahead: micro-batch id -> the (seq id, token) pairs its last stage sampled.
  std::map<uint64_t, std::vector<std::pair<uint64_t, int32_t>>> back_edge_;
};

}  // namespace ringserve
