// Mixture-of-experts routing: from a token's router logits to the experts it uses and their
// weights. A pure function over host fp32 arrays, shared by every MoE family (and by the
// DeepSeek-V2/V3 models, whose router GLM-4.5 uses too); each scoring rule follows transformers
// 5.17's module for that family, in fp32.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/status.h"

namespace ringserve {

enum class RouterScoring {
  // Qwen2-MoE, Qwen3-MoE, Mixtral: p = softmax(logits) over all experts; the top_k largest p,
  // optionally renormalized to sum 1 (norm_topk_prob; Mixtral always).
  kSoftmaxTopK,
  // gpt-oss: the top_k largest logits (the router has a bias), then softmax over those k.
  kTopKSoftmax,
  // DeepSeek-V3 / GLM-4.5 (noaux_tc): s = sigmoid(logits); selection on c = s + correction_bias:
  // experts split into n_group equal groups, a group scores the sum of its two largest c, the
  // topk_group best groups stay and the top_k largest c among their experts are chosen. The
  // weights are the chosen experts' s (without the bias), divided by (their sum + 1e-20) when
  // norm_topk_prob, then times routed_scaling_factor.
  kSigmoidGroupedTopK,
};

struct RouterOptions {
  RouterScoring scoring = RouterScoring::kSoftmaxTopK;
  int num_experts = 0;
  int top_k = 0;
  bool norm_topk_prob = false;  // kSoftmaxTopK and kSigmoidGroupedTopK
  // kSigmoidGroupedTopK only. num_experts % n_group == 0, each group >= 2 experts,
  // 1 <= topk_group <= n_group, top_k <= topk_group * (num_experts / n_group).
  int n_group = 1;
  int topk_group = 1;
  float routed_scaling_factor = 1.0f;
};

// InvalidArgument naming the field when `options` break the constraints above (or
// 1 <= top_k <= num_experts).
absl::Status ValidateRouterOptions(const RouterOptions& options);

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
