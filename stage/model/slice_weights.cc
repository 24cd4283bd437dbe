#include "stage/model/slice_weights.h"

#include "fmt/format.h"

namespace ringserve {

std::vector<TensorSpec> MlaAttentionTensorSpecs(const ModelConfig& c, int layer) {
  const std::string p = fmt::format("model.layers.{}.self_attn.", layer);
  const MlaConfig& m = *c.mla;
  const int64_t hidden = c.hidden_size;
  const int64_t heads = c.num_heads;
  std::vector<TensorSpec> specs;
  if (m.q_lora_rank > 0) {
    specs.push_back({p + "q_a_proj.weight", {m.q_lora_rank, hidden}, true});
    if (m.attention_bias) specs.push_back({p + "q_a_proj.bias", {m.q_lora_rank}});
    specs.push_back({p + "q_a_layernorm.weight", {m.q_lora_rank}});
    specs.push_back({p + "q_b_proj.weight", {heads * m.qk_head_dim(), m.q_lora_rank}, true});
  } else {
    specs.push_back({p + "q_proj.weight", {heads * m.qk_head_dim(), hidden}, true});
  }
  specs.push_back({p + "kv_a_proj_with_mqa.weight", {m.latent_cache_dim(), hidden}, true});
  if (m.attention_bias) specs.push_back({p + "kv_a_proj_with_mqa.bias", {m.latent_cache_dim()}});
  specs.push_back({p + "kv_a_layernorm.weight", {m.kv_lora_rank}});
  specs.push_back({p + "kv_b_proj.weight",
                   {heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank},
                   true});
  specs.push_back({p + "o_proj.weight", {hidden, heads * m.v_head_dim}, true});
  if (m.attention_bias) specs.push_back({p + "o_proj.bias", {hidden}});
  return specs;
}

std::vector<TensorSpec> LayerTensorSpecs(const ModelConfig& c, int layer) {
  const std::string p = fmt::format("model.layers.{}.", layer);
  if (c.mla) {
    std::vector<TensorSpec> specs = {{p + "input_layernorm.weight", {c.hidden_size}}};
    for (TensorSpec& spec : MlaAttentionTensorSpecs(c, layer)) specs.push_back(std::move(spec));
    specs.push_back({p + "post_attention_layernorm.weight", {c.hidden_size}});
    if (c.moe.IsMoeLayer(layer)) {
      for (TensorSpec& spec : MoeLayerTensorSpecs(c, layer).All()) specs.push_back(std::move(spec));
      return specs;
    }
    for (const char* name : {"gate_proj", "up_proj"}) {
      specs.push_back(
          {fmt::format("{}mlp.{}.weight", p, name), {c.intermediate_size, c.hidden_size}, true});
    }
    specs.push_back({p + "mlp.down_proj.weight", {c.hidden_size, c.intermediate_size}, true});
    return specs;
  }
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
  if (c.attention_sinks) specs.push_back({p + "self_attn.sinks", {c.num_heads}});
  specs.push_back({p + "post_attention_layernorm.weight", {hidden}});
  if (c.moe.IsMoeLayer(layer)) {
    for (TensorSpec& spec : MoeLayerTensorSpecs(c, layer).All()) specs.push_back(std::move(spec));
    return specs;
  }
  specs.push_back({p + "mlp.gate_proj.weight", {inter, hidden}, true});
  specs.push_back({p + "mlp.up_proj.weight", {inter, hidden}, true});
  specs.push_back({p + "mlp.down_proj.weight", {hidden, inter}, true});
  return specs;
}

MoeTensorSpecs MoeLayerTensorSpecs(const ModelConfig& c, int layer) {
  const MoeConfig& m = c.moe;
  const int64_t hidden = c.hidden_size;
  const int64_t e = m.router.num_experts;
  const int64_t inter = m.expert_intermediate_size;
  const bool mixtral = m.layout == ExpertLayout::kMixtral;
  const std::string p =
      fmt::format("model.layers.{}.{}", layer, mixtral ? "block_sparse_moe." : "mlp.");
  MoeTensorSpecs s;
  const std::string router = m.layout == ExpertLayout::kGptOssStacked ? "router." : "gate.";
  s.router = {p + router + "weight", {e, hidden}};
  if (m.router_bias) s.router_bias = TensorSpec{p + router + "bias", {e}};
  if (m.correction_bias) s.correction_bias = TensorSpec{p + "gate.e_score_correction_bias", {e}};
  if (m.layout == ExpertLayout::kGptOssStacked) {
    s.gate_up = TensorSpec{.name = p + "experts.gate_up_proj",
                           .shape = {e, hidden, 2 * inter},
                           .linear = false,
                           .stacked_experts = true};
    s.gate_up_bias = TensorSpec{p + "experts.gate_up_proj_bias", {e, 2 * inter}};
    s.stacked_down = TensorSpec{.name = p + "experts.down_proj",
                                .shape = {e, inter, hidden},
                                .linear = false,
                                .stacked_experts = true};
    s.down_bias = TensorSpec{p + "experts.down_proj_bias", {e, hidden}};
  } else {
    for (int64_t x = 0; x < e; ++x) {
      const std::string ep = fmt::format("{}experts.{}.", p, x);
      s.gate.push_back({ep + (mixtral ? "w1.weight" : "gate_proj.weight"), {inter, hidden}, true});
      s.up.push_back({ep + (mixtral ? "w3.weight" : "up_proj.weight"), {inter, hidden}, true});
      s.down.push_back({ep + (mixtral ? "w2.weight" : "down_proj.weight"), {hidden, inter}, true});
    }
  }
  if (m.shared_intermediate_size > 0) {
    const int64_t shared = m.shared_intermediate_size;
    // Qwen2-MoE names one "shared_expert"; GLM-4.5 (DeepSeek) "shared_experts".
    const std::string sp = p + (m.shared_expert_gate ? "shared_expert." : "shared_experts.");
    s.shared_gate = TensorSpec{sp + "gate_proj.weight", {shared, hidden}, true};
    s.shared_up = TensorSpec{sp + "up_proj.weight", {shared, hidden}, true};
    s.shared_down = TensorSpec{sp + "down_proj.weight", {hidden, shared}, true};
    if (m.shared_expert_gate) {
      s.shared_expert_gate = TensorSpec{p + "shared_expert_gate.weight", {1, hidden}};
    }
  }
  return s;
}

std::vector<TensorSpec> MoeTensorSpecs::All() const {
  std::vector<TensorSpec> all = {router};
  for (const auto* spec : {&router_bias, &correction_bias}) {
    if (*spec) all.push_back(**spec);
  }
  for (size_t x = 0; x < gate.size(); ++x) {
    all.push_back(gate[x]);
    all.push_back(up[x]);
    all.push_back(down[x]);
  }
  for (const auto* spec : {&gate_up, &gate_up_bias, &stacked_down, &down_bias, &shared_gate,
                           &shared_up, &shared_down, &shared_expert_gate}) {
    if (*spec) all.push_back(**spec);
  }
  return all;
}

int64_t TensorBytes(const std::vector<TensorSpec>& specs, int64_t bytes_per_value) {
  int64_t total = 0;
  for (const TensorSpec& spec : specs) {
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    total += n * bytes_per_value;
  }
  return total;
}

int64_t LayerWeightBytes(const ModelConfig& config, int layer, int64_t bytes_per_value) {
  return TensorBytes(LayerTensorSpecs(config, layer), bytes_per_value);
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
