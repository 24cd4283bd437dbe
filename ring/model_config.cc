#include "ring/model_config.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "common/bounded_file.h"
#include "common/json_limits.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "kernels/cpu/ops.h"
#include "nlohmann/json.hpp"
#include "ring/config_json.h"
#include "ring/deepseek_config.h"
#include "ring/moe_config_parse.h"
#include "ring/sliding_window_parse.h"

namespace ringserve {
namespace {

using config_json::GetBool;
using config_json::GetInt;
using config_json::GetNumber;
using config_json::GetPositive;
using config_json::Invalid;
using config_json::Json;

constexpr Architecture kArchitectures[] = {
    Architecture::kLlama,      Architecture::kMistral,    Architecture::kQwen2,
    Architecture::kQwen3,      Architecture::kQwen2Moe,   Architecture::kQwen3Moe,
    Architecture::kMixtral,    Architecture::kGlm4Moe,    Architecture::kGptOss,
    Architecture::kDeepseekV2, Architecture::kDeepseekV3,
};

// model_type -> the architecture of its *ForCausalLM class, for files without "architectures"
// (a config saved on its own, not with a model, has none).
constexpr std::pair<const char*, Architecture> kModelTypes[] = {
    {"llama", Architecture::kLlama},
    {"mistral", Architecture::kMistral},
    {"qwen2", Architecture::kQwen2},
    {"qwen3", Architecture::kQwen3},
    {"qwen2_moe", Architecture::kQwen2Moe},
    {"qwen3_moe", Architecture::kQwen3Moe},
    {"mixtral", Architecture::kMixtral},
    {"glm4_moe", Architecture::kGlm4Moe},
    {"gpt_oss", Architecture::kGptOss},
    {"deepseek_v2", Architecture::kDeepseekV2},
    {"deepseek_v3", Architecture::kDeepseekV3},
};

absl::StatusOr<Architecture> ParseArchitecture(const Json& j, const std::string& source) {
  auto it = j.find("architectures");
  if (it == j.end() || it->is_null()) {
    auto type = j.find("model_type");
    if (type != j.end() && type->is_string()) {
      for (const auto& [name, architecture] : kModelTypes) {
        if (type->get<std::string>() == name) return architecture;
      }
      return Invalid(
          source, fmt::format("no \"architectures\" and unsupported model_type {}", type->dump()));
    }
  }
  if (it == j.end() || !it->is_array() || it->size() != 1 || !(*it)[0].is_string()) {
    return Invalid(source, "\"architectures\" must be a list with one name");
  }
  const std::string name = (*it)[0].get<std::string>();
  std::string supported;
  for (Architecture a : kArchitectures) {
    if (ArchitectureName(a) == name) return a;
    supported += (supported.empty() ? "" : ", ") + ArchitectureName(a);
  }
  return absl::InvalidArgumentError(
      fmt::format("{}: unsupported architecture \"{}\" (supported: {})", source, name, supported));
}

// rope_parameters nested per layer type ({"full_attention": {...}, "sliding_attention": {...}},
// transformers 5's form for models whose layer types rotate differently): the one parameter set
// every layer type shares, or an error naming the key when they differ (one rotation per model).
absl::StatusOr<const Json*> OneRopeParameterSet(const Json& params, const std::string& key,
                                                const std::string& source) {
  if (params.empty()) return &params;
  for (const auto& [name, value] : params.items()) {
    if ((name != "full_attention" && name != "sliding_attention") || !value.is_object()) {
      return &params;  // a flat parameter set
    }
  }
  const Json& first = params.begin().value();
  for (const auto& [name, value] : params.items()) {
    if (value != first) {
      return Invalid(source, fmt::format("unsupported {} that differ per layer type ({})", key,
                                         params.dump()));
    }
  }
  return &first;
}

// The config class's rope_theta when a file gives none: MixtralConfig 1e6, GptOssConfig 1.5e5,
// the others 1e4.
double DefaultRopeTheta(Architecture architecture) {
  if (architecture == Architecture::kMixtral) return 1000000.0;
  if (architecture == Architecture::kGptOss) return 150000.0;
  return 10000.0;
}

// RoPE: transformers 5 writes "rope_parameters" {rope_type, rope_theta, ...}; older files write
// "rope_theta" plus an optional "rope_scaling" {rope_type|type, ...}.
absl::StatusOr<RopeConfig> ParseRope(const Json& j, Architecture architecture,
                                     const std::string& source) {
  RopeConfig rope;
  rope.theta = DefaultRopeTheta(architecture);
  const Json* params = nullptr;
  std::string params_key;
  // transformers 5 takes rope_scaling over rope_parameters when a file has both.
  for (const char* key : {"rope_scaling", "rope_parameters"}) {
    auto it = j.find(key);
    if (it != j.end() && !it->is_null()) {
      if (!it->is_object()) return Invalid(source, fmt::format("\"{}\" must be an object", key));
      RS_ASSIGN_OR_RETURN(params, OneRopeParameterSet(*it, key, source));
      params_key = key;
      break;
    }
  }
  RS_ASSIGN_OR_RETURN(std::optional<double> theta, GetNumber(j, "rope_theta", source));
  if (params != nullptr) {
    RS_ASSIGN_OR_RETURN(std::optional<double> inner_theta,
                        GetNumber(*params, "rope_theta", source));
    if (inner_theta) theta = inner_theta;
  }
  if (theta) rope.theta = *theta;
  if (!(rope.theta > 1.0) || !std::isfinite(rope.theta)) {
    return Invalid(source, fmt::format("rope_theta must be > 1, got {}", rope.theta));
  }
  if (params == nullptr) return rope;

  std::string type = "default";
  for (const char* key : {"rope_type", "type"}) {
    auto it = params->find(key);
    if (it != params->end() && !it->is_null()) {
      if (!it->is_string())
        return Invalid(source, fmt::format("{}.{} must be a string", params_key, key));
      type = it->get<std::string>();
      break;
    }
  }
  if (type == "default") return rope;
  RS_ASSIGN_OR_RETURN(std::optional<double> factor, GetNumber(*params, "factor", source));
  if (!factor && type == "yarn") {
    // transformers: max_position_embeddings / original_max_position_embeddings (1 without it).
    RS_ASSIGN_OR_RETURN(const std::optional<int64_t> max_positions,
                        GetInt(j, "max_position_embeddings", source, true));
    RS_ASSIGN_OR_RETURN(const std::optional<int64_t> original,
                        GetInt(*params, "original_max_position_embeddings", source, false));
    factor = original && *original > 0 ? static_cast<double>(*max_positions) / *original : 1.0;
  }
  if (!factor || !(*factor > 0)) {
    return Invalid(
        source, fmt::format("{} rope type \"{}\" needs a positive \"factor\"", params_key, type));
  }
  rope.factor = *factor;
  if (type == "dynamic") return rope;  // plain frequencies up to max_position_embeddings
  if (type == "linear") {
    rope.type = RopeType::kLinear;
    return rope;
  }
  if (type == "llama3") {
    rope.type = RopeType::kLlama3;
    RS_ASSIGN_OR_RETURN(std::optional<double> low, GetNumber(*params, "low_freq_factor", source));
    RS_ASSIGN_OR_RETURN(std::optional<double> high, GetNumber(*params, "high_freq_factor", source));
    RS_ASSIGN_OR_RETURN(std::optional<int64_t> original,
                        GetInt(*params, "original_max_position_embeddings", source, false));
    if (!original) {  // transformers falls back to max_position_embeddings
      RS_ASSIGN_OR_RETURN(original, GetInt(j, "max_position_embeddings", source, true));
    }
    if (!low || !high) {
      return Invalid(source, fmt::format("{} rope type \"llama3\" needs low_freq_factor and "
                                         "high_freq_factor",
                                         params_key));
    }
    if (!(*low > 0) || !(*high > *low) || *original <= 0) {
      return Invalid(source, fmt::format("{}: invalid llama3 parameters (need 0 < "
                                         "low_freq_factor < high_freq_factor, original max > 0)",
                                         params_key));
    }
    rope.low_freq_factor = *low;
    rope.high_freq_factor = *high;
    rope.original_max_position_embeddings = static_cast<int>(*original);
    return rope;
  }
  if (type == "yarn") {
    rope.type = RopeType::kYarn;
    RS_ASSIGN_OR_RETURN(std::optional<int64_t> original,
                        GetInt(*params, "original_max_position_embeddings", source, false));
    if (!original) {  // transformers' standardize_rope_params default
      RS_ASSIGN_OR_RETURN(original, GetInt(j, "max_position_embeddings", source, true));
    }
    if (*original <= 0) return Invalid(source, "yarn original_max_position_embeddings must be > 0");
    rope.original_max_position_embeddings = static_cast<int>(*original);
    for (auto [key, field] :
         {std::pair{"beta_fast", &rope.beta_fast}, std::pair{"beta_slow", &rope.beta_slow},
          std::pair{"mscale", &rope.mscale}, std::pair{"mscale_all_dim", &rope.mscale_all_dim}}) {
      RS_ASSIGN_OR_RETURN(std::optional<double> value, GetNumber(*params, key, source));
      // transformers: `get("beta_fast") or 32`, so 0 means the default too.
      if (value && *value != 0) *field = *value;
    }
    RS_ASSIGN_OR_RETURN(rope.attention_factor, GetNumber(*params, "attention_factor", source));
    RS_ASSIGN_OR_RETURN(rope.truncate, GetBool(*params, "truncate", true, source));
    if (!(rope.beta_fast > 0) || !(rope.beta_slow > 0)) {
      return Invalid(source,
                     fmt::format("{}: yarn beta_fast and beta_slow must be > 0", params_key));
    }
    return rope;
  }
  return Invalid(source, fmt::format("unsupported {} rope type \"{}\" (supported: default, "
                                     "linear, dynamic, llama3, yarn)",
                                     params_key, type));
}

// GptOssConfig's defaults for a file without rope parameters: YaRN over 4,096 positions by 32
// (truncate false), theta 150,000 unless rope_theta is given.
void ApplyGptOssRopeDefaults(const Json& j, RopeConfig& rope) {
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (auto it = j.find(key); it != j.end() && !it->is_null()) return;
  }
  if (auto it = j.find("rope_theta"); it == j.end() || it->is_null()) rope.theta = 150000.0;
  rope.type = RopeType::kYarn;
  rope.factor = 32.0;
  rope.original_max_position_embeddings = 4096;
  rope.beta_fast = 32.0;
  rope.beta_slow = 1.0;
  rope.truncate = false;
}

// partial_rotary_factor, top level or inside rope_parameters / rope_scaling; `fallback` if
// absent (GLM-4.5's config class defaults to 0.5, the others rotate every value).
absl::StatusOr<double> ParsePartialRotary(const Json& j, const std::string& source,
                                          double fallback) {
  RS_ASSIGN_OR_RETURN(std::optional<double> partial, GetNumber(j, "partial_rotary_factor", source));
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    auto it = j.find(key);
    if (partial || it == j.end() || !it->is_object()) continue;
    RS_ASSIGN_OR_RETURN(const Json* params, OneRopeParameterSet(*it, key, source));
    RS_ASSIGN_OR_RETURN(partial, GetNumber(*params, "partial_rotary_factor", source));
  }
  return partial.value_or(fallback);
}

