// What the last stage reports for one step from its slice's logits: one sampled token per
// sampling chunk and, for ALL_TOKENS chunks, the log-probability of each scored prompt token.
// Pure function; thread-safe.
#pragma once

#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/stage.pb.h"
#include "ring/plan_codec.h"

namespace ringserve {

struct LastStageOutputs {
  std::vector<v1::SampledToken> tokens;             // one per sampling chunk, in chunk order
  std::vector<v1::PromptLogprobs> prompt_logprobs;  // one per ALL_TOKENS chunk, in chunk order
};

// `logits`: [rows, vocab_size] fp32, host, rows in chunk order as each chunk's LogitsMode asks
// (kNone: none, kLastToken: one, kAllTokens: num_tokens). A sampling chunk samples from its
// last row; an ALL_TOKENS chunk's row i is scored against plan.outputs[chunk].score_token_ids[i]
// (log softmax of the raw row). A sampled token carries the row's top_logprobs most likely
// (token, logprob) pairs of the raw row (row_extras.h); suppressed ids are never sampled.
// InternalError when the rows do not match the plan;
// InvalidArgument for a bad sampling configuration.
absl::StatusOr<LastStageOutputs> SampleAndScore(std::span<const float> logits, int vocab_size,
                                                const DecodedPlan& plan);

// Whether the step needs its logits rows on the host (SampleAndScore) rather than the slice's
// own sampler: an ALL_TOKENS chunk, a row asking for top log-probabilities or suppressing
// tokens (min_tokens). Other steps keep the slice's fast path (a GPU stage: its graph and GPU
// sampler).
bool NeedsHostLogits(const DecodedPlan& plan);

// Whether any chunk of `batch` asks for every token's logits (prompt log-probabilities).
bool HasAllTokensChunk(const MicroBatch& batch);

}  // namespace ringserve
