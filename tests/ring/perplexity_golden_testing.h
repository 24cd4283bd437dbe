// tests/fixtures/trained/perplexity_golden.json (transformers' scores of held-out documents under
// models/ringserve-tiny, window by window) for the ring tests that measure perplexity through a
// ring. Test code only, header-only: callers link rs_perplexity and nlohmann_json.
#pragma once

#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>

#include "absl/status/statusor.h"
#include "bench/perplexity/perplexity.h"
#include "nlohmann/json.hpp"
#include "tests/ring/ring_harness.h"

namespace ringserve::testing {

struct PerplexityGolden {
  nlohmann::json json;  // the file as parsed; is_discarded() when missing or malformed
  double nll = 0;       // transformers' negative log-likelihood, summed over the windows
  int64_t tokens = 0;   // the tokens it scored, summed over the windows
  double perplexity() const { return std::exp(nll / static_cast<double>(tokens)); }
};

// Reads the golden file (nll and tokens stay 0 when it does not parse).
inline PerplexityGolden LoadPerplexityGolden() {
  PerplexityGolden golden;
  std::ifstream in(SourceDir() + "/tests/fixtures/trained/perplexity_golden.json");
  golden.json = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (golden.json.is_discarded()) return golden;
  for (const auto& w : golden.json["windows"]) {
    golden.nll += w["nll"].get<double>();
    golden.tokens += w["scored"].get<int64_t>();
  }
  return golden;
}

// perplexity::Measure through `stub` of the golden's documents (each followed by a blank line)
// in its window size, two windows at a time: the windows the golden scored.
inline absl::StatusOr<perplexity::Report> MeasureGoldenPerplexity(
    ringserve::v1::Generate::Stub& stub, const nlohmann::json& golden) {
  std::string text;
  for (const auto& d : golden["documents"]) text += d.get<std::string>() + "\n\n";
  return perplexity::Measure(stub, text,
                             {.window_tokens = golden["window"].get<int>(), .concurrency = 2});
}

}  // namespace ringserve::testing
