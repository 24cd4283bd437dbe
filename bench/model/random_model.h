// Writes a random-weight Hugging Face model directory in a real model's shape, for benchmarks
// (no weights can be downloaded here): config.json, generation_config.json, safetensors
// (sharded with model.safetensors.index.json when larger than one shard) and the real tokenizer
// of the family, copied from the fetched npm assets.
//
// Values: matrices (embeddings, projections, lm_head) ~ approximately normal(0, init_std)
// (Irwin-Hall of four uniforms, scaled); norm weights 1. Generation is deterministic for a
// seed, whatever the thread count: every 1 Mi-element chunk of a tensor has its own xorshift
// stream keyed by (seed, tensor name, chunk index).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/dtype.h"

namespace ringserve {

// DeepSeek-V3's multi-head latent attention and MoE layout (kv_lora_rank > 0 switches it on;
// bench/model/deepseek_random_shape.h writes its config keys and tensors).
struct MlaShape {
  int q_lora_rank = 0;  // 0: a plain q_proj
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;
  int first_k_dense_replace = 0;  // layers before it have a dense MLP, later ones are MoE
  int n_shared_experts = 0;
  int n_group = 1;
  int topk_group = 1;
  double routed_scaling_factor = 1.0;
  // YaRN (factor, original max); factor 0: plain RoPE.
  double yarn_factor = 0;
  int yarn_original_max_position_embeddings = 0;

