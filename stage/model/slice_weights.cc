#include "stage/model/slice_weights.h"

#include "fmt/format.h"

namespace ringserve {

std::vector<TensorSpec> LayerTensorSpecs(const ModelConfig& c, int layer) {
  const std::string p = fmt::format("model.layers.{}.", layer);
  const int64_t hidden = c.hidden_size;
  const int64_t q = c.q_size();
  const int64_t kv = c.kv_size();
  const int64_t inter = c.intermediate_size;
  std::vector<TensorSpec> specs;
  specs.push_back({p + "input_layernorm.weight", {hidden}});
  specs.push_back({p + "self_attn.q_proj.weight", {q, hidden}, true});
  if (c.qkv_bias) specs.push_back({p + "self_attn.q_proj.bias", {q}});
  specs.push_back({p + "self_attn.k_proj.weight", {kv, hidden}, true});
  if (c.qkv_bias) specs.push_back({p + "self_attn.k_proj.bias", {kv}});
  specs.push_back({p + "self_attn.v_proj.weight", {kv, hidden}, true});
  if (c.qkv_bias) specs.push_back({p + "self_attn.v_proj.bias", {kv}});
  if (c.qk_norm) {
    specs.push_back({p + "self_attn.q_norm.weight", {c.head_dim}});
    specs.push_back({p + "self_attn.k_norm.weight", {c.head_dim}});
  }
  specs.push_back({p + "self_attn.o_proj.weight", {hidden, q}, true});
  if (c.o_bias) specs.push_back({p + "self_attn.o_proj.bias", {hidden}});
  specs.push_back({p + "post_attention_layernorm.weight", {hidden}});
  specs.push_back({p + "mlp.gate_proj.weight", {inter, hidden}, true});
  specs.push_back({p + "mlp.up_proj.weight", {inter, hidden}, true});
  specs.push_back({p + "mlp.down_proj.weight", {hidden, inter}, true});
  return specs;
}

TensorSpec EmbeddingSpec(const ModelConfig& c) {
  return {"model.embed_tokens.weight", {c.vocab_size, c.hidden_size}};
}

TensorSpec FinalNormSpec(const ModelConfig& c) { return {"model.norm.weight", {c.hidden_size}}; }

TensorSpec LmHeadSpec(const ModelConfig& c, const SafetensorsModel& weights) {
  if (!weights.Contains("lm_head.weight") && c.tie_word_embeddings) return EmbeddingSpec(c);
  return {"lm_head.weight", {c.vocab_size, c.hidden_size}, true};
}

std::vector<TensorSpec> SliceTensorSpecs(const ModelConfig& c, LayerRange layers,
                                         const SafetensorsModel& weights) {
  std::vector<TensorSpec> specs;
  if (layers.first == 0) specs.push_back(EmbeddingSpec(c));
  for (int layer = layers.first; layer < layers.last; ++layer) {
    for (TensorSpec& spec : LayerTensorSpecs(c, layer)) specs.push_back(std::move(spec));
  }
  if (layers.last == c.num_layers) {
    specs.push_back(FinalNormSpec(c));
    specs.push_back(LmHeadSpec(c, weights));
  }
  return specs;
}

}  // namespace ringserve
