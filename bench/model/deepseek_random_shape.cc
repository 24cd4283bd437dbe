#include "bench/model/deepseek_random_shape.h"

#include "fmt/format.h"

namespace ringserve {

ModelShape DeepseekV3Shape(const std::string& name, bool tiny) {
  ModelShape s{.name = name,
               .architecture = "DeepseekV3ForCausalLM",
               .model_type = "deepseek_v3",
               .tokenizer = "deepseek_v3",
               .hidden_size = 7168,
               .intermediate_size = 18432,
               .num_layers = 61,
               .num_heads = 128,
               .num_kv_heads = 128,
               .head_dim = 64,
               .vocab_size = 129280,
               .max_position_embeddings = 163840,
               .rms_norm_eps = 1e-6,
               .rope_theta = 10000.0,
               .llama3_rope_scaling = false,
               .qk_norm = false,
               .tie_word_embeddings = false,
               .bos_token_id = 0,
               .eos_token_ids = {1},
               .num_experts = 256,
               .num_experts_per_tok = 8,
               .moe_intermediate_size = 2048,
               .mla = {.q_lora_rank = 1536,
                       .kv_lora_rank = 512,
                       .qk_nope_head_dim = 128,
                       .qk_rope_head_dim = 64,
                       .v_head_dim = 128,
                       .first_k_dense_replace = 3,
                       .n_shared_experts = 1,
                       .n_group = 8,
                       .topk_group = 4,
                       .routed_scaling_factor = 2.5,
                       .yarn_factor = 40,
                       .yarn_original_max_position_embeddings = 4096}};
  if (!tiny) return s;
  s.hidden_size = 64;
  s.intermediate_size = 128;
  s.num_layers = 4;
  s.num_heads = 4;
  s.num_kv_heads = 4;
  s.head_dim = 16;
  s.max_position_embeddings = 4096;
  s.num_experts = 8;
  s.num_experts_per_tok = 2;
  s.moe_intermediate_size = 32;
  s.mla = {.q_lora_rank = 32,
           .kv_lora_rank = 32,
           .qk_nope_head_dim = 16,
           .qk_rope_head_dim = 16,
           .v_head_dim = 16,
           .first_k_dense_replace = 1,
           .n_shared_experts = 1,
           .n_group = 4,
           .topk_group = 2,
           .routed_scaling_factor = 2.5,
           .yarn_factor = 4,
           .yarn_original_max_position_embeddings = 1024};
  return s;
}

void AddDeepseekConfig(const ModelShape& shape, nlohmann::ordered_json& config) {
  const MlaShape& m = shape.mla;
  if (m.q_lora_rank > 0) {
    config["q_lora_rank"] = m.q_lora_rank;
  } else {
    config["q_lora_rank"] = nullptr;
  }
  config["kv_lora_rank"] = m.kv_lora_rank;
  config["qk_nope_head_dim"] = m.qk_nope_head_dim;
  config["qk_rope_head_dim"] = m.qk_rope_head_dim;
  config["v_head_dim"] = m.v_head_dim;
  config["rope_interleave"] = true;
  config.erase("head_dim");  // DeepSeek's config has none (it is qk_rope_head_dim)
  if (m.yarn_factor > 0) {
    config["rope_scaling"] = {
        {"beta_fast", 32},
        {"beta_slow", 1},
        {"factor", m.yarn_factor},
        {"mscale", 1.0},
        {"mscale_all_dim", 1.0},
        {"original_max_position_embeddings", m.yarn_original_max_position_embeddings},
        {"type", "yarn"}};
  }
  config["first_k_dense_replace"] = m.first_k_dense_replace;
  config["moe_layer_freq"] = 1;
  config["n_routed_experts"] = shape.num_experts;
  config["num_experts_per_tok"] = shape.num_experts_per_tok;
  config["moe_intermediate_size"] = shape.moe_intermediate_size;
  config["n_shared_experts"] = m.n_shared_experts;
  config["n_group"] = m.n_group;
  config["topk_group"] = m.topk_group;
  config["routed_scaling_factor"] = m.routed_scaling_factor;
  config["norm_topk_prob"] = true;
  config["scoring_func"] = "sigmoid";
  config["topk_method"] = "noaux_tc";
  config["num_nextn_predict_layers"] = 0;  // no MTP layer is written
}

void AppendDeepseekLayerTensors(const ModelShape& shape, int layer,
                                std::vector<CheckpointTensor>& specs) {
  const MlaShape& m = shape.mla;
  const int64_t hidden = shape.hidden_size;
  const int64_t heads = shape.num_heads;
  const int64_t qk_head = m.qk_nope_head_dim + m.qk_rope_head_dim;
  const std::string p = fmt::format("model.layers.{}.", layer);
  specs.push_back({p + "input_layernorm.weight", {hidden}, true});
  if (m.q_lora_rank > 0) {
    specs.push_back({p + "self_attn.q_a_proj.weight", {m.q_lora_rank, hidden}, false});
    specs.push_back({p + "self_attn.q_a_layernorm.weight", {m.q_lora_rank}, true});
    specs.push_back({p + "self_attn.q_b_proj.weight", {heads * qk_head, m.q_lora_rank}, false});
  } else {
    specs.push_back({p + "self_attn.q_proj.weight", {heads * qk_head, hidden}, false});
  }
  specs.push_back({p + "self_attn.kv_a_proj_with_mqa.weight",
                   {m.kv_lora_rank + m.qk_rope_head_dim, hidden},
                   false});
  specs.push_back({p + "self_attn.kv_a_layernorm.weight", {m.kv_lora_rank}, true});
  specs.push_back({p + "self_attn.kv_b_proj.weight",
                   {heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank},
                   false});
  specs.push_back({p + "self_attn.o_proj.weight", {hidden, heads * m.v_head_dim}, false});
  specs.push_back({p + "post_attention_layernorm.weight", {hidden}, true});
  auto ffn = [&](const std::string& prefix, int64_t inter) {
    specs.push_back({prefix + "gate_proj.weight", {inter, hidden}, false});
    specs.push_back({prefix + "up_proj.weight", {inter, hidden}, false});
    specs.push_back({prefix + "down_proj.weight", {hidden, inter}, false});
  };
  if (layer < m.first_k_dense_replace) {
    ffn(p + "mlp.", shape.intermediate_size);
    return;
  }
  specs.push_back({p + "mlp.gate.weight", {shape.num_experts, hidden}, false});
  specs.push_back({p + "mlp.gate.e_score_correction_bias", {shape.num_experts}, false});
  for (int e = 0; e < shape.num_experts; ++e) {
    ffn(fmt::format("{}mlp.experts.{}.", p, e), shape.moe_intermediate_size);
  }
  if (m.n_shared_experts > 0) {
    ffn(p + "mlp.shared_experts.",
        static_cast<int64_t>(m.n_shared_experts) * shape.moe_intermediate_size);
  }
}

}  // namespace ringserve
