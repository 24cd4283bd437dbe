#include "coordinator/sampling_extras.h"

#include "fmt/format.h"
#include "ring/sampling_config.h"

namespace ringserve {

absl::Status ValidateSamplingExtras(const SamplingParams& params, int vocab_size) {
  if (params.top_logprobs < 0 || params.top_logprobs > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(
        fmt::format("top_logprobs: {} is not in [0, {}]", params.top_logprobs, kMaxTopLogprobs));
  }
  if (params.top_logprobs > 0 && !params.logprobs) {
    return absl::InvalidArgumentError("top_logprobs: needs logprobs");
  }
  if (params.min_tokens < 0 || params.min_tokens > params.max_tokens) {
    return absl::InvalidArgumentError(fmt::format("min_tokens: {} is not in [0, max_tokens = {}]",
                                                  params.min_tokens, params.max_tokens));
  }
  for (int32_t id : params.stop_token_ids) {
    if (id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(
          fmt::format("stop_token_ids: {} is outside the vocabulary [0, {})", id, vocab_size));
    }
  }
  return absl::OkStatus();
}

std::vector<int32_t> SuppressedTokenIds(const SamplingParams& params,
                                        const std::vector<int32_t>& eos_token_ids,
                                        int token_index) {
  std::vector<int32_t> out;
  if (token_index >= params.min_tokens) return out;
  if (!params.ignore_eos) out = eos_token_ids;
  out.insert(out.end(), params.stop_token_ids.begin(), params.stop_token_ids.end());
  return out;
}

int TopLogprobsToAsk(const SamplingParams& params) {
  return params.logprobs ? params.top_logprobs : 0;
}

TokenLogprobs ToTokenLogprobs(const v1::SampledToken& sampled) {
  TokenLogprobs out{.token_id = sampled.token_id(), .logprob = sampled.logprob()};
  const int n = std::min(sampled.top_token_ids_size(), sampled.top_logprobs_size());
  for (int i = 0; i < n; ++i)
    out.top.emplace_back(sampled.top_token_ids(i), sampled.top_logprobs(i));
  return out;
}

}  // namespace ringserve
