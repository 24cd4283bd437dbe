// A Hugging Face decoder-only model's config.json, parsed and validated once into an immutable
// struct. Supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM
// (dense); Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, MixtralForCausalLM, Glm4MoeForCausalLM and
// GptOssForCausalLM (mixtures of experts, ring/moe_config.h); DeepseekV2ForCausalLM and
// DeepseekV3ForCausalLM (multi-head latent attention, dense and MoE layers; the DeepSeek fields are
// parsed in deepseek_config.cc). Anything that would change results and that the backends do not
// implement (unknown RoPE types, MLP bias, a quant_method no stage loads, ...) is refused with a
// message naming the key, never silently ignored.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "ring/moe_config.h"

namespace ringserve {

enum class Architecture {
  kLlama,
  kMistral,
  kQwen2,
  kQwen3,
  kQwen2Moe,
  kQwen3Moe,
  kMixtral,
  kGlm4Moe,
  kGptOss,
  kDeepseekV2,
  kDeepseekV3,
};

// "LlamaForCausalLM", ...
std::string ArchitectureName(Architecture architecture);

// The quantization_config.quant_method values the stages load (stage/model/quant/quant_config.h
// parses and checks the rest of each); "mxfp4" for gpt-oss only, and gpt-oss only as "mxfp4".
// ParseModelConfig refuses any other value, naming the key and the value.
inline constexpr std::array<std::string_view, 5> kQuantMethods = {"fp8", "compressed-tensors",
                                                                  "gptq", "awq", "mxfp4"};

enum class RopeType {
  kDefault,  // plain RoPE: inv_freq[i] = theta^(-2i / head_dim)
  kLinear,   // positions divided by `factor` (equivalently inv_freq / factor)
  kLlama3,   // Llama 3.1 frequency-dependent scaling (factor, low/high_freq_factor, original max)
  kYarn,     // YaRN: frequencies blended by a ramp, cos/sin scaled (YarnAttentionFactor)
  // "dynamic" (dynamic NTK) parses as kDefault: transformers changes the frequencies only for
  // sequences longer than max_position_embeddings, which ringserve never runs.
};

struct RopeConfig {
  RopeType type = RopeType::kDefault;
  double theta = 10000.0;
  // kLinear and kLlama3.
  double factor = 1.0;
  // kLlama3 only.
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  // kLlama3 and kYarn.
  int original_max_position_embeddings = 8192;
  // kYarn only (transformers' _compute_yarn_parameters; 0 = absent).
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 0;
  double mscale_all_dim = 0;
  std::optional<double> attention_factor;  // explicit cos/sin factor, else derived from mscale
  bool truncate = true;
};

// DeepSeek-V2/V3 multi-head latent attention (MLA). Per token and layer the KV cache holds the
// normalized latent [kv_lora_rank] and the rotated rope key [qk_rope_head_dim], shared by all
// heads; kv_b_proj up-projects the latent to each head's no-rope key and value.
struct MlaConfig {
  int q_lora_rank = 0;  // 0: a plain q_proj; else q_a_proj + q_a_layernorm + q_b_proj
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;  // even
  int v_head_dim = 0;
  // Rope pairs are (2i, 2i+1) (V3's rope_interleave, V2 always) instead of (i, i + d/2).
  bool rope_interleave = true;
  // attention_bias: biases of q_a_proj, kv_a_proj_with_mqa and o_proj.
  bool attention_bias = false;
  // Softmax scale: qk_head_dim^-0.5, times yarn_get_mscale(factor, mscale_all_dim)^2 with YaRN.
  double softmax_scale = 0;
  // Factor on cos/sin of the rope rotation (YaRN's attention factor; 1 otherwise).
  double rope_attention_factor = 1.0;
  // Layers [0, first_k_dense_replace) have a dense MLP; later ones are MoE.
  int first_k_dense_replace = 0;
  // Multi-token-prediction layers after the last decoder layer (model.layers.{num_layers}.*).
  int num_nextn_predict_layers = 0;

