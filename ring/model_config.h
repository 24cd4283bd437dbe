// A Hugging Face decoder-only model's config.json, parsed and validated once into an immutable
// struct. Supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM
// (dense). Anything that would change results and that the backends do not implement (sliding
// window attention, unknown RoPE types, partial rotary, MLP bias, ...) is refused with a message
// naming it, never silently ignored.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dtype.h"

namespace ringserve {

enum class Architecture { kLlama, kMistral, kQwen2, kQwen3 };

// "LlamaForCausalLM", ...
std::string ArchitectureName(Architecture architecture);

enum class RopeType {
  kDefault,  // plain RoPE: inv_freq[i] = theta^(-2i / head_dim)
  kLinear,   // positions divided by `factor` (equivalently inv_freq / factor)
  kLlama3,   // Llama 3.1 frequency-dependent scaling (factor, low/high_freq_factor, original max)
};

struct RopeConfig {
  RopeType type = RopeType::kDefault;
  double theta = 10000.0;
  // kLinear and kLlama3.
  double factor = 1.0;
  // kLlama3 only.
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int original_max_position_embeddings = 8192;
};

struct ModelConfig {
  Architecture architecture = Architecture::kLlama;
  std::string model_type;  // config.json "model_type", e.g. "llama"

  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;    // num_hidden_layers
  int num_heads = 0;     // num_attention_heads
  int num_kv_heads = 0;  // num_key_value_heads (== num_heads without GQA); divides num_heads
  int head_dim = 0;      // explicit head_dim, else hidden_size / num_heads
  int vocab_size = 0;
  int max_position_embeddings = 0;
  float rms_norm_eps = 1e-6f;
  RopeConfig rope;

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

  int q_size() const { return num_heads * head_dim; }
  int kv_size() const { return num_kv_heads * head_dim; }
};

// Parses config.json text. `source` names the file in error messages. InvalidArgument for
// malformed JSON, missing/invalid fields, and unsupported architectures or features.
absl::StatusOr<ModelConfig> ParseModelConfig(const std::string& json_text,
                                             const std::string& source = "config.json");

// Reads and parses `model_dir`/config.json. NotFound if the file is missing.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir);

// The RoPE inverse frequencies [head_dim / 2] for `rope` (default, linear or llama3 scaling),
// in fp32 as transformers computes them. Rotation angle of pair i at position p: p * inv_freq[i].
std::vector<float> RopeInverseFrequencies(const RopeConfig& rope, int head_dim);

}  // namespace ringserve
