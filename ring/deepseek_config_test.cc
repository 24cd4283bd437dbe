// DeepSeek-V2/V3 config.json: the MLA fields, YaRN and what is refused.
#include "ring/deepseek_config.h"

#include <cmath>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "ring/model_config.h"

namespace ringserve {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

absl::StatusOr<ModelConfig> Parse(const Json& j) { return ParseModelConfig(j.dump(), "test.json"); }

void ExpectRefused(const Json& j, const std::string& message) {
  auto config = Parse(j);
  ASSERT_FALSE(config.ok()) << j.dump();
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(config.status().message()), HasSubstr(message));
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("test.json"));
}

// DeepSeek-V3's published config.json (MLA and YaRN fields), with every layer dense.
Json DeepseekV3Json() {
  return Json::parse(R"({
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
    "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
    "vocab_size": 129280, "max_position_embeddings": 163840, "rms_norm_eps": 1e-6,
    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "n_routed_experts": 256, "first_k_dense_replace": 61,
    "moe_layer_freq": 1, "num_nextn_predict_layers": 1, "hidden_act": "silu",
    "rope_theta": 10000, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40,
      "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
      "type": "yarn"},
    "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "bfloat16"
  })");
}

TEST(DeepseekConfigTest, ParsesDeepseekV3Attention) {
  auto config = Parse(DeepseekV3Json());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->architecture, Architecture::kDeepseekV3);
  ASSERT_TRUE(config->mla.has_value());
  const MlaConfig& m = *config->mla;
  EXPECT_EQ(m.q_lora_rank, 1536);
  EXPECT_EQ(m.kv_lora_rank, 512);
  EXPECT_EQ(m.qk_head_dim(), 192);
  EXPECT_EQ(m.v_head_dim, 128);
  EXPECT_TRUE(m.rope_interleave);  // V3's default
  EXPECT_FALSE(m.attention_bias);
  EXPECT_EQ(m.num_nextn_predict_layers, 1);
  EXPECT_EQ(config->head_dim, 64);  // the rope key's width
  EXPECT_EQ(config->num_kv_heads, 128);
  // 576 values per token and layer: 1,152 bytes in bf16, against 40,960 values for the heads.
  EXPECT_EQ(config->kv_values_per_token_layer(), 576);
  EXPECT_EQ(config->rope.type, RopeType::kYarn);
  EXPECT_EQ(config->rope.original_max_position_embeddings, 4096);
  const double mscale = 0.1 * std::log(40.0) + 1.0;
  EXPECT_NEAR(m.softmax_scale, mscale * mscale / std::sqrt(192.0), 1e-12);
  EXPECT_DOUBLE_EQ(m.rope_attention_factor, 1.0);  // mscale == mscale_all_dim
}

TEST(DeepseekConfigTest, V2WithoutQLowRankAndDifferentMscales) {
  Json j = DeepseekV3Json();
  j["architectures"] = {"DeepseekV2ForCausalLM"};
  j["q_lora_rank"] = nullptr;
  j["rope_interleave"] = false;  // V2 always rotates (2i, 2i+1) pairs
  j["rope_scaling"]["mscale"] = 0.707;
  j.erase("first_k_dense_replace");  // V2's default is 0: every layer MoE ...
  j["n_routed_experts"] = 0;         // ... unless there are no experts
  auto config = Parse(j);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->mla->q_lora_rank, 0);
  EXPECT_TRUE(config->mla->rope_interleave);
  j.erase("q_lora_rank");  // absent: the config classes' default, 1536
  EXPECT_EQ(Parse(j)->mla->q_lora_rank, 1536);
  EXPECT_NEAR(config->mla->rope_attention_factor,
              (0.1 * 0.707 * std::log(40.0) + 1) / (0.1 * std::log(40.0) + 1), 1e-12);
}

