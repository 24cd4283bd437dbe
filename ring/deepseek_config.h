// The DeepSeek-V2/V3 part of config.json (multi-head latent attention, YaRN) and the YaRN rope
// formulas, as transformers 5 computes them. Called by ParseModelConfig for
// DeepseekV2ForCausalLM / DeepseekV3ForCausalLM; the generic fields are parsed there first.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"
#include "ring/model_config.h"

namespace ringserve {

// Fills config.mla, num_kv_heads (== num_heads) and head_dim (== qk_rope_head_dim) from `j`;
// config.rope must be parsed already. InvalidArgument naming the key (and `source`) for missing
// or invalid fields and for what the backends do not implement: moe_layer_freq != 1, rope types
// other than default and yarn, num_key_value_heads or head_dim that contradict MLA. The MoE
// layers (from first_k_dense_replace on) are parsed by ParseMoeConfig (moe_config_parse.h).
absl::Status ParseDeepseekConfig(const nlohmann::json& j, const std::string& source,
                                 ModelConfig& config);

// yarn_get_mscale: 1 for scale <= 1, else 0.1 * mscale * ln(scale) + 1.
double YarnGetMscale(double scale, double mscale);
// The factor transformers applies to cos/sin with YaRN: attention_factor if given, else
// mscale(factor, mscale) / mscale(factor, mscale_all_dim) when both are non-zero, else
// mscale(factor, 1).
double YarnAttentionFactor(const RopeConfig& rope);
// YaRN inverse frequencies [dim / 2]: extrapolated (plain) frequencies for fast-rotating pairs,
// interpolated (divided by factor) for slow ones, a linear ramp between the correction range of
// beta_fast and beta_slow rotations over original_max_position_embeddings.
std::vector<float> YarnInverseFrequencies(const RopeConfig& rope, int dim);

}  // namespace ringserve
