// Reads a golden model fixture written by scripts/make_fixtures.py:
// tests/fixtures/models/<arch>/{config.json, *.safetensors, golden.json, golden.bin}.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ringserve::golden {

struct GoldenPrompt {
  std::vector<int32_t> token_ids;
  std::vector<float> logits;  // [token_ids.size(), vocab]: transformers' logits, every position
  std::vector<int32_t> greedy_token_ids;  // the greedy continuation
  std::vector<float> greedy_logits;       // [greedy steps, vocab]: logits that chose each token
};

struct GoldenFixture {
  std::string dir;
  std::string architecture;
  std::string transformers_version;
  std::string torch_version;
  int vocab_size = 0;
  std::vector<float> rope_inv_freq;  // transformers' inv_freq buffer
  std::vector<GoldenPrompt> prompts;
};

// The fixture directory of `arch` ("llama", ...) under the source tree (RINGSERVE_SOURCE_DIR or
// the working directory).
std::string FixtureDir(const std::string& arch);
absl::StatusOr<GoldenFixture> LoadGoldenFixture(const std::string& dir);

// Largest |a - b| and largest |b| over two equal-size arrays.
struct Diff {
  float max_abs_diff = 0;
  float max_abs_ref = 0;
};
Diff Compare(std::span<const float> got, std::span<const float> ref);
// The conformance tolerance for fp32: max|diff| <= kRelTol * max|ref| + kAbsTol.
inline constexpr float kRelTol = 1e-4f;
inline constexpr float kAbsTol = 1e-5f;
inline bool WithinTolerance(const Diff& d) {
  return d.max_abs_diff <= kRelTol * d.max_abs_ref + kAbsTol;
}

int32_t ArgMax(std::span<const float> row);

}  // namespace ringserve::golden
