// DeepSeek-V3's part of the random-model writer (random_model.h): its shapes, its config.json
// keys (multi-head latent attention, YaRN, the grouped sigmoid MoE router) and the tensors of
// one layer under the hub's names. Pure functions; the writer calls them for shapes with
// mla.enabled().
#pragma once

#include <string>
#include <vector>

#include "bench/model/random_model.h"
#include "nlohmann/json.hpp"

namespace ringserve {

// DeepSeek-V3's published config.json (hidden 7168, 61 layers, 128 heads, q_lora_rank 1536,
// kv_lora_rank 512, rope/nope/v head dims 64/128/128, 3 dense layers of 18432, 256 routed
// experts of 2048 top-8 in 8 groups (4 kept), one shared expert, YaRN factor 40 over 4096), or
// with `tiny` the same layout at hidden 64, 4 layers (1 dense), 4 heads, 8 experts in 4 groups.
ModelShape DeepseekV3Shape(const std::string& name, bool tiny);

// Adds the DeepSeek keys (MLA, YaRN rope_scaling, MoE router) to `config`.
void AddDeepseekConfig(const ModelShape& shape, nlohmann::ordered_json& config);

// Appends layer `layer`'s tensors: input_layernorm, the MLA projections and norms, o_proj,
// post_attention_layernorm, then a dense MLP (layer < first_k_dense_replace) or the router,
// e_score_correction_bias, every routed expert and the shared experts.
void AppendDeepseekLayerTensors(const ModelShape& shape, int layer,
                                std::vector<CheckpointTensor>& specs);

}  // namespace ringserve