// A token id as an int32 (get<int32_t> would wrap 2^32 to 0, a real token).
absl::StatusOr<int32_t> TokenId(const Json& id, const char* key, const std::string& source) {
  if (id.is_number_unsigned() ? id.get<uint64_t>() > INT32_MAX
                              : id.get<int64_t>() < INT32_MIN || id.get<int64_t>() > INT32_MAX) {
    return Invalid(source, fmt::format("{} {} is out of range", key, id.dump()));
  }
  return static_cast<int32_t>(id.get<int64_t>());
}

absl::Status ParseTokenIds(const Json& j, ModelConfig& config, const std::string& source) {
  RS_ASSIGN_OR_RETURN(std::optional<int64_t> bos, GetInt(j, "bos_token_id", source, false));
  if (bos) {
    RS_ASSIGN_OR_RETURN(config.bos_token_id, TokenId(j["bos_token_id"], "bos_token_id", source));
  }
  auto it = j.find("eos_token_id");
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (it->is_number_integer()) {
    RS_ASSIGN_OR_RETURN(const int32_t id, TokenId(*it, "eos_token_id", source));
    config.eos_token_ids.push_back(id);
    return absl::OkStatus();
  }
  if (!it->is_array()) return Invalid(source, "eos_token_id must be an integer or a list");
  for (const Json& id : *it) {
    if (!id.is_number_integer()) return Invalid(source, "eos_token_id list must hold integers");
    RS_ASSIGN_OR_RETURN(const int32_t value, TokenId(id, "eos_token_id", source));
    config.eos_token_ids.push_back(value);
  }
  return absl::OkStatus();
}

