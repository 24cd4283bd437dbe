// The load generator: drives a running coordinator through the client gRPC API
// (ringserve.v1.Generate, proto/generate.proto) with N concurrent streaming Generate calls and
// measures what a client sees (output tokens/s, requests/s, time to first token, inter-token
// latency) next to the ring's own statistics (per-stage busy fraction, from the Stats RPC).
//
// Everything is bounded: the connection wait, every RPC (deadline), the run (a request count or
// a duration; in duration mode the calls still running at the end are cancelled and counted as
// cut, not as errors). Server errors are counted and reported, never fatal to the run; after
// `max_errors` failures no new requests start (a dead server ends the run quickly).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/loadgen/latency_summary.h"
#include "nlohmann/json.hpp"

namespace ringserve::loadgen {

struct LoadgenOptions {
  std::string target = "127.0.0.1:50051";  // HOST:PORT of the coordinator's gRPC API
  int streams = 1;                         // concurrent Generate calls
  int prompt_tokens = 32;                  // random token ids (uniform in the vocab, no EOS)
  // Random ids every request's prompt starts with (a shared system prompt) before its own
  // prompt_tokens; they derive from prefix_seed alone, so runs with the same prefix_seed share
  // them (a cache warmed by an earlier run).
  int shared_prefix_tokens = 0;
  uint64_t prefix_seed = 0;
  std::string prompt_text;         // instead of random ids, when not empty
  int max_tokens = 32;             // output length per request
  bool ignore_eos = true;          // fixed output lengths
  float temperature = 0.0f;        // 0 = greedy
  int requests = 0;                // total requests; 0 = run for `duration_s`
  double duration_s = 0;           // used when `requests` is 0
  uint64_t seed = 0;               // prompts (and sampling seeds) derive from it
  double connect_timeout_s = 10;   // waiting for the channel and Health
  double request_timeout_s = 120;  // deadline of one Generate call
  double stats_interval_s = 0.25;  // Stats sampling period during the run
  int64_t max_errors = 100;        // stop starting requests after this many failed ones
};

// One Generate call as the client saw it. Times in milliseconds from the call's start.
struct RequestRecord {
  int64_t index = 0;
  int prompt_tokens = 0;             // as the server's usage says (ours for random ids if absent)
  int completion_tokens = 0;         // tokens received
  int usage_completion_tokens = -1;  // the final message's usage; -1 if none came
  double ttft_ms = 0;                // 0 when no token came
  double e2e_ms = 0;
  std::string finish_reason;  // "stop", "length", "cancelled", "error", "none"
  std::string status;         // "ok", "cut" (duration ended), or the gRPC status code name
  std::string error;          // message for failures
};

// One stage's figures over the run, from Stats snapshots.
struct StageFigures {
  int index = 0;
  std::string endpoint;
  int first_layer = 0;
  int last_layer = 0;
  // The server reports busy time / wall time over a trailing window (a few seconds); we sample
  // it every `stats_interval_s` during the run.
  double busy_fraction_mean = 0;  // over the samples taken during the run
  double busy_fraction_min = 0;
  double busy_fraction_max = 0;
  double busy_fraction_end = 0;  // the snapshot at the end of the run
  // Over exactly the run: micro-batches finished during the run x the server's recent mean step
  // time / wall time (an estimate until the server reports cumulative busy time). The best
  // figure for runs shorter than the server's window, where the samples include idle time.
  double busy_fraction_run = 0;
  int samples = 0;
  int64_t steps = 0;       // micro-batches finished during the run (end - start)
  int64_t bytes_sent = 0;  // activation bytes sent during the run (end - start)
  double mean_step_ms_end = 0;
};

struct ServerFigures {  // deltas of the coordinator's counters over the run
  int64_t requests_finished = 0;
  int64_t requests_failed = 0;
  int64_t requests_cancelled = 0;
  int64_t generated_tokens = 0;
  int64_t prompt_tokens = 0;
  int64_t prefix_lookup_tokens = 0;    // prompt tokens looked up in the prefix cache
  int64_t prefix_hit_tokens = 0;       // of those, found there (prefill skipped)
  double mean_ttft_ms_end = 0;         // the server's running means at the end
  double mean_inter_token_ms_end = 0;  //
};

struct LoadgenReport {
  LoadgenOptions options;
  // ModelInfo.
  std::string model_id;
  std::string architecture;
  int num_layers = 0;
  int vocab_size = 0;
  int num_stages = 0;
  int prompt_tokens = 0;  // the prompt length actually sent

  double wall_s = 0;  // first call start to last call end (duration mode: the duration)
  int64_t requests_started = 0;
  int64_t requests_completed = 0;  // finished OK (stop or length)
  int64_t requests_failed = 0;     // gRPC error or finish_reason error
  int64_t requests_cut = 0;        // still running when the duration ended
  int64_t requests_short = 0;      // completed with fewer than max_tokens tokens
  bool stopped_early = false;      // max_errors failures reached
  int64_t output_tokens = 0;       // every token received, cut requests included
  int64_t input_tokens = 0;        // prompt tokens of completed requests
  double output_tokens_per_s = 0;
  double requests_per_s = 0;
  Summary ttft_ms;
  Summary itl_ms;  // gaps between tokens; a message carrying k tokens counts k gaps of gap/k
  Summary e2e_ms;
  Summary tpot_ms;  // per request (last token - first token) / (tokens - 1)
  std::map<std::string, int64_t> errors_by_code;
  std::vector<std::string> error_samples;  // the first few error messages

  bool stats_available = false;
  std::string stats_error;  // why not, when the Stats RPC failed
  std::vector<StageFigures> stages;
  ServerFigures server;

  std::vector<RequestRecord> records;  // ordered by index
};

// Connects (bounded), reads ModelInfo, runs the load, samples Stats. Errors only for what stops
// a run from starting: no connection, server not serving, bad options, prompt + output longer
// than the model's context. Failures of individual calls land in the report.
absl::StatusOr<LoadgenReport> RunLoad(const LoadgenOptions& options);

// Checks the options' ranges (positive streams, lengths, a request count or a duration ...).
absl::Status ValidateOptions(const LoadgenOptions& options);

// The report as JSON (for plots); field names are stable, times in ms, rates per second.
nlohmann::json ReportToJson(const LoadgenReport& report);

// A human-readable table of the report.
std::string FormatReport(const LoadgenReport& report);

}  // namespace ringserve::loadgen
