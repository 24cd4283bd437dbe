// `ringserve_perplexity`: the perplexity of a text file through a running ring.
//
//   ringserve_perplexity --server HOST:PORT --file TEXT [--window N] [--concurrency N]
//       [--max-documents N] [--json PATH] [--timeout-s S]
//
// Scores as bench/perplexity/perplexity.h says (documents at blank lines, BOS, windows of
// --window tokens, default 512), the same windows scripts/train_small_model.py scores with
// transformers. Prints one summary line; --json writes every window's score. Exit code 0 on
// success, 1 when scoring failed, 2 for bad flags.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/numbers.h"
#include "bench/perplexity/perplexity.h"
#include "fmt/format.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"

namespace {

constexpr char kUsage[] =
    "usage: ringserve_perplexity --server HOST:PORT --file TEXT [--window N]\n"
    "         [--concurrency N] [--max-documents N] [--json PATH] [--timeout-s S]\n";

int Usage(const std::string& message) {
  std::fprintf(stderr, "ringserve_perplexity: %s\n%s", message.c_str(), kUsage);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  namespace ppl = ringserve::perplexity;
  ppl::Options options;
  std::string server = "127.0.0.1:50051";
  std::string file;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (i + 1 >= argc) return Usage(fmt::format("{} needs a value", arg));
    const std::string value = argv[++i];
    auto integer = [&](int* out, int min) { return absl::SimpleAtoi(value, out) && *out >= min; };
    if (arg == "--server") {
      server = value;
    } else if (arg == "--file") {
      file = value;
    } else if (arg == "--json") {
      json_path = value;
    } else if (arg == "--window") {
      if (!integer(&options.window_tokens, 2)) return Usage("--window: an integer >= 2");
    } else if (arg == "--concurrency") {
      if (!integer(&options.concurrency, 1)) return Usage("--concurrency: an integer >= 1");
    } else if (arg == "--max-documents") {
      if (!integer(&options.max_documents, 0)) return Usage("--max-documents: an integer >= 0");
    } else if (arg == "--timeout-s") {
      if (!integer(&options.request_timeout_s, 1)) return Usage("--timeout-s: an integer >= 1");
    } else {
      return Usage(fmt::format("unknown flag {}", arg));
    }
  }
  if (file.empty()) return Usage("--file is required");
  std::ifstream in(file, std::ios::binary);
  if (!in) return Usage(fmt::format("cannot read {}", file));
  std::stringstream text;
  text << in.rdbuf();

  auto channel = grpc::CreateChannel(server, grpc::InsecureChannelCredentials());
  auto stub = ringserve::v1::Generate::NewStub(channel);
  absl::StatusOr<ppl::Report> report = ppl::Measure(*stub, text.str(), options);
  if (!report.ok()) {
    std::fprintf(stderr, "ringserve_perplexity: %s\n", report.status().ToString().c_str());
    return 1;
  }
  std::printf(
      "perplexity %.4f over %lld tokens (%d documents, %zu windows of <= %d tokens); %.1f s, "
      "%.0f tokens/s\n",
      report->perplexity, static_cast<long long>(report->tokens), report->documents,
      report->windows.size(), options.window_tokens, report->seconds,
      report->tokens / std::max(report->seconds, 1e-9));
  if (!json_path.empty()) {
    nlohmann::json j = {{"perplexity", report->perplexity},
                        {"tokens", report->tokens},
                        {"nll", report->nll},
                        {"documents", report->documents},
                        {"window", options.window_tokens},
                        {"seconds", report->seconds},
                        {"server", server},
                        {"file", file}};
    nlohmann::json windows = nlohmann::json::array();
    for (const ppl::WindowScore& w : report->windows) {
      windows.push_back(
          {{"doc", w.document}, {"start", w.start}, {"scored", w.scored}, {"nll", w.nll}});
    }
    j["windows"] = std::move(windows);
    std::ofstream out(json_path);
    out << j.dump(1) << "\n";
    if (!out) {
      std::fprintf(stderr, "ringserve_perplexity: cannot write %s\n", json_path.c_str());
      return 1;
    }
  }
  return 0;
}
