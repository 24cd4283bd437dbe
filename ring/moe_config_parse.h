// The mixture-of-experts and attention-variant fields of config.json (Qwen2/3-MoE, Mixtral,
// GLM-4.5, gpt-oss): experts, router, dense/MoE layer pattern, shared experts, gpt-oss's
// sliding layers and sinks. Called by ParseModelConfig once the dense fields are parsed.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"
#include "ring/model_config.h"

namespace ringserve {

// Fills config.moe (and, for gpt-oss, sliding_window / sliding_layers / attention_sinks) from
// `j` for config.architecture; leaves dense architectures unchanged apart from refusing keys
// they cannot honour (quantization_config). InvalidArgument naming the key otherwise.
absl::Status ParseMoeConfig(const nlohmann::json& j, ModelConfig& config,
                            const std::string& source);

}  // namespace ringserve
