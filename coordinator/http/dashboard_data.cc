#include <algorithm>

#include "coordinator/http/dashboard.h"

namespace ringserve::http {

nlohmann::json DashboardData(const RingStats& stats, const ModelInfo& model) {
  nlohmann::json data;
  data["model"] = {{"id", model.model_id},
                   {"architecture", model.architecture},
                   {"num_layers", model.num_layers},
                   {"max_context", model.max_context}};
  const RequestStats& r = stats.requests;
  data["requests"] = {{"finished", r.requests_finished},
                      {"failed", r.requests_failed},
                      {"cancelled", r.requests_cancelled},
                      {"prompt_tokens", r.prompt_tokens},
                      {"generated_tokens", r.generated_tokens},
                      {"queue_depth", r.queue_depth},
                      {"running", r.running},
                      {"tokens_per_second", r.tokens_per_second}};
  data["speculation"] = {{"verifications", r.speculative_verifications},
                         {"drafts_verified", r.speculative_drafts_verified},
                         {"drafts_accepted", r.speculative_drafts_accepted},
                         {"verification_tokens", r.speculative_verification_tokens}};
  nlohmann::json stages = nlohmann::json::array();
  for (const StageStats& s : stats.stages) {
    stages.push_back({{"index", s.index},
                      {"first_layer", s.first_layer},
                      {"last_layer", s.last_layer},
                      {"busy_fraction", s.busy_fraction},
                      {"mean_step_ms", s.mean_step_ms},
                      {"micro_batches_in_flight", s.micro_batches_in_flight},
                      {"kv_blocks_used", s.kv_blocks_used},
                      {"kv_blocks_total", s.kv_blocks_total},
                      {"bytes_sent", s.bytes_sent},
                      {"load_status", s.load_status}});
  }
  data["stages"] = std::move(stages);
  nlohmann::json spans = nlohmann::json::array();
  int64_t now_us = 0;
  // The page draws the last few seconds; a busy ring has many thousand spans in them.
  constexpr size_t kMaxSpans = 6000;
  size_t first = stats.recent_spans.size() > kMaxSpans ? stats.recent_spans.size() - kMaxSpans : 0;
  for (size_t i = first; i < stats.recent_spans.size(); ++i) {
    const StageSpan& span = stats.recent_spans[i];
    spans.push_back({{"mb", span.micro_batch_id},
                     {"stage", span.stage_index},
                     {"start_us", span.start_us},
                     {"end_us", span.end_us},
                     {"tokens", span.num_tokens}});
    now_us = std::max(now_us, span.end_us);
  }
  data["spans"] = std::move(spans);
  data["now_us"] = now_us;
  return data;
}

}  // namespace ringserve::http