TEST(DeepseekConfigTest, V3MoeLayersUseTheGroupedSigmoidRouter) {
  Json j = DeepseekV3Json();  // the published MoE fields
  j["first_k_dense_replace"] = 3;
  j.update(Json::parse(R"({"num_experts_per_tok": 8, "n_group": 8, "topk_group": 4,
    "n_shared_experts": 1, "routed_scaling_factor": 2.5, "norm_topk_prob": true,
    "scoring_func": "sigmoid", "topk_method": "noaux_tc"})"));
  auto config = Parse(j);
  ASSERT_TRUE(config.ok()) << config.status();
  const MoeConfig& m = config->moe;
  EXPECT_EQ(m.router.scoring, RouterScoring::kSigmoidGroupedTopK);
  EXPECT_EQ(m.router.num_experts, 256);
  EXPECT_EQ(m.router.top_k, 8);
  EXPECT_EQ(m.router.n_group, 8);
  EXPECT_EQ(m.router.topk_group, 4);
  EXPECT_FLOAT_EQ(m.router.routed_scaling_factor, 2.5f);
  EXPECT_TRUE(m.router.norm_topk_prob);
  EXPECT_TRUE(m.correction_bias);
  EXPECT_EQ(m.expert_intermediate_size, 2048);
  EXPECT_EQ(m.shared_intermediate_size, 2048);
  for (int layer = 0; layer < 61; ++layer) EXPECT_EQ(m.IsMoeLayer(layer), layer >= 3) << layer;
  j.erase("first_k_dense_replace");  // V3's default is 3 as well
  EXPECT_TRUE(Parse(j)->moe.IsMoeLayer(3));
  EXPECT_FALSE(Parse(j)->moe.IsMoeLayer(2));
  // Without the routing keys: DeepseekV3Config's defaults (8 groups, best 4, scale 2.5).
  for (const char* key : {"n_group", "topk_group", "routed_scaling_factor"}) j.erase(key);
  config = Parse(j);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->moe.router.n_group, 8);
  EXPECT_EQ(config->moe.router.topk_group, 4);
  EXPECT_FLOAT_EQ(config->moe.router.routed_scaling_factor, 2.5f);
}

// DeepSeek-V2-Lite's published MoE fields.
Json DeepseekV2LiteJson() {
  Json j = DeepseekV3Json();
  j["architectures"] = {"DeepseekV2ForCausalLM"};
  j["q_lora_rank"] = nullptr;
  j.update(Json::parse(R"({"num_hidden_layers": 27, "first_k_dense_replace": 1,
    "n_routed_experts": 64, "num_experts_per_tok": 6, "moe_intermediate_size": 1408,
    "n_shared_experts": 2, "routed_scaling_factor": 1.0, "norm_topk_prob": false,
    "scoring_func": "softmax", "topk_method": "greedy", "n_group": 1, "topk_group": 1})"));
  return j;
}

TEST(DeepseekConfigTest, V2MoeLayersUseSoftmaxGreedyOrGroupLimitedRouting) {
  auto config = Parse(DeepseekV2LiteJson());
  ASSERT_TRUE(config.ok()) << config.status();
  const MoeConfig& m = config->moe;
  EXPECT_EQ(m.router.scoring, RouterScoring::kSoftmaxTopK);
  EXPECT_EQ(m.router.num_experts, 64);
  EXPECT_EQ(m.router.top_k, 6);
  EXPECT_FALSE(m.router.norm_topk_prob);
  EXPECT_EQ(m.router.topk_group, m.router.n_group);  // greedy: every group
  EXPECT_FALSE(m.correction_bias);
  EXPECT_EQ(m.shared_intermediate_size, 2 * 1408);
  EXPECT_FALSE(m.IsMoeLayer(0));
  EXPECT_TRUE(m.IsMoeLayer(26));

  Json group = DeepseekV2LiteJson();  // DeepSeek-V2's (non-Lite) routing
  group.update(Json::parse(R"({"topk_method": "group_limited_greedy", "n_group": 8,
    "topk_group": 3, "routed_scaling_factor": 16.0})"));
  config = Parse(group);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->moe.router.n_group, 8);
  EXPECT_EQ(config->moe.router.topk_group, 3);
  EXPECT_FLOAT_EQ(config->moe.router.routed_scaling_factor, 16.0f);

  Json no_shared = DeepseekV2LiteJson();
  no_shared["n_shared_experts"] = nullptr;
  EXPECT_EQ(Parse(no_shared)->moe.shared_intermediate_size, 0);
}

