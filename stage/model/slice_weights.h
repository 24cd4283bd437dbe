// Which checkpoint tensors a model slice needs, with Hugging Face names and expected shapes.
// Shared by the CPU slice and the CUDA weight loader so both read exactly the same tensors.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ring/model_config.h"
#include "stage/model/model_slice.h"
#include "stage/model/safetensors.h"

namespace ringserve {

struct TensorSpec {
  std::string name;  // checkpoint tensor name, e.g. "model.layers.3.self_attn.q_proj.weight"
  std::vector<int64_t> shape;
  // A linear layer's weight [out_features, in_features] (the *_proj weights and a separate
  // lm_head): what a quantized checkpoint may store quantized (stage/model/quantized_weights.h).
  bool linear = false;
  // gpt-oss's stacked expert tensor [E, in, out] (mlp.experts.gate_up_proj / down_proj): what
  // quant_method mxfp4 stores as `name`_blocks / `name`_scales (stage/model/quantized_weights.h).
  bool stacked_experts = false;
};

// The per-layer tensor name suffixes (after "model.layers.<i>."), in load order, as `config`
// needs them: input_layernorm.weight, self_attn.{q,k,v}_proj.{weight[,bias]},
// [self_attn.{q,k}_norm.weight], self_attn.o_proj.{weight[,bias]}, [self_attn.sinks],
// post_attention_layernorm.weight, then either the dense mlp.{gate,up,down}_proj.weight
// (intermediate_size) or, on a MoE layer, MoeLayerTensorSpecs(config, layer).All(). Linear
// weights are [out_features, in_features]. With MLA (config.mla) the attention tensors are
// MlaAttentionTensorSpecs' instead.
std::vector<TensorSpec> LayerTensorSpecs(const ModelConfig& config, int layer);

// The multi-head latent attention tensors of `layer` (config.mla required), hub names
// "model.layers.<layer>.self_attn.*": q_a_proj.weight [q_lora_rank, hidden] (+ bias),
// q_a_layernorm.weight, q_b_proj.weight [heads * qk_head_dim, q_lora_rank] -- or q_proj.weight
// [heads * qk_head_dim, hidden] without q low-rank --, kv_a_proj_with_mqa.weight
// [kv_lora_rank + qk_rope_head_dim, hidden] (+ bias), kv_a_layernorm.weight [kv_lora_rank],
// kv_b_proj.weight [heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank], o_proj.weight
// [hidden, heads * v_head_dim] (+ bias). Biases when mla->attention_bias.
std::vector<TensorSpec> MlaAttentionTensorSpecs(const ModelConfig& config, int layer);

// A MoE layer's tensors under the hub names of config.moe.layout (see ExpertLayout).
struct MoeTensorSpecs {
  TensorSpec router;                          // [E, hidden]
  std::optional<TensorSpec> router_bias;      // [E] (gpt-oss)
  std::optional<TensorSpec> correction_bias;  // [E] (e_score_correction_bias)
  // kPerExpert / kMixtral, one entry per expert: gate and up [inter, hidden], down [hidden, inter].
  // These and the shared experts are linear weights (TensorSpec::linear): a quantized checkpoint
  // may store them quantized. The router, its biases and the shared expert gate are not.
  std::vector<TensorSpec> gate, up, down;
  // kGptOssStacked: gate_up [E, hidden, 2 * inter], gate_up_bias [E, 2 * inter],
  // down [E, inter, hidden], down_bias [E, hidden]. gate_up and down are stacked_experts.
  std::optional<TensorSpec> gate_up, gate_up_bias, stacked_down, down_bias;
  // Shared experts (shared_intermediate_size > 0) and Qwen2-MoE's gate [1, hidden].
  std::optional<TensorSpec> shared_gate, shared_up, shared_down, shared_expert_gate;

  // Every tensor above, in this order.
  std::vector<TensorSpec> All() const;
};
// Precondition: config.moe.IsMoeLayer(layer).
MoeTensorSpecs MoeLayerTensorSpecs(const ModelConfig& config, int layer);

// Bytes of layer `layer`'s tensors (LayerTensorSpecs) at `bytes_per_value`: on a MoE layer every
// expert, shared expert and router; what the layer costs a stage in weight memory.
int64_t LayerWeightBytes(const ModelConfig& config, int layer, int64_t bytes_per_value);

// Bytes the checkpoint tensors of `specs` take at `bytes_per_value` (e.g. 2 for bf16): what a
// stage holding them needs for weights. Counts every expert.
int64_t TensorBytes(const std::vector<TensorSpec>& specs, int64_t bytes_per_value);

// "model.embed_tokens.weight" [vocab, hidden].
TensorSpec EmbeddingSpec(const ModelConfig& config);
// "model.norm.weight" [hidden].
TensorSpec FinalNormSpec(const ModelConfig& config);
// The lm_head [vocab, hidden]: "lm_head.weight" when the checkpoint has it; otherwise, when the
// config ties embeddings, "model.embed_tokens.weight"; otherwise "lm_head.weight" (which then
// fails to load with NotFound).
TensorSpec LmHeadSpec(const ModelConfig& config, const SafetensorsModel& weights);

// Everything the slice `layers` reads: the embedding if layers.first == 0, the layers' tensors,
// and the final norm and lm_head if layers.last == config.num_layers.
std::vector<TensorSpec> SliceTensorSpecs(const ModelConfig& config, LayerRange layers,
                                         const SafetensorsModel& weights);

}  // namespace ringserve
