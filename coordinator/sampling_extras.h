// The per-request sampling options beyond SamplingConfig (min_tokens, logprobs, top_logprobs)
// as the engine checks them and turns them into what the last stage runs (suppressed ids,
// top-N), and the last stage's answer back into engine events. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "coordinator/engine.h"
#include "proto/stage.pb.h"

namespace ringserve {

// InvalidArgument naming the field: top_logprobs outside [0, kMaxTopLogprobs] (or set without
// logprobs), min_tokens < 0 or > max_tokens, a stop token id outside [0, vocab_size).
absl::Status ValidateSamplingExtras(const SamplingParams& params, int vocab_size);

// The ids the last stage must not sample for the token at `token_index`: while token_index <
// min_tokens, the model's EOS ids (unless ignore_eos) and stop_token_ids; else none.
std::vector<int32_t> SuppressedTokenIds(const SamplingParams& params,
                                        const std::vector<int32_t>& eos_token_ids, int token_index);

// Top-N the last stage reports per sampled token: top_logprobs when logprobs is on, else 0.
int TopLogprobsToAsk(const SamplingParams& params);

// The engine's form of one sampled token's log-probabilities.
TokenLogprobs ToTokenLogprobs(const v1::SampledToken& sampled);

}  // namespace ringserve
