#include "ring/deepseek_config.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "common/status_macros.h"
#include "fmt/format.h"
#include "kernels/cpu/ops.h"

namespace ringserve {
namespace {

using Json = nlohmann::json;

absl::Status Invalid(const std::string& source, const std::string& what) {
  return absl::InvalidArgumentError(fmt::format("{}: {}", source, what));
}

// An integer field; nullopt when absent or null.
absl::StatusOr<std::optional<int64_t>> OptionalInt(const Json& j, const std::string& key,
                                                   const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::optional<int64_t>();
  if (!it->is_number_integer()) {
    return Invalid(source, fmt::format("field \"{}\" must be an integer, got {}", key, it->dump()));
  }
  return std::optional<int64_t>(it->get<int64_t>());
}

absl::StatusOr<int> RequiredPositive(const Json& j, const std::string& key,
                                     const std::string& source) {
  RS_ASSIGN_OR_RETURN(std::optional<int64_t> value, OptionalInt(j, key, source));
  if (!value) return Invalid(source, fmt::format("missing required field \"{}\"", key));
  if (*value <= 0 || *value > (int64_t{1} << 20)) {
    return Invalid(source,
                   fmt::format("field \"{}\" must be a positive integer, got {}", key, *value));
  }
  return static_cast<int>(*value);
}

// DeepSeek's MoE layers (moe_config_parse.cc) follow transformers, where every layer from
// first_k_dense_replace on is MoE; DeepSeek's own moe_layer_freq would skip some.
absl::Status RefuseMoeLayerFrequency(const Json& j, const std::string& source) {
  RS_ASSIGN_OR_RETURN(std::optional<int64_t> freq, OptionalInt(j, "moe_layer_freq", source));
  if (freq && *freq != 1) {
    return Invalid(source, fmt::format("unsupported moe_layer_freq {} (only 1)", *freq));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseDeepseekConfig(const Json& j, const std::string& source, ModelConfig& config) {
  MlaConfig mla;
  // Absent: DeepseekV2Config's and DeepseekV3Config's default, 1536; null: a plain q_proj.
  RS_ASSIGN_OR_RETURN(std::optional<int64_t> q_lora, OptionalInt(j, "q_lora_rank", source));
  if (!j.contains("q_lora_rank")) q_lora = 1536;
  if (q_lora) {
    if (*q_lora <= 0 || *q_lora > (int64_t{1} << 20)) {
      return Invalid(source, fmt::format("q_lora_rank must be positive or null, got {}", *q_lora));
    }
    mla.q_lora_rank = static_cast<int>(*q_lora);
  }
  RS_ASSIGN_OR_RETURN(mla.kv_lora_rank, RequiredPositive(j, "kv_lora_rank", source));
  RS_ASSIGN_OR_RETURN(mla.qk_nope_head_dim, RequiredPositive(j, "qk_nope_head_dim", source));
  RS_ASSIGN_OR_RETURN(mla.qk_rope_head_dim, RequiredPositive(j, "qk_rope_head_dim", source));
  RS_ASSIGN_OR_RETURN(mla.v_head_dim, RequiredPositive(j, "v_head_dim", source));
  if (mla.qk_rope_head_dim % 2 != 0) {
    return Invalid(source,
                   fmt::format("qk_rope_head_dim must be even, got {}", mla.qk_rope_head_dim));
  }
  // V2 rotates (2i, 2i+1) pairs through complex numbers; V3 says which layout it uses.
  mla.rope_interleave = true;
  if (config.architecture == Architecture::kDeepseekV3) {
    auto it = j.find("rope_interleave");
    if (it != j.end() && !it->is_null()) {
      if (!it->is_boolean()) return Invalid(source, "rope_interleave must be true or false");
      mla.rope_interleave = it->get<bool>();
    }
  }
  if (auto it = j.find("attention_bias"); it != j.end() && !it->is_null()) {
    if (!it->is_boolean()) return Invalid(source, "attention_bias must be true or false");
    mla.attention_bias = it->get<bool>();
  }
  RS_ASSIGN_OR_RETURN(std::optional<int64_t> first_dense,
                      OptionalInt(j, "first_k_dense_replace", source));
  // transformers' defaults: 3 for V3, 0 for V2.
  mla.first_k_dense_replace = static_cast<int>(
      first_dense.value_or(config.architecture == Architecture::kDeepseekV3 ? 3 : 0));
  if (mla.first_k_dense_replace < 0) {
    return Invalid(source, fmt::format("first_k_dense_replace must be >= 0, got {}",
                                       mla.first_k_dense_replace));
  }
  RS_ASSIGN_OR_RETURN(std::optional<int64_t> nextn,
                      OptionalInt(j, "num_nextn_predict_layers", source));
  if (nextn && (*nextn < 0 || *nextn > 16)) {
    return Invalid(source,
                   fmt::format("num_nextn_predict_layers must be in [0, 16], got {}", *nextn));
  }
  mla.num_nextn_predict_layers = static_cast<int>(nextn.value_or(0));

  // Every head has its own up-projected key: no grouping of KV heads.
  RS_ASSIGN_OR_RETURN(std::optional<int64_t> kv_heads,
                      OptionalInt(j, "num_key_value_heads", source));
  if (kv_heads && *kv_heads != config.num_heads) {
    return Invalid(source, fmt::format("unsupported num_key_value_heads {} != num_attention_heads "
                                       "{} for multi-head latent attention",
                                       *kv_heads, config.num_heads));
  }
  RS_ASSIGN_OR_RETURN(std::optional<int64_t> head_dim, OptionalInt(j, "head_dim", source));
  if (head_dim && *head_dim != mla.qk_rope_head_dim) {
    return Invalid(source, fmt::format("unsupported head_dim {} != qk_rope_head_dim {} (the rope "
                                       "width of multi-head latent attention)",
                                       *head_dim, mla.qk_rope_head_dim));
  }
  if (config.rope.type != RopeType::kDefault && config.rope.type != RopeType::kYarn) {
    return Invalid(source, "unsupported rope type for DeepSeek (supported: default, yarn)");
  }

  mla.softmax_scale = 1.0 / std::sqrt(static_cast<double>(mla.qk_head_dim()));
  if (config.rope.type == RopeType::kYarn) {
    if (config.rope.mscale_all_dim != 0) {
      const double m = YarnGetMscale(config.rope.factor, config.rope.mscale_all_dim);
      mla.softmax_scale *= m * m;
    }
    mla.rope_attention_factor = YarnAttentionFactor(config.rope);
  }
  config.num_kv_heads = config.num_heads;
  config.head_dim = mla.qk_rope_head_dim;
  config.mla = mla;
  return RefuseMoeLayerFrequency(j, source);
}

double YarnGetMscale(double scale, double mscale) {
  if (scale <= 1) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

double YarnAttentionFactor(const RopeConfig& rope) {
  if (rope.attention_factor) return *rope.attention_factor;
  if (rope.mscale != 0 && rope.mscale_all_dim != 0) {
    return YarnGetMscale(rope.factor, rope.mscale) /
           YarnGetMscale(rope.factor, rope.mscale_all_dim);
  }
  return YarnGetMscale(rope.factor, 1.0);
}

std::vector<float> YarnInverseFrequencies(const RopeConfig& rope, int dim) {
  const double base = rope.theta;
  auto correction_dim = [&](double rotations) {
    return (dim * std::log(rope.original_max_position_embeddings / (rotations * 2 * M_PI))) /
           (2 * std::log(base));
  };
  double low = correction_dim(rope.beta_fast);
  double high = correction_dim(rope.beta_slow);
  if (rope.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // transformers' guard against a zero-width ramp
  const std::vector<float> extrapolation = cpu::RopeInvFreq(dim, base);
  std::vector<float> inv_freq(extrapolation.size());
  const float factor = static_cast<float>(rope.factor);
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const float ramp =
        std::clamp(static_cast<float>((static_cast<double>(i) - low) / (high - low)), 0.0f, 1.0f);
    const float extrapolation_weight = 1.0f - ramp;
    const float interpolated = 1.0f / (factor * (1.0f / extrapolation[i]));
    inv_freq[i] =
        interpolated * (1.0f - extrapolation_weight) + extrapolation[i] * extrapolation_weight;
  }
  return inv_freq;
}

}  // namespace ringserve