  bool enabled() const { return kv_lora_rank > 0; }
};

// Linear layers of a written checkpoint stored quantized, in the layout the hub uses
// (quant_layout.h says which).
enum class CheckpointQuant { kNone, kInt4G128, kInt8, kFp8Block };

// The shape of a model: what config.json says.
struct ModelShape {
  std::string name;          // "llama-3.1-8b", ...
  std::string architecture;  // "LlamaForCausalLM" | "Qwen3ForCausalLM" | "Qwen3MoeForCausalLM"
  std::string model_type;    // "llama" | "qwen3" | "qwen3_moe"
  std::string tokenizer;     // directory name under the tokenizers dir: "llama3" | "qwen3"
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int vocab_size = 0;
  int max_position_embeddings = 0;
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  bool llama3_rope_scaling = false;  // Llama 3.1: factor 8, low 1, high 4, original 8192
  bool qk_norm = false;              // Qwen3
  bool tie_word_embeddings = false;
  int32_t bos_token_id = 0;
  std::vector<int32_t> eos_token_ids;
  // Qwen3-MoE (num_experts > 0): every layer a MoE block of num_experts experts of
  // moe_intermediate_size, num_experts_per_tok routed per token, weights renormalized; the
  // checkpoint holds one tensor per expert (mlp.experts.E.{gate,up,down}_proj.weight) and the
  // router mlp.gate.weight [num_experts, hidden].
  int num_experts = 0;
  int num_experts_per_tok = 0;
  int moe_intermediate_size = 0;
  // GLM-4.5 (model_type "glm4_moe"): DeepSeek-V3's sigmoid router (n_group / topk_group groups,
  // mlp.gate.e_score_correction_bias, routed_scaling_factor), n_shared_experts shared experts
  // (mlp.shared_experts.*) of moe_intermediate_size each, the first first_k_dense_replace layers
  // dense (intermediate_size), q/k/v biases (attention_bias) and partial rotary.
  int n_shared_experts = 0;
  int first_k_dense_replace = 0;
  int n_group = 1;
  int topk_group = 1;
  double routed_scaling_factor = 1.0;
  double partial_rotary_factor = 1.0;
  bool attention_bias = false;
  // DeepSeek-V3 (mla.enabled()): head_dim is qk_rope_head_dim, num_kv_heads == num_heads, and
  // the experts above sit on layers from mla.first_k_dense_replace on.
  MlaShape mla = {};
};

// Known shapes: "llama-3.1-8b", "qwen3-8b", "qwen3-30b-a3b" (48 MoE layers of 128 experts,
// top-8), "deepseek-v3" (671 B: 61 layers, MLA, 3 dense layers then 256 experts top-8 and a
// shared expert; no MTP layer), "glm-4.5-air" (46 layers, the first dense, 128 experts of 1408
// top-8 and one shared, no tokenizer), "tiny" (Llama family, hidden 64, 2 layers, the Llama 3
// tokenizer and its full vocabulary, tied embeddings), "tiny-qwen3" (the same for Qwen3, with
// q/k norm), "tiny-qwen3-moe" (tiny-qwen3 with 8 experts of 32, top-2), "tiny-deepseek-v3"
// (deepseek-v3's layout at hidden 64, 4 layers, 8 experts in 4 groups) and "tiny-glm4-moe".
std::vector<std::string> KnownShapeNames();
// NotFound listing the known names for anything else.
absl::StatusOr<ModelShape> FindShape(const std::string& name);

// config.json text for the shape (transformers 4.x spelling: rope_theta, rope_scaling,
// torch_dtype).
// With `quant`, its quantization_config too.
std::string ConfigJson(const ModelShape& shape, DType dtype,
                       CheckpointQuant quant = CheckpointQuant::kNone);

// Tensor names and shapes of the checkpoint, in file order (embeddings, layer by layer, final
// norm, lm_head unless tied). The names are Hugging Face's.
struct CheckpointTensor {
  std::string name;
  std::vector<int64_t> shape;
  bool is_norm = false;  // filled with 1, else random
  // The stored parts of a quantized weight (quant_layout.h) have their own dtype and contents.
  enum class Fill {
    kValues,      // random normal(0, init_std) (or 1 for norms) in the dtype
    kRandomBits,  // uniformly random bytes (packed integer codes)
    kRandomE4m3,  // random float8_e4m3fn codes, never NaN
    kConstant,    // every element `constant` (scales)
    kInts,        // `ints` (I64)
  };
  Fill fill = Fill::kValues;
  std::optional<DType> dtype = std::nullopt;  // nullopt: the model's dtype
  float constant = 0;
  std::vector<int64_t> ints = {};
  int64_t NumElements() const;
};
// With `quant` the linear weights of the layers (attention incl. DeepSeek's kv_a_proj_with_mqa,
// dense MLPs, every expert and shared expert) are their quantized parts (quant_layout.h);
// routers, embeddings, norms and the lm_head stay in the model's dtype.
std::vector<CheckpointTensor> CheckpointTensors(const ModelShape& shape,
                                                CheckpointQuant quant = CheckpointQuant::kNone,
                                                double init_std = 0.02);
// Only what a stage holding layers [first_layer, last_layer) reads: those layers, the embedding
// when first_layer == 0, the final norm and lm_head when last_layer == shape.num_layers.
// Precondition: 0 <= first_layer < last_layer <= shape.num_layers.
std::vector<CheckpointTensor> CheckpointTensors(const ModelShape& shape, int first_layer,
                                                int last_layer,
                                                CheckpointQuant quant = CheckpointQuant::kNone,
                                                double init_std = 0.02);

struct RandomModelOptions {
  std::string output_dir;  // created if missing; existing model files in it are replaced
  ModelShape shape;
  DType dtype = DType::kBF16;
  uint64_t seed = 0;
  double init_std = 0.02;
  int64_t max_shard_bytes = int64_t{5} << 30;  // one file when the total fits
  int num_threads = 0;                         // 0 = hardware concurrency
  // Where "<tokenizer>/tokenizer.json" and "tokenizer_config.json" are; empty = do not copy.
  std::string tokenizers_dir;
  // Write only the tensors of layers [first_layer, last_layer) (CheckpointTensors' slice);
  // config.json still describes all shape.num_layers layers. last_layer 0: every layer.
  int first_layer = 0;
  int last_layer = 0;
  // Linear layers quantized in a hub layout (quant_layout.h): random codes with scales giving
  // weights of about init_std.
  CheckpointQuant quant = CheckpointQuant::kNone;
};

struct RandomModelResult {
  int64_t total_bytes = 0;         // tensor data
  std::vector<std::string> files;  // written safetensors files (names within output_dir)
  double seconds = 0;
};

// Writes the directory. Errors (I/O, missing tokenizer, bad options) name the path.
absl::StatusOr<RandomModelResult> WriteRandomModel(const RandomModelOptions& options);

}  // namespace ringserve
