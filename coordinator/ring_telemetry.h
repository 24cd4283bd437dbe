// RingTelemetry: the engine's statistics in one place. The engine feeds it events (a plan sent,
// a stage's step result, tokens generated, a request finished, the ring failed or re-formed)
// and Snapshot() turns them into the RingStats that gRPC Stats, /metrics and the dashboard
// show. Time is passed in (microseconds on the engine's clock), so tests drive it directly.
//
// Not thread-safe: the engine calls it under its own mutex.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/engine.h"
#include "coordinator/scheduler/scheduler.h"
#include "proto/stage.pb.h"

namespace ringserve {

// Where each stage sits in the ring (for the stats' layout).
struct StageLayout {
  std::string endpoint{};
  int first_layer = 0;
  int last_layer = 0;
};

class RingTelemetry {
 public:
  explicit RingTelemetry(std::vector<StageLayout> stages);

  void SetLoadStatus(int stage, std::string status);
  void SetAllLoadStatus(const std::string& status);
  // A micro-batch's plan went to every stage.
  void OnPlanSent();
  // A stage finished a micro-batch (its busy and wait times are on the stage's clock; the span
  // is placed to end at `now_us`).
  void OnStepResult(const v1::StepResult& result, int64_t now_us);
  void OnTokens(int count, int64_t now_us);
  // The ring failed: plans in flight are lost.
  void OnRingFailed();
  // The ring was formed again after a failure, resuming `resumed` requests.
  void OnRingReformed(int resumed);
  void OnRejected() { counters_.rejected++; }
  // Preemptions counted by a scheduler that is being replaced (its counter starts again).
  void CarryPreemptions(int64_t count) { counters_.preemptions += count; }
  // A request ended; `timing` carries its queue, TTFT and inter-token figures, measured once
  // by the engine. `inter_token_sum_ms` is the sum of its gaps (completion_tokens - 1 of them).
  void OnRequestFinished(const RequestTiming& timing, double inter_token_sum_ms,
                         bool had_first_token);
  void OnGeneratedToken() { counters_.generated_tokens++; }

  RingStats Snapshot(int64_t now_us, const SchedulerStats& scheduler, int kv_num_blocks);

 private:
  struct StageTrack {
    StageLayout layout;
    std::string load_status = "connecting";
    int in_flight = 0;
    int64_t steps = 0;
    int64_t bytes_sent = 0;
    std::deque<StageSpan> spans;                    // recent, oldest first
    std::deque<std::pair<int64_t, int64_t>> waits;  // (end us, wait us), recent
  };

  std::vector<StageTrack> stages_;
  RequestStats counters_;
  std::deque<RequestTiming> recent_requests_;
  std::deque<std::pair<int64_t, int>> recent_tokens_;  // (us, tokens) for tokens/s
  double sum_queue_ms_ = 0, sum_ttft_ms_ = 0, sum_inter_token_ms_ = 0;
  int64_t timed_requests_ = 0, inter_token_samples_ = 0;
};

}  // namespace ringserve
