#include "ring/moe_config_parse.h"

#include <cmath>

#include "common/status_macros.h"
#include "fmt/format.h"
#include "ring/config_json.h"

namespace ringserve {
namespace {

using config_json::GetBool;
using config_json::GetInt;
using config_json::GetIntList;
using config_json::GetNumber;
using config_json::GetPositive;
using config_json::GetString;
using config_json::Invalid;
using config_json::Json;

// Qwen2/3-MoE: a layer is MoE unless listed in mlp_only_layers, and only every
// decoder_sparse_step-th layer ((i + 1) % step == 0).
absl::Status ParseQwenMoe(const Json& j, ModelConfig& c, const std::string& source) {
  MoeConfig& m = c.moe;
  // The hub's files say num_experts; transformers 5 writes num_local_experts.
  const char* experts_key = j.contains("num_experts") ? "num_experts" : "num_local_experts";
  RS_ASSIGN_OR_RETURN(std::optional<int64_t> experts, GetInt(j, experts_key, source, true));
  if (*experts <= 0) {
    return Invalid(source, fmt::format("{} must be positive, got {} (a dense model is "
                                       "Qwen2ForCausalLM / Qwen3ForCausalLM)",
                                       experts_key, *experts));
  }
  if (*experts > kMaxExperts) {
    return Invalid(
        source, fmt::format("{} {} exceeds the limit of {}", experts_key, *experts, kMaxExperts));
  }
  m.router.num_experts = static_cast<int>(*experts);
  RS_ASSIGN_OR_RETURN(m.router.top_k, GetPositive(j, "num_experts_per_tok", source));
  RS_ASSIGN_OR_RETURN(m.expert_intermediate_size, GetPositive(j, "moe_intermediate_size", source));
  RS_ASSIGN_OR_RETURN(m.router.norm_topk_prob, GetBool(j, "norm_topk_prob", false, source));
  RS_ASSIGN_OR_RETURN(std::optional<int64_t> step, GetInt(j, "decoder_sparse_step", source, false));
  const int64_t sparse_step = step.value_or(1);
  if (sparse_step <= 0) {
    return Invalid(source,
                   fmt::format("decoder_sparse_step must be positive, got {}", sparse_step));
  }
  RS_ASSIGN_OR_RETURN(std::vector<int64_t> mlp_only, GetIntList(j, "mlp_only_layers", source));
  m.layers.assign(c.num_layers, false);
  for (int layer = 0; layer < c.num_layers; ++layer) {
    m.layers[layer] = (layer + 1) % sparse_step == 0;
  }
  for (int64_t layer : mlp_only) {
    if (layer < 0 || layer >= c.num_layers) {
      return Invalid(source, fmt::format("mlp_only_layers entry {} is not a layer of [0, {})",
                                         layer, c.num_layers));
    }
    m.layers[layer] = false;
  }
  if (c.architecture == Architecture::kQwen2Moe) {
    RS_ASSIGN_OR_RETURN(m.shared_intermediate_size,
                        GetPositive(j, "shared_expert_intermediate_size", source));
    m.shared_expert_gate = true;
  }
  return absl::OkStatus();
}

// gpt-oss: router with bias, top-k then softmax, clamped SwiGLU experts with biases, attention
// sinks (its sliding layers: sliding_window_parse.h).
absl::Status ParseGptOss(const Json& j, ModelConfig& c, const std::string& source) {
  MoeConfig& m = c.moe;
  m.router.scoring = RouterScoring::kTopKSoftmax;
  RS_ASSIGN_OR_RETURN(m.router.num_experts, GetPositive(j, "num_local_experts", source));
  RS_ASSIGN_OR_RETURN(m.router.top_k, GetPositive(j, "num_experts_per_tok", source));
  m.expert_intermediate_size = c.intermediate_size;
  m.layout = ExpertLayout::kGptOssStacked;
  m.activation = ExpertActivation::kClampedSwiglu;
  m.router_bias = true;
  m.layers.assign(c.num_layers, true);
  // transformers 5.17 applies alpha 1.702 and limit 7.0 whatever the file says (the released
  // checkpoints say the same); another value would be followed by no reference we test against.
  for (const auto& [key, want] : {std::pair<const char*, double>{"swiglu_limit", 7.0},
                                  std::pair<const char*, double>{"swiglu_alpha", 1.702}}) {
    RS_ASSIGN_OR_RETURN(std::optional<double> value, GetNumber(j, key, source));
    if (value && std::abs(*value - want) > 1e-6) {
      return Invalid(source, fmt::format("unsupported {} {} (only {})", key, *value, want));
    }
  }
  c.attention_sinks = true;
  return absl::OkStatus();
}

// A DeepSeek-V2/V3 model has MoE layers unless n_routed_experts is 0 or null or every layer
// is before first_k_dense_replace (config.mla, parsed by ParseDeepseekConfig).
absl::StatusOr<bool> HasDeepseekMoeLayers(const Json& j, const ModelConfig& c,
                                          const std::string& source) {
  RS_ASSIGN_OR_RETURN(std::optional<int64_t> experts, GetInt(j, "n_routed_experts", source, false));
  const auto it = j.find("n_routed_experts");
  if ((experts && *experts == 0) || (it != j.end() && it->is_null())) return false;
  return c.mla->first_k_dense_replace < c.num_layers;
}

// DeepSeek-V2 (transformers 5.17's DeepseekV2Moe): softmax scores, topk_method greedy or
// group_limited_greedy, the chosen probabilities times routed_scaling_factor (never
// renormalized), n_shared_experts shared experts of moe_intermediate_size each.
absl::Status ParseDeepseekV2Moe(const Json& j, ModelConfig& c, const std::string& source) {
  MoeConfig& m = c.moe;
  m.router.scoring = RouterScoring::kSoftmaxTopK;
  RS_ASSIGN_OR_RETURN(m.router.num_experts, GetPositive(j, "n_routed_experts", source));
  RS_ASSIGN_OR_RETURN(m.router.top_k, GetPositive(j, "num_experts_per_tok", source));
  RS_ASSIGN_OR_RETURN(m.expert_intermediate_size, GetPositive(j, "moe_intermediate_size", source));
  // norm_topk_prob is read as transformers 5.17 reads it for DeepSeek-V2: not at all (every
  // published V2 file says false; DeepSeek's own code would renormalize instead of scaling).
  RS_RETURN_IF_ERROR(GetBool(j, "norm_topk_prob", false, source).status());
  RS_ASSIGN_OR_RETURN(std::optional<std::string> scoring, GetString(j, "scoring_func", source));
  if (scoring && *scoring != "softmax") {
    return Invalid(source, fmt::format("unsupported scoring_func \"{}\" for DeepseekV2ForCausalLM "
                                       "(only softmax)",
                                       *scoring));
  }
  RS_ASSIGN_OR_RETURN(std::optional<std::string> method, GetString(j, "topk_method", source));
  const std::string topk_method = method.value_or("greedy");
  if (topk_method == "group_limited_greedy") {
    RS_ASSIGN_OR_RETURN(m.router.n_group, GetPositive(j, "n_group", source));
    RS_ASSIGN_OR_RETURN(m.router.topk_group, GetPositive(j, "topk_group", source));
  } else if (topk_method != "greedy") {
    return Invalid(source, fmt::format("unsupported topk_method \"{}\" for DeepseekV2ForCausalLM "
                                       "(greedy, group_limited_greedy)",
                                       topk_method));
  }
  RS_ASSIGN_OR_RETURN(std::optional<double> scale, GetNumber(j, "routed_scaling_factor", source));
  m.router.routed_scaling_factor = static_cast<float>(scale.value_or(1.0));
  // transformers' default is 2 shared experts; null means none (DeepSeek's own code).
  int64_t shared = 2;
  if (auto it = j.find("n_shared_experts"); it != j.end()) {
    RS_ASSIGN_OR_RETURN(std::optional<int64_t> n, GetInt(j, "n_shared_experts", source, false));
    shared = n.value_or(0);
  }
  if (shared < 0) return Invalid(source, "n_shared_experts must be >= 0");
  m.shared_intermediate_size = static_cast<int>(shared) * m.expert_intermediate_size;
  return absl::OkStatus();
}

// DeepSeek-V2/V3 MoE layers: V3 routes as GLM-4.5 (ParseDeepSeekMoe), V2 with softmax scores.
// Layers at or after first_k_dense_replace are MoE (transformers' DeepseekV2/V3DecoderLayer).
absl::Status ParseDeepseekMoeLayers(const Json& j, ModelConfig& c, const std::string& source) {
  if (c.architecture == Architecture::kDeepseekV3) {
    RS_RETURN_IF_ERROR(ParseDeepSeekMoe(j, c, source));
  } else {
    RS_RETURN_IF_ERROR(ParseDeepseekV2Moe(j, c, source));
  }
  c.moe.layers.assign(c.num_layers, false);
  for (int layer = c.mla->first_k_dense_replace; layer < c.num_layers; ++layer) {
    c.moe.layers[layer] = true;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseDeepSeekMoe(const Json& j, ModelConfig& c, const std::string& source) {
  MoeConfig& m = c.moe;
  m.router.scoring = RouterScoring::kSigmoidGroupedTopK;
  RS_ASSIGN_OR_RETURN(m.router.num_experts, GetPositive(j, "n_routed_experts", source));
  RS_ASSIGN_OR_RETURN(m.router.top_k, GetPositive(j, "num_experts_per_tok", source));
  RS_ASSIGN_OR_RETURN(m.expert_intermediate_size, GetPositive(j, "moe_intermediate_size", source));
  RS_ASSIGN_OR_RETURN(m.router.norm_topk_prob, GetBool(j, "norm_topk_prob", true, source));
  RS_ASSIGN_OR_RETURN(std::optional<int64_t> n_group, GetInt(j, "n_group", source, false));
  RS_ASSIGN_OR_RETURN(std::optional<int64_t> topk_group, GetInt(j, "topk_group", source, false));
  // Absent keys take the config class's defaults: DeepseekV3Config's 8 groups, best 4, scale
  // 2.5; Glm4MoeConfig's 1, 1, 1.
  const bool v3 = c.architecture == Architecture::kDeepseekV3;
  m.router.n_group = static_cast<int>(n_group.value_or(v3 ? 8 : 1));
  m.router.topk_group = static_cast<int>(topk_group.value_or(v3 ? 4 : 1));
  RS_ASSIGN_OR_RETURN(std::optional<double> scale, GetNumber(j, "routed_scaling_factor", source));
  m.router.routed_scaling_factor = static_cast<float>(scale.value_or(v3 ? 2.5 : 1.0));
  m.correction_bias = true;
  RS_ASSIGN_OR_RETURN(std::optional<int64_t> shared, GetInt(j, "n_shared_experts", source, false));
  if (shared.value_or(1) < 0) return Invalid(source, "n_shared_experts must be >= 0");
  m.shared_intermediate_size = static_cast<int>(shared.value_or(1)) * m.expert_intermediate_size;
  RS_ASSIGN_OR_RETURN(std::optional<int64_t> dense,
                      GetInt(j, "first_k_dense_replace", source, false));
  const int64_t first_moe = dense.value_or(1);
  if (first_moe < 0) return Invalid(source, "first_k_dense_replace must be >= 0");
  m.layers.assign(c.num_layers, false);
  for (int layer = 0; layer < c.num_layers; ++layer) m.layers[layer] = layer >= first_moe;
  // DeepSeek-style keys GLM-4.5 files do not carry; other values would change the routing.
  RS_ASSIGN_OR_RETURN(std::optional<std::string> scoring, GetString(j, "scoring_func", source));
  if (scoring && *scoring != "sigmoid") {
    return Invalid(source, fmt::format("unsupported scoring_func \"{}\" (only sigmoid)", *scoring));
  }
  RS_ASSIGN_OR_RETURN(std::optional<std::string> method, GetString(j, "topk_method", source));
  if (method && *method != "noaux_tc") {
    return Invalid(source, fmt::format("unsupported topk_method \"{}\" (only noaux_tc)", *method));
  }
  return absl::OkStatus();
}

absl::Status ParseMoeConfig(const Json& j, ModelConfig& c, const std::string& source) {
  switch (c.architecture) {
    case Architecture::kLlama:
    case Architecture::kMistral:
    case Architecture::kQwen2:
    case Architecture::kQwen3:
      return absl::OkStatus();
    case Architecture::kDeepseekV2:
    case Architecture::kDeepseekV3: {
      RS_ASSIGN_OR_RETURN(bool has_moe, HasDeepseekMoeLayers(j, c, source));
      if (!has_moe) return absl::OkStatus();  // dense DeepSeek layers (quantized or not)
      RS_RETURN_IF_ERROR(ParseDeepseekMoeLayers(j, c, source));
      break;
    }
    case Architecture::kQwen2Moe:
    case Architecture::kQwen3Moe:
      RS_RETURN_IF_ERROR(ParseQwenMoe(j, c, source));
      break;
    case Architecture::kMixtral: {
      RS_ASSIGN_OR_RETURN(c.moe.router.num_experts, GetPositive(j, "num_local_experts", source));
      RS_ASSIGN_OR_RETURN(c.moe.router.top_k, GetPositive(j, "num_experts_per_tok", source));
      c.moe.router.norm_topk_prob = true;
      c.moe.expert_intermediate_size = c.intermediate_size;
      c.moe.layout = ExpertLayout::kMixtral;
      c.moe.layers.assign(c.num_layers, true);
      break;
    }
    case Architecture::kGlm4Moe:
      RS_RETURN_IF_ERROR(ParseDeepSeekMoe(j, c, source));
      break;
    case Architecture::kGptOss:
      RS_RETURN_IF_ERROR(ParseGptOss(j, c, source));
      break;
  }
  if (absl::Status s = ValidateRouterOptions(c.moe.router); !s.ok()) {
    return Invalid(source, std::string(s.message()));
  }
  return absl::OkStatus();
}

}  // namespace ringserve
