// Which checkpoint tensors a model slice needs, with Hugging Face names and expected shapes.
// Shared by the CPU slice and the CUDA weight loader so both read exactly the same tensors.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ring/model_config.h"
#include "stage/model/model_slice.h"
#include "stage/model/safetensors.h"

namespace ringserve {

struct TensorSpec {
  std::string name;  // checkpoint tensor name, e.g. "model.layers.3.self_attn.q_proj.weight"
  std::vector<int64_t> shape;
};

// The per-layer tensor name suffixes (after "model.layers.<i>."), in load order, as `config`
// needs them: input_layernorm.weight, self_attn.{q,k,v}_proj.{weight[,bias]},
// [self_attn.{q,k}_norm.weight], self_attn.o_proj.{weight[,bias]}, post_attention_layernorm.weight,
// mlp.{gate,up,down}_proj.weight. Linear weights are [out_features, in_features].
std::vector<TensorSpec> LayerTensorSpecs(const ModelConfig& config, int layer);

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
