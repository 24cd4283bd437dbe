// `ringserve_loadgen`: a load generator for any running coordinator (gRPC Generate API).
//
//   ringserve_loadgen --target HOST:PORT [--streams N] [--prompt_tokens N | --prompt_text T]
//       [--max_tokens N] (--requests N | --duration_s S) [--seed S] [--json PATH] ...
//   (--help lists every flag with its default)
//
// Prints a table (stdout) and writes the JSON report (--json) for plots. Exit code: 0 when the
// run happened (request failures are in the report; with --fail_on_error they give 3), 1 when
// it could not start (no server, bad model limits) or a flag is unknown or malformed, 2 for
// flag values out of range.
#include <cstdio>
#include <fstream>
#include <string>

#include "absl/flags/flag.h"
#include "bench/loadgen/loadgen.h"
#include "common/flags.h"
#include "fmt/format.h"

namespace {
const ringserve::loadgen::LoadgenOptions kDefaults;
}  // namespace

ABSL_FLAG(std::string, target, kDefaults.target, "HOST:PORT of the coordinator's gRPC API");
ABSL_FLAG(int, streams, kDefaults.streams, "concurrent Generate calls");
ABSL_FLAG(int, prompt_tokens, kDefaults.prompt_tokens,
          "prompt length in random token ids (uniform in the vocab, no EOS)");
ABSL_FLAG(int, shared_prefix_tokens, 0,
          "random ids every prompt starts with (a shared system prompt), before its own");
ABSL_FLAG(uint64_t, prefix_seed, 0, "the shared prefix derives from it alone");
ABSL_FLAG(std::string, prompt_text, "", "a prompt text instead of random ids");
ABSL_FLAG(int, max_tokens, kDefaults.max_tokens, "output length per request");
ABSL_FLAG(bool, ignore_eos, kDefaults.ignore_eos,
          "generate max_tokens whatever comes (fixed output lengths); --noignore_eos stops at EOS");
ABSL_FLAG(double, temperature, kDefaults.temperature, "sampling temperature (0: greedy)");
ABSL_FLAG(int, requests, kDefaults.requests, "total requests (0: run for --duration_s)");
ABSL_FLAG(double, duration_s, kDefaults.duration_s, "seconds to run when --requests is 0");
ABSL_FLAG(uint64_t, seed, kDefaults.seed, "prompts (and sampling seeds) derive from it");
ABSL_FLAG(double, connect_timeout_s, kDefaults.connect_timeout_s,
          "seconds to wait for the channel and Health");
ABSL_FLAG(double, request_timeout_s, kDefaults.request_timeout_s,
          "deadline of one Generate call, seconds");
ABSL_FLAG(double, stats_interval_s, kDefaults.stats_interval_s, "Stats sampling period, seconds");
ABSL_FLAG(int64_t, max_errors, kDefaults.max_errors,
          "stop starting requests after this many failed ones");
ABSL_FLAG(std::string, json, "", "write the JSON report here");
ABSL_FLAG(bool, fail_on_error, false, "exit 3 when any request failed");
ABSL_FLAG(bool, quiet, false, "no table on stdout");

namespace {

constexpr char kUsage[] =
    "A load generator for a running coordinator (gRPC Generate API).\n"
    "usage: ringserve_loadgen --target=HOST:PORT (--requests=N | --duration_s=S)\n"
    "         [--streams=N] [--prompt_tokens=N | --prompt_text=TEXT] [--max_tokens=N] ...";

int Usage(const std::string& message) {
  std::fprintf(stderr, "ringserve_loadgen: %s (see --help)\n", message.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using ringserve::loadgen::LoadgenOptions;
  ringserve::ParseCommandLineFlags(argc, argv, kUsage);
  LoadgenOptions options;
  options.target = absl::GetFlag(FLAGS_target);
  options.streams = absl::GetFlag(FLAGS_streams);
  options.prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
  options.prompt_text = absl::GetFlag(FLAGS_prompt_text);
  options.shared_prefix_tokens = absl::GetFlag(FLAGS_shared_prefix_tokens);
  options.prefix_seed = absl::GetFlag(FLAGS_prefix_seed);
  options.max_tokens = absl::GetFlag(FLAGS_max_tokens);
  options.ignore_eos = absl::GetFlag(FLAGS_ignore_eos);
  options.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature));
  options.requests = absl::GetFlag(FLAGS_requests);
  options.duration_s = absl::GetFlag(FLAGS_duration_s);
  options.seed = absl::GetFlag(FLAGS_seed);
  options.connect_timeout_s = absl::GetFlag(FLAGS_connect_timeout_s);
  options.request_timeout_s = absl::GetFlag(FLAGS_request_timeout_s);
  options.stats_interval_s = absl::GetFlag(FLAGS_stats_interval_s);
  options.max_errors = absl::GetFlag(FLAGS_max_errors);
  const std::string json_path = absl::GetFlag(FLAGS_json);
  const bool fail_on_error = absl::GetFlag(FLAGS_fail_on_error);
  const bool quiet = absl::GetFlag(FLAGS_quiet);
  if (absl::Status s = ringserve::loadgen::ValidateOptions(options); !s.ok()) {
    return Usage(std::string(s.message()));
  }

  auto report = ringserve::loadgen::RunLoad(options);
  if (!report.ok()) {
    std::fprintf(stderr, "ringserve_loadgen: %s\n", std::string(report.status().message()).c_str());
    return 1;
  }
  if (!quiet) std::fputs(ringserve::loadgen::FormatReport(*report).c_str(), stdout);
  if (!json_path.empty()) {
    std::ofstream out(json_path, std::ios::trunc);
    out << ringserve::loadgen::ReportToJson(*report).dump(2) << "\n";
    out.close();
    if (!out) {
      std::fprintf(stderr, "ringserve_loadgen: cannot write %s\n", json_path.c_str());
      return 1;
    }
  }
  return fail_on_error && report->requests_failed > 0 ? 3 : 0;
}
