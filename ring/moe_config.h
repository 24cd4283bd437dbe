// The mixture-of-experts part of a model's config: the router's scoring rule and options, how a
// checkpoint stores the experts, the expert activation, shared experts and which layers are MoE.
// Plain values parsed once from config.json (ring/moe_config_parse.cc) and read by both
// processes; the routing itself is stage/model/moe_router.h.
#pragma once

#include <vector>

#include "absl/status/status.h"

namespace ringserve {

enum class RouterScoring {
  // Qwen2-MoE, Qwen3-MoE, Mixtral, DeepSeek-V2: p = softmax(logits) over all experts; the top_k
  // largest p, optionally renormalized to sum 1 (norm_topk_prob; Mixtral always), then times
  // routed_scaling_factor (DeepSeek-V2; 1 elsewhere). With topk_group < n_group (DeepSeek-V2's
  // topk_method group_limited_greedy) experts split into n_group equal groups, a group scores
  // its largest p, and only the experts of the topk_group best groups can be chosen.
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
  // kSoftmaxTopK and kSigmoidGroupedTopK. num_experts % n_group == 0 (kSigmoidGroupedTopK: each
  // group >= 2 experts), 1 <= topk_group <= n_group, top_k <= topk_group * (num_experts /
  // n_group).
  int n_group = 1;
  int topk_group = 1;
  float routed_scaling_factor = 1.0f;  // kSoftmaxTopK and kSigmoidGroupedTopK
};

// The most experts a MoE layer may have (real checkpoints have at most a few hundred): the
// loaders list every expert's tensors before reading the router, so a config that claims 2^30
// experts must be refused before it costs memory.
inline constexpr int kMaxExperts = 1 << 16;

// InvalidArgument naming the field when `options` break the constraints above (or
// 1 <= top_k <= num_experts <= kMaxExperts).
absl::Status ValidateRouterOptions(const RouterOptions& options);

// How a checkpoint stores a MoE layer's experts (all [out_features, in_features] unless noted).
enum class ExpertLayout {
  // mlp.experts.E.{gate,up,down}_proj.weight (Qwen2/3-MoE, GLM-4.5).
  kPerExpert,
  // block_sparse_moe.experts.E.{w1,w3,w2}.weight (gate, up, down) and block_sparse_moe.gate.
  kMixtral,
  // gpt-oss: mlp.experts.gate_up_proj [E, hidden, 2 * inter] (input-major; gate and up columns
  // interleaved: gate = [..., 0::2], up = [..., 1::2]) + gate_up_proj_bias [E, 2 * inter];
  // mlp.experts.down_proj [E, inter, hidden] + down_proj_bias [E, hidden].
  kGptOssStacked,
};

enum class ExpertActivation {
  kSiluMul,  // down(silu(gate(x)) * up(x))
  // gpt-oss: g = min(gate(x), limit), u = clamp(up(x), -limit, limit),
  // down((u + 1) * g * sigmoid(alpha * g)); every projection with its bias.
  kClampedSwiglu,
};

// The mixture-of-experts part of a config. router.num_experts == 0 for a dense model.
struct MoeConfig {
  RouterOptions router;
  std::vector<bool> layers;  // [num_layers]: true where the layer's MLP is a MoE block
  int expert_intermediate_size = 0;
  ExpertLayout layout = ExpertLayout::kPerExpert;
  ExpertActivation activation = ExpertActivation::kSiluMul;
  float swiglu_alpha = 1.702f;
  float swiglu_limit = 7.0f;
  bool router_bias = false;      // gpt-oss: the router linear has a bias
  bool correction_bias = false;  // DeepSeek-V3 / GLM-4.5: mlp.gate.e_score_correction_bias
  // Shared experts, run on every token and added to the routed output; 0: none.
  int shared_intermediate_size = 0;
  // Qwen2-MoE: the shared expert's output is scaled by sigmoid(shared_expert_gate . x).
  bool shared_expert_gate = false;

  bool enabled() const { return router.num_experts > 0; }
  bool IsMoeLayer(int layer) const {
    return layer >= 0 && layer < static_cast<int>(layers.size()) && layers[layer];
  }
};

}  // namespace ringserve
