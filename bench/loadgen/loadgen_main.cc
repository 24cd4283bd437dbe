// `ringserve_loadgen`: a load generator for any running coordinator (gRPC Generate API).
//
//   ringserve_loadgen --target HOST:PORT [--streams N] [--prompt-tokens N | --prompt-text T]
//       [--max-tokens N] (--requests N | --duration-s S) [--seed S] [--json PATH] ...
//
// Prints a table (stdout) and writes the JSON report (--json) for plots. Exit code: 0 when the
// run happened (request failures are in the report; with --fail-on-error they give 3), 1 when
// it could not start (no server, bad model limits), 2 for bad flags.
#include <cstdio>
#include <fstream>
#include <string>

#include "absl/strings/numbers.h"
#include "bench/loadgen/loadgen.h"
#include "fmt/format.h"

namespace {

constexpr char kUsage[] =
    "usage: ringserve_loadgen --target HOST:PORT (--requests N | --duration-s S)\n"
    "         [--streams N] [--prompt-tokens N | --prompt-text TEXT] [--max-tokens N]\n"
    "         [--no-ignore-eos] [--temperature T] [--seed S] [--json PATH]\n"
    "         [--connect-timeout-s S] [--request-timeout-s S] [--stats-interval-s S]\n"
    "         [--max-errors N] [--fail-on-error] [--quiet]\n";

int Usage(const std::string& message) {
  std::fprintf(stderr, "ringserve_loadgen: %s\n%s", message.c_str(), kUsage);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using ringserve::loadgen::LoadgenOptions;
  LoadgenOptions options;
  std::string json_path;
  bool fail_on_error = false;
  bool quiet = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    bool has_value = false;
    if (size_t eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_value = true;
    }
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (arg == "--no-ignore-eos" || arg == "--fail-on-error" || arg == "--quiet") {
      if (has_value) return Usage(fmt::format("{} takes no value", arg));
      if (arg == "--no-ignore-eos") options.ignore_eos = false;
      if (arg == "--fail-on-error") fail_on_error = true;
      if (arg == "--quiet") quiet = true;
      continue;
    }
    if (!has_value) {
      if (i + 1 >= argc) return Usage(fmt::format("{} needs a value", arg));
      value = argv[++i];
    }
    double number = 0;
    const bool numeric = absl::SimpleAtod(value, &number);
    if (arg == "--target") {
      options.target = value;
    } else if (arg == "--prompt-text") {
      options.prompt_text = value;
    } else if (arg == "--json") {
      json_path = value;
    } else if (!numeric) {
      return Usage(fmt::format("{}: '{}' is not a number (or unknown flag)", arg, value));
    } else if (arg == "--streams") {
      options.streams = static_cast<int>(number);
    } else if (arg == "--prompt-tokens") {
      options.prompt_tokens = static_cast<int>(number);
    } else if (arg == "--max-tokens") {
      options.max_tokens = static_cast<int>(number);
    } else if (arg == "--temperature") {
      options.temperature = static_cast<float>(number);
    } else if (arg == "--requests") {
      options.requests = static_cast<int>(number);
    } else if (arg == "--duration-s") {
      options.duration_s = number;
    } else if (arg == "--seed") {
      uint64_t seed = 0;
      if (!absl::SimpleAtoi(value, &seed)) return Usage("--seed: expected a non-negative integer");
      options.seed = seed;
    } else if (arg == "--connect-timeout-s") {
      options.connect_timeout_s = number;
    } else if (arg == "--request-timeout-s") {
      options.request_timeout_s = number;
    } else if (arg == "--max-errors") {
      options.max_errors = static_cast<int64_t>(number);
    } else if (arg == "--stats-interval-s") {
      options.stats_interval_s = number;
    } else {
      return Usage(fmt::format("unknown flag '{}'", arg));
    }
  }
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