TEST(DeepseekConfigTest, RefusesMoeRoutingItDoesNotImplement) {
  Json method = DeepseekV2LiteJson();
  method["topk_method"] = "noaux_tc";
  ExpectRefused(method, "unsupported topk_method \"noaux_tc\" for DeepseekV2ForCausalLM");
  Json norm = DeepseekV2LiteJson();  // transformers' DeepseekV2 never reads it
  norm["norm_topk_prob"] = true;
  ASSERT_TRUE(Parse(norm).ok()) << Parse(norm).status();
  EXPECT_FALSE(Parse(norm)->moe.router.norm_topk_prob);
  Json scoring = DeepseekV2LiteJson();
  scoring["scoring_func"] = "sigmoid";
  ExpectRefused(scoring, "scoring_func \"sigmoid\"");
  Json groups = DeepseekV2LiteJson();
  groups["topk_method"] = "group_limited_greedy";
  groups.erase("n_group");
  ExpectRefused(groups, "\"n_group\"");
  Json v3 = DeepseekV3Json();
  v3["first_k_dense_replace"] = 3;
  v3["num_experts_per_tok"] = 8;
  v3["topk_method"] = "greedy";
  ExpectRefused(v3, "topk_method \"greedy\"");
  Json quantized = DeepseekV3Json();  // quantized experts: dequantized at load
  quantized["first_k_dense_replace"] = 3;
  quantized["num_experts_per_tok"] = 8;
  quantized["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}};
  EXPECT_TRUE(Parse(quantized).ok()) << Parse(quantized).status();
  Json mxfp4 = DeepseekV2LiteJson();
  mxfp4["quantization_config"] = {{"quant_method", "mxfp4"}};
  ExpectRefused(mxfp4, "quant_method \"mxfp4\"");
  Json dense_quantized = DeepseekV3Json();  // dense layers only: dequantized at load
  dense_quantized["quantization_config"] = {{"quant_method", "fp8"},
                                            {"weight_block_size", {128, 128}}};
  EXPECT_TRUE(Parse(dense_quantized).ok()) << Parse(dense_quantized).status();
}

TEST(DeepseekConfigTest, RefusesWhatItDoesNotImplement) {
  Json freq = DeepseekV3Json();
  freq["moe_layer_freq"] = 2;
  ExpectRefused(freq, "moe_layer_freq 2");
  Json kv_heads = DeepseekV3Json();
  kv_heads["num_key_value_heads"] = 8;
  ExpectRefused(kv_heads, "num_key_value_heads 8");
  Json head_dim = DeepseekV3Json();
  head_dim["head_dim"] = 128;
  ExpectRefused(head_dim, "head_dim 128 != qk_rope_head_dim 64");
  Json missing = DeepseekV3Json();
  missing.erase("kv_lora_rank");
  ExpectRefused(missing, "\"kv_lora_rank\"");
  Json odd = DeepseekV3Json();
  odd["qk_rope_head_dim"] = 63;
  ExpectRefused(odd, "qk_rope_head_dim must be even");
  Json linear = DeepseekV3Json();
  linear["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  ExpectRefused(linear, "rope type for DeepSeek");
  Json sliding = DeepseekV3Json();
  sliding["sliding_window"] = 64;
  sliding["layer_types"] = Json::array();
  for (int layer = 0; layer < sliding["num_hidden_layers"].get<int>(); ++layer) {
    sliding["layer_types"].push_back("sliding_attention");
  }
  ExpectRefused(sliding, "latent attention has no sliding window");
}

TEST(DeepseekConfigTest, YarnRampBlendsInterpolatedAndExtrapolatedFrequencies) {
  RopeConfig rope;
  rope.type = RopeType::kYarn;
  rope.factor = 4.0;
  rope.original_max_position_embeddings = 32;
  const std::vector<float> plain = RopeInverseFrequencies(RopeConfig{}, 16);
  const std::vector<float> yarn = RopeInverseFrequencies(rope, 16);
  ASSERT_EQ(yarn.size(), 8u);
  // Correction range [0, 2] for beta 32/1 over 32 positions: pair 0 extrapolated, pair 1 half
  // way, pairs 2.. interpolated (divided by the factor).
  EXPECT_FLOAT_EQ(yarn[0], plain[0]);
  EXPECT_NEAR(yarn[1], 0.5f * plain[1] + 0.5f * plain[1] / 4, 1e-7f);
  for (int i = 2; i < 8; ++i) EXPECT_NEAR(yarn[i], plain[i] / 4, 1e-9f) << i;
  rope.truncate = false;  // an unrounded range moves the blend
  EXPECT_NE(RopeInverseFrequencies(rope, 16)[1], yarn[1]);
}

}  // namespace
}  // namespace ringserve
