// The mixture-of-experts and attention-variant fields of config.json (Qwen2/3-MoE, Mixtral,
// GLM-4.5, gpt-oss, DeepSeek-V2/V3): experts, router, dense/MoE layer pattern, shared experts,
// gpt-oss's sinks (sliding layers of every family: sliding_window_parse.h). Called by
// ParseModelConfig once the dense fields (and DeepSeek's MLA fields) are parsed.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"
#include "ring/model_config.h"

namespace ringserve {

// Fills config.moe (and, for gpt-oss, attention_sinks) from
// `j` for config.architecture; leaves dense architectures unchanged. DeepSeek-V3 routes as
// ParseDeepSeekMoe says; DeepSeek-V2 with softmax scores (scoring_func softmax), topk_method
// greedy or group_limited_greedy (n_group, topk_group; a group scores its best expert), weights
// times routed_scaling_factor (norm_topk_prob is not read, as transformers' DeepseekV2Moe does
// not), n_shared_experts (default 2);
// for both, layers from first_k_dense_replace on are MoE. Experts of a quantization_config
// dequantize by the dense formats' rules (ParseModelConfig checks its quant_method first: gpt-oss
// takes only mxfp4, the others never). InvalidArgument naming the key.
absl::Status ParseMoeConfig(const nlohmann::json& j, ModelConfig& config,
                            const std::string& source);

// The DeepSeek-V3 MoE fields, as GLM-4.5 (and DeepSeek-V3) spell them: n_routed_experts,
// num_experts_per_tok, moe_intermediate_size, n_shared_experts, n_group, topk_group,
// routed_scaling_factor, norm_topk_prob (default true), first_k_dense_replace (default 1; those
// first layers are dense), scoring_func (only sigmoid) and topk_method (only noaux_tc). Sets
// the grouped sigmoid router with e_score_correction_bias and per-expert layout.
absl::Status ParseDeepSeekMoe(const nlohmann::json& j, ModelConfig& config,
                              const std::string& source);

}  // namespace ringserve
