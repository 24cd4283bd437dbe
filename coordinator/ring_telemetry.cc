#include "coordinator/ring_telemetry.h"

#include <algorithm>

namespace ringserve {
namespace {

constexpr int64_t kSpanWindowUs = 5'000'000;    // recent spans and busy fractions
constexpr int64_t kTokenWindowUs = 10'000'000;  // tokens/s
constexpr size_t kMaxSpans = 4096;
constexpr size_t kMaxRecentRequests = 256;

}  // namespace

RingTelemetry::RingTelemetry(std::vector<StageLayout> stages) {
  for (StageLayout& layout : stages) {
    StageTrack track;
    track.layout = std::move(layout);
    stages_.push_back(std::move(track));
  }
}

void RingTelemetry::SetLoadStatus(int stage, std::string status) {
  if (stage >= 0 && stage < static_cast<int>(stages_.size())) {
    stages_[stage].load_status = std::move(status);
  }
}

void RingTelemetry::SetAllLoadStatus(const std::string& status) {
  for (StageTrack& track : stages_) track.load_status = status;
}

void RingTelemetry::OnPlanSent() {
  for (StageTrack& track : stages_) track.in_flight++;
}

void RingTelemetry::OnStepResult(const v1::StepResult& result, int64_t now_us) {
  const int index = result.stage_index();
  if (index < 0 || index >= static_cast<int>(stages_.size())) return;
  StageTrack& track = stages_[index];
  track.in_flight = std::max(0, track.in_flight - 1);
  track.steps++;
  track.bytes_sent += result.bytes_sent();
  track.spans.push_back(StageSpan{.micro_batch_id = result.micro_batch_id(),
                                  .stage_index = index,
                                  .start_us = now_us - result.busy_us(),
                                  .end_us = now_us,
                                  .num_tokens = result.num_tokens()});
  track.waits.emplace_back(now_us, result.wait_us());
  while (!track.spans.empty() &&
         (track.spans.front().end_us < now_us - kSpanWindowUs || track.spans.size() > kMaxSpans)) {
    track.spans.pop_front();
  }
  while (!track.waits.empty() && track.waits.front().first < now_us - kSpanWindowUs) {
    track.waits.pop_front();
  }
}

void RingTelemetry::OnTokens(int count, int64_t now_us) {
  recent_tokens_.emplace_back(now_us, count);
}

void RingTelemetry::OnRingFailed() {
  for (StageTrack& track : stages_) {
    track.in_flight = 0;
    track.load_status = "ring down";
  }
}

void RingTelemetry::CarrySchedulerCounters(const SchedulerStats& stats) {
  counters_.preemptions += stats.preemptions;
  counters_.prefix_lookup_tokens += stats.prefix_lookup_tokens;
  counters_.prefix_hit_tokens += stats.prefix_hit_tokens;
  counters_.ahead_decodes += stats.ahead_decodes;
  counters_.ahead_discarded += stats.ahead_discarded;
  counters_.speculative_verifications += stats.verification_chunks;
  counters_.speculative_drafts_verified += stats.drafts_verified;
  counters_.speculative_drafts_accepted += stats.drafts_accepted;
  counters_.speculative_verification_tokens += stats.tokens_from_verification;
}

void RingTelemetry::OnRingReformed(int resumed) {
  counters_.ring_restarts++;
  counters_.resumed_requests += resumed;
  SetAllLoadStatus("ready");
}

void RingTelemetry::OnRequestFinished(const RequestTiming& timing, double inter_token_sum_ms,
                                      bool had_first_token) {
  if (timing.finish_reason == FinishReason::kError) {
    counters_.requests_failed++;
  } else if (timing.finish_reason == FinishReason::kCancelled) {
    counters_.requests_cancelled++;
  } else {
    counters_.requests_finished++;
  }
  counters_.prompt_tokens += timing.prompt_tokens;
  sum_queue_ms_ += timing.queue_ms;
  if (had_first_token) {
    sum_ttft_ms_ += timing.ttft_ms;
    timed_requests_++;
  }
  if (timing.completion_tokens > 1) {
    sum_inter_token_ms_ += inter_token_sum_ms;
    inter_token_samples_ += timing.completion_tokens - 1;
  }
  recent_requests_.push_back(timing);
  if (recent_requests_.size() > kMaxRecentRequests) recent_requests_.pop_front();
}

RingStats RingTelemetry::Snapshot(int64_t now_us, const SchedulerStats& sched, int kv_num_blocks) {
  RingStats stats;
  const int64_t window = std::min<int64_t>(kSpanWindowUs, std::max<int64_t>(now_us, 1));
  for (size_t i = 0; i < stages_.size(); ++i) {
    const StageTrack& t = stages_[i];
    StageStats s;
    s.index = static_cast<int>(i);
    s.endpoint = t.layout.endpoint;
    s.first_layer = t.layout.first_layer;
    s.last_layer = t.layout.last_layer;
    int64_t busy = 0;
    int n = 0;
    for (const StageSpan& span : t.spans) {
      if (span.end_us < now_us - window) continue;
      busy += span.end_us - std::max(span.start_us, now_us - window);
      ++n;
    }
    s.busy_fraction = std::min(1.0, static_cast<double>(busy) / static_cast<double>(window));
    s.mean_step_ms = n > 0 ? static_cast<double>(busy) / n / 1000.0 : 0;
    int64_t wait = 0;
    for (const auto& [end, w] : t.waits) wait += w;
    s.mean_wait_ms = t.waits.empty() ? 0 : static_cast<double>(wait) / t.waits.size() / 1000.0;
    s.micro_batches_in_flight = t.in_flight;
    s.kv_blocks_used = sched.kv_blocks_used;
    s.kv_blocks_total = kv_num_blocks;
    s.bytes_sent = t.bytes_sent;
    s.load_status = t.load_status;
    s.steps = t.steps;
    stats.stages.push_back(std::move(s));
    for (const StageSpan& span : t.spans) stats.recent_spans.push_back(span);
  }
  std::sort(stats.recent_spans.begin(), stats.recent_spans.end(),
            [](const StageSpan& a, const StageSpan& b) { return a.start_us < b.start_us; });
  stats.requests = counters_;
  stats.requests.queue_depth = sched.waiting;
  stats.requests.running = sched.running;
  stats.requests.micro_batches_in_flight = sched.micro_batches_in_flight;
  stats.requests.preemptions = counters_.preemptions + sched.preemptions;
  stats.requests.prefix_lookup_tokens = counters_.prefix_lookup_tokens + sched.prefix_lookup_tokens;
  stats.requests.prefix_hit_tokens = counters_.prefix_hit_tokens + sched.prefix_hit_tokens;
  stats.requests.ahead_decodes = counters_.ahead_decodes + sched.ahead_decodes;
  stats.requests.ahead_discarded = counters_.ahead_discarded + sched.ahead_discarded;
  stats.requests.speculative_verifications =
      counters_.speculative_verifications + sched.verification_chunks;
  stats.requests.speculative_drafts_verified =
      counters_.speculative_drafts_verified + sched.drafts_verified;
  stats.requests.speculative_drafts_accepted =
      counters_.speculative_drafts_accepted + sched.drafts_accepted;
  stats.requests.speculative_verification_tokens =
      counters_.speculative_verification_tokens + sched.tokens_from_verification;
  while (!recent_tokens_.empty() && recent_tokens_.front().first < now_us - kTokenWindowUs) {
    recent_tokens_.pop_front();
  }
  int64_t tokens = 0;
  for (const auto& [t, n] : recent_tokens_) tokens += n;
  const int64_t token_window = std::min<int64_t>(kTokenWindowUs, std::max<int64_t>(now_us, 1));
  stats.requests.tokens_per_second = static_cast<double>(tokens) * 1e6 / token_window;
  const int64_t finished =
      counters_.requests_finished + counters_.requests_failed + counters_.requests_cancelled;
  stats.requests.mean_queue_ms = finished > 0 ? sum_queue_ms_ / finished : 0;
  stats.requests.mean_ttft_ms = timed_requests_ > 0 ? sum_ttft_ms_ / timed_requests_ : 0;
  stats.requests.mean_inter_token_ms =
      inter_token_samples_ > 0 ? sum_inter_token_ms_ / inter_token_samples_ : 0;
  stats.recent_requests.assign(recent_requests_.begin(), recent_requests_.end());
  return stats;
}

}  // namespace ringserve
