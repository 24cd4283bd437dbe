// What a sampling row may ask for beyond its token (OpenAI's logprobs / top_logprobs and
// min_tokens), on fp32 logits on the host. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace ringserve {

struct TopLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

// The `n` most likely tokens of a raw logits row (no temperature, top-k or top-p: what
// OpenAI and vLLM report), most likely first, ties -> lower id first, with log_softmax of the
// row computed in double (the same value TokenLogprob gives). NaN counts as -inf. At most
// logits.size() entries; none for n <= 0.
std::vector<TopLogprob> TopLogprobs(std::span<const float> logits, int n);

// A copy of `logits` with every id of `suppress` (ids out of range are ignored) set to -inf:
// what the sampler samples from while min_tokens holds back EOS and stop ids.
std::vector<float> SuppressTokens(std::span<const float> logits, std::span<const int32_t> suppress);

}  // namespace ringserve