absl::Status RefuseUnsupported(const Json& j, const std::string& source) {
  auto act = j.find("hidden_act");
  if (act != j.end() && !act->is_null() &&
      (!act->is_string() || act->get<std::string>() != "silu")) {
    return Invalid(source, fmt::format("unsupported hidden_act {} (only silu)", act->dump()));
  }
  RS_ASSIGN_OR_RETURN(bool mlp_bias, GetBool(j, "mlp_bias", false, source));
  if (mlp_bias) return Invalid(source, "unsupported mlp_bias: true");
  RS_ASSIGN_OR_RETURN(std::optional<int64_t> tp, GetInt(j, "pretraining_tp", source, false));
  if (tp && *tp != 1) return Invalid(source, fmt::format("unsupported pretraining_tp {}", *tp));
  return absl::OkStatus();
}

// quantization_config: what the stages can load (stage/model/quant/quant_config.h parses the
// rest of it), so that a checkpoint they would refuse is refused here, at start, not at load.
absl::Status CheckQuantMethod(const Json& j, Architecture architecture, const std::string& source) {
  auto q = j.find("quantization_config");
  if (q == j.end() || q->is_null()) return absl::OkStatus();
  if (!q->is_object()) return Invalid(source, "quantization_config is not an object");
  auto method = q->find("quant_method");
  if (method == q->end() || !method->is_string()) {
    return Invalid(source, fmt::format("quantization_config.quant_method must be a string, got {}",
                                       method == q->end() ? "none" : method->dump()));
  }
  const std::string name = method->get<std::string>();
  const bool gpt_oss = architecture == Architecture::kGptOss;
  const bool known =
      std::find(kQuantMethods.begin(), kQuantMethods.end(), name) != kQuantMethods.end();
  // gpt-oss's stacked experts exist only as MXFP4, and MXFP4 only as gpt-oss's experts.
  if (!known || gpt_oss != (name == "mxfp4")) {
    return Invalid(source, fmt::format("unsupported quantization_config.quant_method \"{}\" for {} "
                                       "(supported: fp8, compressed-tensors, gptq, awq; "
                                       "gpt-oss only mxfp4)",
                                       name, ArchitectureName(architecture)));
  }
  return absl::OkStatus();
}

