#include "coordinator/http/metrics.h"

#include <algorithm>
#include <cmath>

#include "fmt/format.h"

namespace ringserve::http {
namespace {

// Latency buckets in seconds: CPU test rings step in milliseconds, GPU rings in tens of
// microseconds per token, and a long prefill can take many seconds.
std::vector<double> TtftBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}
std::vector<double> ItlBuckets() {
  return {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5};
}
std::vector<double> DurationBuckets() {
  return {0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300};
}

class Writer {
 public:
  void Family(std::string_view name, std::string_view type, std::string_view help) {
    out_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  }
  void Sample(std::string_view name, std::string_view labels, double value) {
    if (labels.empty()) {
      out_ += fmt::format("{} {}\n", name, FormatSampleValue(value));
    } else {
      out_ += fmt::format("{}{{{}}} {}\n", name, labels, FormatSampleValue(value));
    }
  }
  void HistogramSamples(std::string_view name, const Histogram::Snapshot& snapshot) {
    for (size_t i = 0; i < snapshot.bounds.size(); ++i) {
      Sample(fmt::format("{}_bucket", name),
             fmt::format("le=\"{}\"", FormatSampleValue(snapshot.bounds[i])),
             static_cast<double>(snapshot.cumulative_counts[i]));
    }
    Sample(fmt::format("{}_bucket", name), "le=\"+Inf\"",
           static_cast<double>(snapshot.cumulative_counts.back()));
    Sample(fmt::format("{}_sum", name), "", snapshot.sum);
    Sample(fmt::format("{}_count", name), "", static_cast<double>(snapshot.count));
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

std::string StageLabel(const StageStats& stage) { return fmt::format("stage=\"{}\"", stage.index); }

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double value) {
  size_t bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  std::lock_guard<std::mutex> lock(mu_);
  ++counts_[bucket];
  sum_ += value;
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot snapshot;
  snapshot.bounds = bounds_;
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t running = 0;
  for (uint64_t count : counts_) {
    running += count;
    snapshot.cumulative_counts.push_back(running);
  }
  snapshot.count = running;
  snapshot.sum = sum_;
  return snapshot;
}

std::string_view RequestOutcomeName(RequestOutcome outcome) {
  switch (outcome) {
    case RequestOutcome::kStop:
      return "stop";
    case RequestOutcome::kLength:
      return "length";
    case RequestOutcome::kCancelled:
      return "cancelled";
    case RequestOutcome::kError:
      return "error";
    case RequestOutcome::kRejected:
      return "rejected";
  }
  return "unknown";
}

ServingMetrics::ServingMetrics()
    : ttft_(TtftBuckets()), itl_(ItlBuckets()), e2e_(DurationBuckets()) {}

void ServingMetrics::RecordOutcome(std::string_view api, RequestOutcome outcome) {
  std::lock_guard<std::mutex> lock(mu_);
  ++outcomes_[{std::string(api), std::string(RequestOutcomeName(outcome))}];
}

RequestRecorder::RequestRecorder(ServingMetrics* metrics, std::string api)
    : metrics_(metrics), api_(std::move(api)), arrival_(Clock::now()) {}

void RequestRecorder::OnEvent(const GenerateEvent& event) {
  if (metrics_ == nullptr) return;
  const Clock::time_point now = Clock::now();
  if (!event.token_ids.empty()) {
    if (!seen_token_) {
      metrics_->ObserveTimeToFirstToken(std::chrono::duration<double>(now - arrival_).count());
      // Tokens after the first one in the same event arrived together.
      for (size_t i = 1; i < event.token_ids.size(); ++i) metrics_->ObserveInterTokenLatency(0);
    } else {
      const double gap = std::chrono::duration<double>(now - last_token_).count();
      const double per_token = gap / static_cast<double>(event.token_ids.size());
      for (size_t i = 0; i < event.token_ids.size(); ++i) {
        metrics_->ObserveInterTokenLatency(per_token);
      }
    }
    seen_token_ = true;
    last_token_ = now;
  }
  if (!event.finished) return;
  switch (event.finish_reason) {
    case FinishReason::kStop:
    case FinishReason::kLength:
      metrics_->RecordOutcome(api_, event.finish_reason == FinishReason::kStop
                                        ? RequestOutcome::kStop
                                        : RequestOutcome::kLength);
      metrics_->ObserveRequestDuration(std::chrono::duration<double>(now - arrival_).count());
      break;
    case FinishReason::kCancelled:
      metrics_->RecordOutcome(api_, RequestOutcome::kCancelled);
      break;
    default:
      metrics_->RecordOutcome(api_, RequestOutcome::kError);
      break;
  }
}

void ServingMetrics::ObserveTimeToFirstToken(double seconds) { ttft_.Observe(seconds); }
void ServingMetrics::ObserveInterTokenLatency(double seconds) { itl_.Observe(seconds); }
void ServingMetrics::ObserveRequestDuration(double seconds) { e2e_.Observe(seconds); }

void ServingMetrics::RecordHttpResponse(std::string_view route, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++http_responses_[{std::string(route), status}];
}

void ServingMetrics::AddInFlight(int delta) {
  std::lock_guard<std::mutex> lock(mu_);
  in_flight_ += delta;
}

std::map<std::pair<std::string, std::string>, uint64_t> ServingMetrics::Outcomes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return outcomes_;
}

std::map<std::pair<std::string, int>, uint64_t> ServingMetrics::HttpResponses() const {
  std::lock_guard<std::mutex> lock(mu_);
  return http_responses_;
}

int64_t ServingMetrics::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_flight_;
}

