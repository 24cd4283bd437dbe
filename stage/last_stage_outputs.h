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
// (log softmax of the raw row). InternalError when the rows do not match the plan;
// InvalidArgument for a bad sampling configuration.
absl::StatusOr<LastStageOutputs> SampleAndScore(std::span<const float> logits, int vocab_size,
                                                const DecodedPlan& plan);

// Whether any chunk of `batch` asks for every token's logits (prompt log-probabilities).
bool HasAllTokensChunk(const MicroBatch& batch);

}  // namespace ringserve