// The config class's num_key_value_heads and head_dim for a file without the key (an explicit
// null is num_attention_heads and hidden_size / num_attention_heads, as the classes derive them).
std::optional<int64_t> DefaultKvHeads(Architecture a) {
  switch (a) {
    case Architecture::kMistral:
    case Architecture::kMixtral:
    case Architecture::kGlm4Moe:
    case Architecture::kGptOss:
      return 8;
    case Architecture::kQwen2:
    case Architecture::kQwen3:
      return 32;
    case Architecture::kQwen2Moe:
      return 16;
    case Architecture::kQwen3Moe:
      return 4;
    default:
      return std::nullopt;  // LlamaConfig: num_attention_heads
  }
}
std::optional<int64_t> DefaultHeadDim(Architecture a) {
  if (a == Architecture::kQwen3) return 128;
  if (a == Architecture::kGptOss) return 64;
  return std::nullopt;  // hidden_size / num_attention_heads
}

// num_key_value_heads and head_dim of the models with ordinary heads.
absl::Status ParseHeads(const Json& j, const std::string& source, ModelConfig& config) {
  RS_ASSIGN_OR_RETURN(std::optional<int64_t> kv_heads,
                      GetInt(j, "num_key_value_heads", source, false));
  if (!j.contains("num_key_value_heads")) kv_heads = DefaultKvHeads(config.architecture);
  // Checked as read (a cast would wrap 2^32 + 2 to 2).
  const int64_t kv = kv_heads.value_or(config.num_heads);
  if (kv <= 0 || kv > config.num_heads || config.num_heads % kv != 0) {
    return Invalid(source, fmt::format("num_key_value_heads {} must be positive and divide "
                                       "num_attention_heads {}",
                                       kv, config.num_heads));
  }
  config.num_kv_heads = static_cast<int>(kv);
  RS_ASSIGN_OR_RETURN(std::optional<int64_t> head_dim, GetInt(j, "head_dim", source, false));
  if (!j.contains("head_dim")) head_dim = DefaultHeadDim(config.architecture);
  if (head_dim) {
    // q_size() = num_attention_heads * head_dim is an int: the product must fit.
    if (*head_dim <= 0 || *head_dim * config.num_heads > (int64_t{1} << 30)) {
      return Invalid(source, fmt::format("head_dim {} must be positive with num_attention_heads "
                                         "{} x head_dim at most 2^30",
                                         *head_dim, config.num_heads));
    }
    config.head_dim = static_cast<int>(*head_dim);
  } else {
    if (config.hidden_size % config.num_heads != 0) {
      return Invalid(source, fmt::format("hidden_size {} not divisible by num_attention_heads {} "
                                         "and no head_dim given",
                                         config.hidden_size, config.num_heads));
    }
    config.head_dim = config.hidden_size / config.num_heads;
  }
  if (config.head_dim <= 0 || config.head_dim % 2 != 0) {
    return Invalid(source,
                   fmt::format("head_dim must be positive and even, got {}", config.head_dim));
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> ParseJson(const Json& j, const std::string& source) {
  if (!j.is_object()) return Invalid(source, "top level must be a JSON object");
  ModelConfig config;
  RS_ASSIGN_OR_RETURN(config.architecture, ParseArchitecture(j, source));
  if (auto it = j.find("model_type"); it != j.end() && it->is_string()) {
    config.model_type = it->get<std::string>();
  }
  RS_ASSIGN_OR_RETURN(config.hidden_size, GetPositive(j, "hidden_size", source));
  RS_ASSIGN_OR_RETURN(config.intermediate_size, GetPositive(j, "intermediate_size", source));
  RS_ASSIGN_OR_RETURN(config.num_layers, GetPositive(j, "num_hidden_layers", source));
  RS_ASSIGN_OR_RETURN(config.num_heads, GetPositive(j, "num_attention_heads", source));
  RS_ASSIGN_OR_RETURN(config.vocab_size, GetPositive(j, "vocab_size", source));
  RS_ASSIGN_OR_RETURN(config.max_position_embeddings,
                      GetPositive(j, "max_position_embeddings", source));
  RS_ASSIGN_OR_RETURN(std::optional<double> eps, GetNumber(j, "rms_norm_eps", source));
  // Absent: the config class's default (Mixtral, GLM-4.5 and gpt-oss 1e-5; the others 1e-6).
  const bool eps_1e5 = config.architecture == Architecture::kMixtral ||
                       config.architecture == Architecture::kGlm4Moe ||
                       config.architecture == Architecture::kGptOss;
  config.rms_norm_eps = static_cast<float>(eps.value_or(eps_1e5 ? 1e-5 : 1e-6));
  if (!(config.rms_norm_eps > 0)) return Invalid(source, "rms_norm_eps must be positive");
  RS_ASSIGN_OR_RETURN(config.rope, ParseRope(j, config.architecture, source));
  if (config.architecture == Architecture::kGptOss) ApplyGptOssRopeDefaults(j, config.rope);
  const bool mla = config.architecture == Architecture::kDeepseekV2 ||
                   config.architecture == Architecture::kDeepseekV3;
  if (mla) {
    RS_RETURN_IF_ERROR(ParseDeepseekConfig(j, source, config));
  } else {
    RS_RETURN_IF_ERROR(ParseHeads(j, source, config));
  }

  RS_ASSIGN_OR_RETURN(bool attention_bias, GetBool(j, "attention_bias", false, source));
  switch (config.architecture) {
    case Architecture::kLlama:
    case Architecture::kQwen3:
    case Architecture::kQwen3Moe:
      config.qkv_bias = config.o_bias = attention_bias;
      break;
    case Architecture::kGptOss: {
      // GptOssConfig's default is true; a file's value wins (transformers sets the file's keys
      // after the class's own attention_bias).
      RS_ASSIGN_OR_RETURN(const bool bias, GetBool(j, "attention_bias", true, source));
      config.qkv_bias = config.o_bias = bias;
      break;
    }
    case Architecture::kQwen2:
      config.qkv_bias = true;
      config.o_bias = false;
      break;
    case Architecture::kQwen2Moe: {
      RS_ASSIGN_OR_RETURN(config.qkv_bias, GetBool(j, "qkv_bias", true, source));
      break;
    }
    case Architecture::kGlm4Moe:  // q/k/v only; o_proj never has a bias
      config.qkv_bias = attention_bias;
      break;
    case Architecture::kMistral:
    case Architecture::kMixtral:
      break;
    case Architecture::kDeepseekV2:
    case Architecture::kDeepseekV3:
      break;  // DeepSeek's attention_bias is config.mla->attention_bias
  }
  config.qk_norm =
      config.architecture == Architecture::kQwen3 || config.architecture == Architecture::kQwen3Moe;
  if (config.architecture == Architecture::kGlm4Moe) {
    RS_ASSIGN_OR_RETURN(config.qk_norm, GetBool(j, "use_qk_norm", false, source));
  }
  RS_ASSIGN_OR_RETURN(
      const double partial,
      ParsePartialRotary(j, source, config.architecture == Architecture::kGlm4Moe ? 0.5 : 1.0));
  if (partial != 1.0 && config.architecture != Architecture::kGlm4Moe) {
    return Invalid(source, fmt::format("unsupported partial_rotary_factor {}", partial));
  }
  const double rotary = config.head_dim * partial;
  config.rotary_dim = static_cast<int>(rotary);
  if (!(partial > 0) || config.rotary_dim != rotary || config.rotary_dim % 2 != 0) {
    return Invalid(source, fmt::format("partial_rotary_factor {} must make an even rotary "
                                       "dimension of head_dim {}",
                                       partial, config.head_dim));
  }
  if (config.rope.type == RopeType::kYarn && !mla) {
    if (config.rotary_dim != config.head_dim) {
      return Invalid(source, fmt::format("unsupported rope type \"yarn\" with "
                                         "partial_rotary_factor {} (only with every value rotated)",
                                         partial));
    }
    const float factor = static_cast<float>(YarnAttentionFactor(config.rope));
    config.score_factor = factor * factor;
  }
  RS_ASSIGN_OR_RETURN(config.tie_word_embeddings, GetBool(j, "tie_word_embeddings", false, source));
  RS_RETURN_IF_ERROR(ParseTokenIds(j, config, source));
  for (const char* key : {"dtype", "torch_dtype"}) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    const std::string name = it->is_string() ? it->get<std::string>() : it->dump();
    if (name == "float32") {
      config.dtype = DType::kF32;
    } else if (name == "float16") {
      config.dtype = DType::kF16;
    } else if (name == "bfloat16") {
      config.dtype = DType::kBF16;
    } else {
      return Invalid(source, fmt::format("unsupported {} \"{}\"", key, name));
    }
    break;
  }
  RS_RETURN_IF_ERROR(RefuseUnsupported(j, source));
  RS_RETURN_IF_ERROR(CheckQuantMethod(j, config.architecture, source));
  RS_RETURN_IF_ERROR(ParseMoeConfig(j, config, source));
  RS_RETURN_IF_ERROR(ParseSlidingWindow(j, config, source));
  return config;
}

}  // namespace