  int qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // Values per token and layer in the compressed KV cache.
  int latent_cache_dim() const { return kv_lora_rank + qk_rope_head_dim; }
};

struct ModelConfig {
  Architecture architecture = Architecture::kLlama;
  std::string model_type;  // config.json "model_type", e.g. "llama"

  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;    // num_hidden_layers
  int num_heads = 0;     // num_attention_heads
  int num_kv_heads = 0;  // num_key_value_heads (== num_heads without GQA); divides num_heads
  // Explicit head_dim, else hidden_size / num_heads; with MLA the rope key's width
  // (qk_rope_head_dim), which RopeInverseFrequencies takes.
  int head_dim = 0;
  int vocab_size = 0;
  int max_position_embeddings = 0;
  float rms_norm_eps = 1e-6f;
  RopeConfig rope;
  // YaRN's attention factor squared (1 otherwise). transformers multiplies cos and sin by that
  // factor, which scales every rotated q and k value; with every value rotated (YaRN with
  // partial rotary is refused) that equals scaling the scores, so the kernels rotate plainly
  // and AttentionScale() carries it. (MLA folds its own into mla->softmax_scale.)
  float score_factor = 1.0f;

  // Biases of the attention projections. Qwen2: q/k/v always, o never; Llama/Qwen3:
  // `attention_bias` for q/k/v/o; Mistral: none.
  bool qkv_bias = false;
  bool o_bias = false;
  // Qwen3: per-head RMSNorm of q and k (weights [head_dim]) before RoPE.
  bool qk_norm = false;
  // lm_head shares model.embed_tokens.weight (the checkpoint may omit lm_head.weight).
  bool tie_word_embeddings = false;

  std::optional<int32_t> bos_token_id;
  std::vector<int32_t> eos_token_ids;  // config "eos_token_id": an int or a list; may be empty
  // Checkpoint dtype ("torch_dtype" or, in transformers 5 files, "dtype"); kBF16 if absent.
  DType dtype = DType::kBF16;

  // RoPE rotates the first rotary_dim values of each head ("rotate half" over those), the rest
  // pass through: head_dim * partial_rotary_factor (GLM-4.5: half). == head_dim otherwise.
  int rotary_dim = 0;
  // Sliding-window attention (gpt-oss): on layers marked in sliding_layers a query at position p
  // attends to positions (p - sliding_window, p]. sliding_layers is empty when no layer slides.
  int sliding_window = 0;
  std::vector<bool> sliding_layers;
  // gpt-oss: each head has a learned logit (self_attn.sinks) that joins its softmax's
  // denominator and contributes no value.
  bool attention_sinks = false;
  MoeConfig moe;
  // DeepSeek-V2/V3 only.
  std::optional<MlaConfig> mla;

  // Softmax scale of ordinary attention: head_dim^-0.5 times score_factor.
  float AttentionScale() const {
    return 1.0f / std::sqrt(static_cast<float>(head_dim)) * score_factor;
  }
  int q_size() const { return num_heads * head_dim; }
  int kv_size() const { return num_kv_heads * head_dim; }
  // The window of `layer`'s attention, 0 for full attention.
  int SlidingWindowOf(int layer) const {
    return layer >= 0 && layer < static_cast<int>(sliding_layers.size()) && sliding_layers[layer]
               ? sliding_window
               : 0;
  }
  // Values the KV cache holds per token and layer: K and V of every KV head, or with MLA the
  // latent and the rope key.
  int64_t kv_values_per_token_layer() const {
    return mla ? mla->latent_cache_dim() : int64_t{2} * kv_size();
  }
};

// Parses config.json text. `source` names the file in error messages. InvalidArgument for
// malformed JSON, missing/invalid fields, and unsupported architectures or features.
absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text,
                                             const std::string& source = "config.json");

// Reads (common/bounded_file.h: a regular file of at most kMaxConfigJsonBytes) and parses
// `model_dir`/config.json. NotFound if the file is missing; InvalidArgument naming the path
// when it is not a regular file (a FIFO, a device) or is too large.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir);

// The RoPE inverse frequencies [head_dim / 2] for `rope` (default, linear, llama3 or yarn),
// in fp32 as transformers computes them. Rotation angle of pair i at position p: p * inv_freq[i].
std::vector<float> RopeInverseFrequencies(const RopeConfig& rope, int head_dim);

}  // namespace ringserve