std::string EscapeLabelValue(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string FormatSampleValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", value);
}

std::string RenderPrometheus(const ServingMetrics& metrics, const RingStats& stats,
                             const ModelInfo& model) {
  Writer w;
  w.Family("ringserve_model_info", "gauge", "The served model (value is always 1).");
  w.Sample("ringserve_model_info",
           fmt::format("model=\"{}\",architecture=\"{}\"", EscapeLabelValue(model.model_id),
                       EscapeLabelValue(model.architecture)),
           1);

  // Requests, as the client APIs saw them end.
  w.Family("ringserve_requests_total", "counter",
           "Client requests by API and outcome (stop, length, cancelled, error, rejected).");
  std::map<std::pair<std::string, std::string>, uint64_t> outcomes = metrics.Outcomes();
  for (std::string_view api : {"http", "grpc"}) {
    for (RequestOutcome outcome :
         {RequestOutcome::kStop, RequestOutcome::kLength, RequestOutcome::kCancelled,
          RequestOutcome::kError, RequestOutcome::kRejected}) {
      outcomes.try_emplace({std::string(api), std::string(RequestOutcomeName(outcome))}, 0);
    }
  }
  for (const auto& [key, count] : outcomes) {
    w.Sample("ringserve_requests_total",
             fmt::format("api=\"{}\",outcome=\"{}\"", EscapeLabelValue(key.first), key.second),
             static_cast<double>(count));
  }
  w.Family("ringserve_http_responses_total", "counter", "HTTP responses by route and status code.");
  for (const auto& [key, count] : metrics.HttpResponses()) {
    w.Sample("ringserve_http_responses_total",
             fmt::format("route=\"{}\",code=\"{}\"", EscapeLabelValue(key.first), key.second),
             static_cast<double>(count));
  }
  w.Family("ringserve_api_requests_in_flight", "gauge",
           "Requests the client APIs are serving right now.");
  w.Sample("ringserve_api_requests_in_flight", "", static_cast<double>(metrics.in_flight()));

  // The engine's own counts (every API).
  const RequestStats& req = stats.requests;
  w.Family("ringserve_engine_requests_total", "counter",
           "Requests the engine has ended, by result (finished, failed, cancelled).");
  w.Sample("ringserve_engine_requests_total", "result=\"finished\"",
           static_cast<double>(req.requests_finished));
  w.Sample("ringserve_engine_requests_total", "result=\"failed\"",
           static_cast<double>(req.requests_failed));
  w.Sample("ringserve_engine_requests_total", "result=\"cancelled\"",
           static_cast<double>(req.requests_cancelled));
  w.Family("ringserve_prompt_tokens_total", "counter", "Prompt tokens processed (prefill).");
  w.Sample("ringserve_prompt_tokens_total", "", static_cast<double>(req.prompt_tokens));
  w.Family("ringserve_generation_tokens_total", "counter", "Tokens generated.");
  w.Sample("ringserve_generation_tokens_total", "", static_cast<double>(req.generated_tokens));
  w.Family("ringserve_queue_depth", "gauge", "Requests waiting for admission.");
  w.Sample("ringserve_queue_depth", "", req.queue_depth);
  w.Family("ringserve_running_requests", "gauge", "Requests admitted and generating.");
  w.Sample("ringserve_running_requests", "", req.running);
  w.Family("ringserve_preemptions_total", "counter",
           "Sequences preempted (KV cache full) and recomputed later.");
  w.Sample("ringserve_preemptions_total", "", static_cast<double>(req.preemptions));
  w.Family("ringserve_prefix_cache_lookup_tokens_total", "counter",
           "Prompt tokens of admitted requests looked up in the prefix cache.");
  w.Sample("ringserve_prefix_cache_lookup_tokens_total", "",
           static_cast<double>(req.prefix_lookup_tokens));
  w.Family("ringserve_prefix_cache_hit_tokens_total", "counter",
           "Prompt tokens found in the prefix cache (their prefill skipped).");
  w.Sample("ringserve_prefix_cache_hit_tokens_total", "",
           static_cast<double>(req.prefix_hit_tokens));
  // Speculative decoding: drafts verify on the last stage, so its stage label names it.
  {
    const std::string last =
        fmt::format("stage=\"{}\"", stats.stages.empty() ? 0 : stats.stages.size() - 1);
    auto ratio = [](int64_t num, int64_t den) {
      return den > 0 ? static_cast<double>(num) / static_cast<double>(den) : 0.0;
    };
    w.Family("ringserve_speculative_verifications_total", "counter",
             "Verification chunks (the accepted token plus k drafts) the last stage verified.");
    w.Sample("ringserve_speculative_verifications_total", last,
             static_cast<double>(req.speculative_verifications));
    w.Family("ringserve_speculative_draft_tokens_total", "counter", "Draft tokens verified.");
    w.Sample("ringserve_speculative_draft_tokens_total", last,
             static_cast<double>(req.speculative_drafts_verified));
    w.Family("ringserve_speculative_accepted_tokens_total", "counter", "Draft tokens accepted.");
    w.Sample("ringserve_speculative_accepted_tokens_total", last,
             static_cast<double>(req.speculative_drafts_accepted));
    w.Family("ringserve_speculative_acceptance_rate", "gauge",
             "Accepted / verified draft tokens since start (0 before any).");
    w.Sample("ringserve_speculative_acceptance_rate", last,
             ratio(req.speculative_drafts_accepted, req.speculative_drafts_verified));
    w.Family("ringserve_speculative_tokens_per_step", "gauge",
             "Tokens emitted per verification step since start (accepted + 1; 0 before any).");
    w.Sample("ringserve_speculative_tokens_per_step", last,
             ratio(req.speculative_verification_tokens, req.speculative_verifications));
  }
  w.Family("ringserve_ring_restarts_total", "counter",
           "Times the ring was formed again after a stage failure.");
  w.Sample("ringserve_ring_restarts_total", "", static_cast<double>(req.ring_restarts));
  w.Family("ringserve_resumed_requests_total", "counter",
           "Requests resumed by recomputation after the ring was formed again.");
  w.Sample("ringserve_resumed_requests_total", "", static_cast<double>(req.resumed_requests));
  w.Family("ringserve_engine_rejected_total", "counter",
           "New requests the engine refused because its ring was down (re-forming).");
  w.Sample("ringserve_engine_rejected_total", "", static_cast<double>(req.rejected));
  w.Family("ringserve_generation_tokens_per_second", "gauge",
           "Generated tokens per second over the engine's recent window.");
  w.Sample("ringserve_generation_tokens_per_second", "", req.tokens_per_second);

  w.Family("ringserve_time_to_first_token_seconds", "histogram",
           "Time from request arrival to its first generated token.");
  w.HistogramSamples("ringserve_time_to_first_token_seconds", metrics.time_to_first_token().Read());
  w.Family("ringserve_inter_token_latency_seconds", "histogram",
           "Time between consecutive generated tokens of a request.");
  w.HistogramSamples("ringserve_inter_token_latency_seconds", metrics.inter_token_latency().Read());
  w.Family("ringserve_request_duration_seconds", "histogram",
           "Time from request arrival to its last token, for requests that finished.");
  w.HistogramSamples("ringserve_request_duration_seconds", metrics.request_duration().Read());

  // Per stage.
  w.Family("ringserve_stage_info", "gauge",
           "One series per stage: its decoder layers [first_layer, last_layer) (control "
           "endpoints are not published here).");
  for (const StageStats& s : stats.stages) {
    w.Sample("ringserve_stage_info",
             fmt::format("stage=\"{}\",first_layer=\"{}\",last_layer=\"{}\"", s.index,
                         s.first_layer, s.last_layer),
             1);
  }
  w.Family("ringserve_stage_ready", "gauge", "1 once the stage has loaded and is serving.");
  for (const StageStats& s : stats.stages) {
    w.Sample("ringserve_stage_ready", StageLabel(s), s.load_status == "ready" ? 1 : 0);
  }
  w.Family("ringserve_stage_busy_ratio", "gauge",
           "Fraction of wall time the stage spent computing, over the recent window (0..1).");
  for (const StageStats& s : stats.stages) {
    w.Sample("ringserve_stage_busy_ratio", StageLabel(s), s.busy_fraction);
  }
  w.Family("ringserve_stage_step_seconds", "gauge",
           "Mean busy time per micro-batch on the stage, over the recent window.");
  for (const StageStats& s : stats.stages) {
    w.Sample("ringserve_stage_step_seconds", StageLabel(s), s.mean_step_ms / 1000.0);
  }
  w.Family("ringserve_stage_micro_batches_in_flight", "gauge",
           "Micro-batches planned for the stage and not yet finished there.");
  for (const StageStats& s : stats.stages) {
    w.Sample("ringserve_stage_micro_batches_in_flight", StageLabel(s), s.micro_batches_in_flight);
  }
  w.Family("ringserve_stage_kv_blocks", "gauge", "KV cache blocks on the stage, used and free.");
  for (const StageStats& s : stats.stages) {
    w.Sample("ringserve_stage_kv_blocks", StageLabel(s) + ",state=\"used\"",
             static_cast<double>(s.kv_blocks_used));
    w.Sample("ringserve_stage_kv_blocks", StageLabel(s) + ",state=\"free\"",
             static_cast<double>(std::max<int64_t>(0, s.kv_blocks_total - s.kv_blocks_used)));
  }
  w.Family("ringserve_stage_sent_bytes_total", "counter",
           "Activation bytes sent from a stage to the next stage of the ring (one hop).");
  const int num_stages = static_cast<int>(stats.stages.size());
  for (const StageStats& s : stats.stages) {
    if (s.index + 1 >= num_stages) continue;  // the last stage sends tokens, not activations
    w.Sample("ringserve_stage_sent_bytes_total",
             fmt::format("stage=\"{}\",hop=\"{}->{}\"", s.index, s.index, s.index + 1),
             static_cast<double>(s.bytes_sent));
  }
  return w.Take();
}

}  // namespace ringserve::http