std::string ArchitectureName(Architecture architecture) {
  switch (architecture) {
    case Architecture::kLlama:
      return "LlamaForCausalLM";
    case Architecture::kMistral:
      return "MistralForCausalLM";
    case Architecture::kQwen2:
      return "Qwen2ForCausalLM";
    case Architecture::kQwen3:
      return "Qwen3ForCausalLM";
    case Architecture::kQwen2Moe:
      return "Qwen2MoeForCausalLM";
    case Architecture::kQwen3Moe:
      return "Qwen3MoeForCausalLM";
    case Architecture::kMixtral:
      return "MixtralForCausalLM";
    case Architecture::kGlm4Moe:
      return "Glm4MoeForCausalLM";
    case Architecture::kGptOss:
      return "GptOssForCausalLM";
    case Architecture::kDeepseekV2:
      return "DeepseekV2ForCausalLM";
    case Architecture::kDeepseekV3:
      return "DeepseekV3ForCausalLM";
  }
  return "?";
}

absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text,
                                             const std::string& source) {
  if (absl::Status depth = CheckJsonDepth(json_text, source); !depth.ok()) return depth;
  Json j;
  try {
    j = Json::parse(json_text);
  } catch (const Json::exception& e) {
    return Invalid(source, fmt::format("malformed JSON: {}", e.what()));
  }
  try {
    return ParseJson(j, source);
  } catch (const Json::exception& e) {  // e.g. an integer out of range for get<int32_t>
    return Invalid(source, fmt::format("invalid value: {}", e.what()));
  }
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir) {
  const std::string path = model_dir + "/config.json";
  RS_ASSIGN_OR_RETURN(const std::string text, ReadBoundedFile(path, kMaxConfigJsonBytes));
  return ParseModelConfig(text, path);
}

std::vector<float> RopeInverseFrequencies(const RopeConfig& rope, int head_dim) {
  std::vector<float> inv_freq = cpu::RopeInvFreq(head_dim, rope.theta);
  switch (rope.type) {
    case RopeType::kDefault:
      break;
    case RopeType::kLinear:
      for (float& f : inv_freq) f = static_cast<float>(f / rope.factor);
      break;
    case RopeType::kLlama3:
      cpu::ApplyLlama3RopeScaling(inv_freq, rope.factor, rope.low_freq_factor,
                                  rope.high_freq_factor, rope.original_max_position_embeddings);
      break;
    case RopeType::kYarn:
      return YarnInverseFrequencies(rope, head_dim);
  }
  return inv_freq;
}

}  // namespace ringserve
