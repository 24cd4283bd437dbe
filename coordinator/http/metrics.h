// Serving metrics and their Prometheus text exposition (format 0.0.4), written by hand: the
// format is small, and Debian packages no C++ Prometheus client.
//
// Two sources: ServingMetrics, which the client APIs record into as requests come and go
// (latency histograms, outcomes; thread-safe), and the engine's RingStats snapshot (tokens,
// queue, and per-stage figures: busy fraction, step time, KV blocks, micro-batches in flight,
// activation bytes per hop), rendered at scrape time.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "coordinator/engine.h"

namespace ringserve::http {

// A cumulative histogram with fixed upper bounds. Thread-safe.
class Histogram {
 public:
  // `bounds`: strictly increasing upper bounds; +Inf is implied.
  explicit Histogram(std::vector<double> bounds);

  void Observe(double value);

  struct Snapshot {
    std::vector<double> bounds;
    std::vector<uint64_t> cumulative_counts;  // per bound, then +Inf (size bounds + 1)
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot Read() const;

 private:
  const std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative), size bounds + 1
  double sum_ = 0;
};

// How a client request ended, for ringserve_requests_total{outcome=...}.
enum class RequestOutcome {
  kStop,       // finished: EOS or a stop string
  kLength,     // finished: max_tokens or the context limit
  kCancelled,  // the client went away
  kError,      // the engine failed it
  kRejected,   // refused before it reached the engine (bad request, auth, overload)
};
std::string_view RequestOutcomeName(RequestOutcome outcome);

// What the APIs record. Thread-safe; one instance per coordinator, shared by the HTTP API and
// the gRPC service (outcomes are labelled by api: "http", "grpc").
class ServingMetrics {
 public:
  ServingMetrics();

  void RecordOutcome(std::string_view api, RequestOutcome outcome);
  // Seconds from request arrival to its first generated token.
  void ObserveTimeToFirstToken(double seconds);
  // Seconds between consecutive generated tokens of one request.
  void ObserveInterTokenLatency(double seconds);
  // Seconds from arrival to the last token (requests that finished normally).
  void ObserveRequestDuration(double seconds);
  // One HTTP response, by route and status code.
  void RecordHttpResponse(std::string_view route, int status);
  // Requests being served by the APIs right now (streams open, waits in progress).
  void AddInFlight(int delta);

  const Histogram& time_to_first_token() const { return ttft_; }
  const Histogram& inter_token_latency() const { return itl_; }
  const Histogram& request_duration() const { return e2e_; }
  // Snapshots of the counters, keyed by label values.
  std::map<std::pair<std::string, std::string>, uint64_t> Outcomes() const;
  std::map<std::pair<std::string, int>, uint64_t> HttpResponses() const;
  int64_t in_flight() const;

 private:
  Histogram ttft_;
  Histogram itl_;
  Histogram e2e_;
  mutable std::mutex mu_;
  std::map<std::pair<std::string, std::string>, uint64_t> outcomes_;  // (api, outcome)
  std::map<std::pair<std::string, int>, uint64_t> http_responses_;    // (route, code)
  int64_t in_flight_ = 0;
};

// Records one request's latency figures and outcome into a ServingMetrics as its engine events
// arrive (time to first token, inter-token gaps, duration, outcome under `api`). Arrival is the
// construction time. Not thread-safe: the caller serializes one request's events (as the
// engine's callback does). A null `metrics` records nothing.
class RequestRecorder {
 public:
  using Clock = std::chrono::steady_clock;
  RequestRecorder(ServingMetrics* metrics, std::string api);
  void OnEvent(const GenerateEvent& event);
  Clock::time_point arrival() const { return arrival_; }

 private:
  ServingMetrics* const metrics_;
  const std::string api_;
  const Clock::time_point arrival_;
  bool seen_token_ = false;
  Clock::time_point last_token_;
};

// The whole /metrics body. `model` labels the model-info gauge.
std::string RenderPrometheus(const ServingMetrics& metrics, const RingStats& stats,
                             const ModelInfo& model);

// Escapes a label value (backslash, double quote, newline) for the exposition format.
std::string EscapeLabelValue(std::string_view value);
// Formats a sample value as Prometheus expects: shortest round-trip decimal, NaN, +Inf, -Inf.
std::string FormatSampleValue(double value);

}  // namespace ringserve::http
