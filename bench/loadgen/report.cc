// The load generator's report as JSON and as a table.
#include <string>

#include "bench/loadgen/loadgen.h"
#include "fmt/format.h"

namespace ringserve::loadgen {
namespace {

nlohmann::json SummaryJson(const Summary& s) {
  return {{"count", s.count}, {"mean", s.mean}, {"min", s.min}, {"max", s.max},
          {"p50", s.p50},     {"p90", s.p90},   {"p99", s.p99}};
}

std::string SummaryRow(const std::string& name, const Summary& s) {
  return fmt::format("  {:<22} {:>10.3f} {:>10.3f} {:>10.3f} {:>10.3f} {:>10.3f} {:>8}\n", name,
                     s.mean, s.p50, s.p99, s.min, s.max, s.count);
}

}  // namespace

nlohmann::json ReportToJson(const LoadgenReport& r) {
  const LoadgenOptions& o = r.options;
  nlohmann::json j;
  j["config"] = {{"target", o.target},
                 {"streams", o.streams},
                 {"prompt_tokens", r.prompt_tokens},
                 {"prompt_text", o.prompt_text},
                 {"max_tokens", o.max_tokens},
                 {"ignore_eos", o.ignore_eos},
                 {"temperature", o.temperature},
                 {"requests", o.requests},
                 {"duration_s", o.duration_s},
                 {"seed", o.seed},
                 {"request_timeout_s", o.request_timeout_s},
                 {"stats_interval_s", o.stats_interval_s},
                 {"max_errors", o.max_errors}};
  j["model"] = {{"model_id", r.model_id},
                {"architecture", r.architecture},
                {"num_layers", r.num_layers},
                {"vocab_size", r.vocab_size},
                {"num_stages", r.num_stages}};
  j["wall_s"] = r.wall_s;
  j["requests"] = {{"started", r.requests_started}, {"completed", r.requests_completed},
                   {"failed", r.requests_failed},   {"cut", r.requests_cut},
                   {"short", r.requests_short},     {"stopped_early", r.stopped_early}};
  j["output_tokens"] = r.output_tokens;
  j["input_tokens"] = r.input_tokens;
  j["output_tokens_per_s"] = r.output_tokens_per_s;
  j["requests_per_s"] = r.requests_per_s;
  j["ttft_ms"] = SummaryJson(r.ttft_ms);
  j["itl_ms"] = SummaryJson(r.itl_ms);
  j["tpot_ms"] = SummaryJson(r.tpot_ms);
  j["e2e_ms"] = SummaryJson(r.e2e_ms);
  j["errors"] = {{"by_code", r.errors_by_code}, {"samples", r.error_samples}};
  j["stats_available"] = r.stats_available;
  if (!r.stats_error.empty()) j["stats_error"] = r.stats_error;
  nlohmann::json stages = nlohmann::json::array();
  for (const StageFigures& s : r.stages) {
    stages.push_back({{"index", s.index},
                      {"endpoint", s.endpoint},
                      {"first_layer", s.first_layer},
                      {"last_layer", s.last_layer},
                      {"busy_fraction_mean", s.busy_fraction_mean},
                      {"busy_fraction_min", s.busy_fraction_min},
                      {"busy_fraction_max", s.busy_fraction_max},
                      {"busy_fraction_end", s.busy_fraction_end},
                      {"busy_fraction_run", s.busy_fraction_run},
                      {"busy_samples", s.samples},
                      {"steps", s.steps},
                      {"bytes_sent", s.bytes_sent},
                      {"mean_step_ms_end", s.mean_step_ms_end}});
  }
  j["stages"] = std::move(stages);
  const ServerFigures& sv = r.server;
  j["server"] = {{"requests_finished", sv.requests_finished},
                 {"requests_failed", sv.requests_failed},
                 {"requests_cancelled", sv.requests_cancelled},
                 {"generated_tokens", sv.generated_tokens},
                 {"prompt_tokens", sv.prompt_tokens},
                 {"prefix_lookup_tokens", sv.prefix_lookup_tokens},
                 {"prefix_hit_tokens", sv.prefix_hit_tokens},
                 {"mean_ttft_ms_end", sv.mean_ttft_ms_end},
                 {"mean_inter_token_ms_end", sv.mean_inter_token_ms_end}};
  nlohmann::json records = nlohmann::json::array();
  for (const RequestRecord& q : r.records) {
    nlohmann::json one = {{"index", q.index},
                          {"prompt_tokens", q.prompt_tokens},
                          {"completion_tokens", q.completion_tokens},
                          {"usage_completion_tokens", q.usage_completion_tokens},
                          {"ttft_ms", q.ttft_ms},
                          {"e2e_ms", q.e2e_ms},
                          {"finish_reason", q.finish_reason},
                          {"status", q.status}};
    if (!q.error.empty()) one["error"] = q.error;
    records.push_back(std::move(one));
  }
  j["request_records"] = std::move(records);
  return j;
}

std::string FormatReport(const LoadgenReport& r) {
  const LoadgenOptions& o = r.options;
  std::string out;
  out += fmt::format("ringserve load generator: {} ({} {}, {} layers, {} stage(s))\n", o.target,
                     r.model_id, r.architecture, r.num_layers, r.num_stages);
  out += fmt::format("  {} stream(s), prompt {} tokens, output {} tokens{}, {}\n", o.streams,
                     r.prompt_tokens, o.max_tokens, o.ignore_eos ? " (ignore EOS)" : "",
                     o.requests > 0 ? fmt::format("{} requests", o.requests)
                                    : fmt::format("{:.1f} s", o.duration_s));
  out +=
      fmt::format("  requests: {} started, {} completed, {} failed, {} cut at the end, {} short\n",
                  r.requests_started, r.requests_completed, r.requests_failed, r.requests_cut,
                  r.requests_short);
  out += fmt::format("  wall {:.3f} s   output {:.1f} tok/s   {:.2f} req/s   {} output tokens\n",
                     r.wall_s, r.output_tokens_per_s, r.requests_per_s, r.output_tokens);
  out += fmt::format("  {:<22} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8}\n", "latency (ms)", "mean",
                     "p50", "p99", "min", "max", "count");
  out += SummaryRow("time to first token", r.ttft_ms);
  out += SummaryRow("inter-token", r.itl_ms);
  out += SummaryRow("time per output token", r.tpot_ms);
  out += SummaryRow("end to end", r.e2e_ms);
  if (r.stats_available) {
    out += fmt::format("  {:<6} {:<22} {:>8} {:>9} {:>9} {:>8} {:>8} {:>8} {:>10} {:>12}\n",
                       "stage", "endpoint", "layers", "busy run", "busy mean", "min", "max", "end",
                       "steps", "bytes sent");
    for (const StageFigures& s : r.stages) {
      out += fmt::format(
          "  {:<6} {:<22} {:>8} {:>9.3f} {:>9.3f} {:>8.3f} {:>8.3f} {:>8.3f} {:>10} {:>12}\n",
          s.index, s.endpoint, fmt::format("{}-{}", s.first_layer, s.last_layer),
          s.busy_fraction_run, s.busy_fraction_mean, s.busy_fraction_min, s.busy_fraction_max,
          s.busy_fraction_end, s.steps, s.bytes_sent);
    }
    out += fmt::format("  server: {} finished, {} failed, {} cancelled, {} tokens generated\n",
                       r.server.requests_finished, r.server.requests_failed,
                       r.server.requests_cancelled, r.server.generated_tokens);
    if (!r.stats_error.empty()) out += fmt::format("  note: {}\n", r.stats_error);
  } else {
    out += fmt::format("  stage statistics unavailable: {}\n", r.stats_error);
  }
  if (r.stopped_early) {
    out += fmt::format("  stopped early: {} failed requests (--max_errors)\n", r.requests_failed);
  }
  for (const auto& [code, count] : r.errors_by_code) {
    out += fmt::format("  errors {}: {}\n", code, count);
  }
  for (const std::string& sample : r.error_samples) out += fmt::format("    {}\n", sample);
  return out;
}

}  // namespace ringserve::loadgen
