// Per-request sampling parameters: set by the coordinator, validated on the API front ends,
// carried in every plan to the last stage, applied by its sampler (stage/sampling/sampler.h).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace ringserve {

struct SamplingConfig {
  float temperature = 0.0f;  // 0 = greedy; must be >= 0 and finite
  int top_k = 0;             // 0 = off; must be >= 0
  float top_p = 1.0f;        // 1 = off; must be in (0, 1]
  uint64_t seed = 0;         // the engine picks one per request when the client gave none
};

// InvalidArgument naming the parameter for temperature < 0 (or not finite), top_k < 0,
// top_p <= 0 or > 1 (or NaN).
absl::Status ValidateSamplingConfig(const SamplingConfig& config);

// The most top log-probabilities one row may ask for (OpenAI's limit).
inline constexpr int kMaxTopLogprobs = 20;

// One row's sampling request.
struct RowSampling {
  SamplingConfig config;
  uint64_t token_index = 0;  // index of the token being generated within its request
  // Report this many most likely (token, logprob) pairs of the raw row (last stage, on the
  // host: stage/sampling/row_extras.h).
  int top_logprobs = 0;
  // Never sampled (min_tokens: EOS and stop ids); the sampler treats their logits as -inf.
  std::vector<int32_t> suppress_token_ids{};
};

}  // namespace ringserve
