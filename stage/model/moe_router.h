// Mixture-of-experts routing: from a token's router logits to the experts it uses and their
// weights. A pure function over host fp32 arrays, shared by every MoE family (and by the
// DeepSeek-V2/V3 models, whose router GLM-4.5 uses too); each scoring rule (RouterScoring in
// ring/moe_config.h) follows transformers 5.17's module for that family, in fp32.
#pragma once

#include <cstdint>
#include <span>

#include "ring/moe_config.h"

namespace ringserve {

// Routes `num_tokens` tokens.
//   logits:          [num_tokens, num_experts] fp32, the router's linear output (with its bias).
//   correction_bias: [num_experts] (kSigmoidGroupedTopK's e_score_correction_bias) or empty.
//   expert_ids:      [num_tokens, top_k] out: chosen experts, by selection score descending
//                    (ties to the lower index).
//   weights:         [num_tokens, top_k] out: each chosen expert's weight, same order.
// Preconditions (programmer contract): options valid, spans of the stated sizes. Pure; safe to
// call concurrently on disjoint outputs.
void RouteTokens(const RouterOptions& options, std::span<const float> logits,
                 std::span<const float> correction_bias, int64_t num_tokens,
                 std::span<int32_t> expert_ids, std::span<float> weights);

}  // namespace ringserve
