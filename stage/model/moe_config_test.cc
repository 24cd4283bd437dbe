// The MoE fields of config.json: layer patterns, router options, attention variants, the keys
// refused, and what a MoE layer costs in weight memory.
#include <cmath>
#include <cstdlib>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "ring/model_config.h"
#include "ring/partition_by_cost.h"
#include "stage/model/slice_weights.h"

namespace ringserve {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

// Qwen3-30B-A3B's config.json as the hub has it.
Json Qwen3MoeA3B() {
  return Json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
    "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
    "num_experts": 128, "num_experts_per_tok": 8, "norm_topk_prob": true,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "num_hidden_layers": 48,
    "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
    "vocab_size": 151936, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0, "attention_bias": false, "tie_word_embeddings": false,
    "sliding_window": null, "use_sliding_window": false, "max_window_layers": 48,
    "hidden_act": "silu", "torch_dtype": "bfloat16", "bos_token_id": 151643,
    "eos_token_id": 151645})");
}

Json Glm45Air() {
  return Json::parse(R"({
    "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe",
    "hidden_size": 4096, "intermediate_size": 10944, "moe_intermediate_size": 1408,
    "n_routed_experts": 128, "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 1,
    "topk_group": 1, "routed_scaling_factor": 1.0, "norm_topk_prob": true,
    "first_k_dense_replace": 1, "num_hidden_layers": 46, "num_nextn_predict_layers": 1,
    "num_attention_heads": 96, "num_key_value_heads": 8, "head_dim": 128,
    "partial_rotary_factor": 0.5, "attention_bias": true, "use_qk_norm": false,
    "vocab_size": 151552, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
    "rope_theta": 1000000, "tie_word_embeddings": false, "hidden_act": "silu"})");
}

ModelConfig Parse(const Json& j) {
  auto config = ParseModelConfig(j.dump());
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : ModelConfig{};
}

void ExpectRefused(const Json& j, const std::string& key) {
  auto config = ParseModelConfig(j.dump());
  ASSERT_FALSE(config.ok()) << "accepted; expected an error naming " << key;
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(), HasSubstr(key));
}

TEST(MoeConfigTest, Qwen3MoeLayerPatternFollowsSparseStepAndMlpOnlyLayers) {
  ModelConfig c = Parse(Qwen3MoeA3B());
  EXPECT_EQ(c.moe.router.num_experts, 128);
  EXPECT_EQ(c.moe.router.top_k, 8);
  EXPECT_TRUE(c.moe.router.norm_topk_prob);
  EXPECT_EQ(c.moe.expert_intermediate_size, 768);
  EXPECT_TRUE(c.qk_norm);
  for (int layer = 0; layer < 48; ++layer) EXPECT_TRUE(c.moe.IsMoeLayer(layer)) << layer;

  Json j = Qwen3MoeA3B();
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3};
  c = Parse(j);
  EXPECT_FALSE(c.moe.IsMoeLayer(0));
  EXPECT_TRUE(c.moe.IsMoeLayer(1));
  EXPECT_FALSE(c.moe.IsMoeLayer(3));  // listed in mlp_only_layers
  EXPECT_TRUE(c.moe.IsMoeLayer(5));

  j = Qwen3MoeA3B();  // transformers 5 writes num_local_experts
  j.erase("num_experts");
  j["num_local_experts"] = 64;
  EXPECT_EQ(Parse(j).moe.router.num_experts, 64);
}

TEST(MoeConfigTest, Glm45UsesTheGroupedSigmoidRouterAndPartialRotary) {
  ModelConfig c = Parse(Glm45Air());
  EXPECT_EQ(c.moe.router.scoring, RouterScoring::kSigmoidGroupedTopK);
  EXPECT_TRUE(c.moe.correction_bias);
  EXPECT_EQ(c.moe.shared_intermediate_size, 1408);
  EXPECT_FALSE(c.moe.IsMoeLayer(0));  // first_k_dense_replace 1
  EXPECT_TRUE(c.moe.IsMoeLayer(1));
  EXPECT_EQ(c.rotary_dim, 64);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  EXPECT_EQ(RopeInverseFrequencies(c.rope, c.rotary_dim).size(), 32u);
}

TEST(MoeConfigTest, RefusesWhatItCannotHonourNamingTheKey) {
  Json j = Qwen3MoeA3B();
  j["mlp_only_layers"] = {48};
  ExpectRefused(j, "mlp_only_layers");
  j = Qwen3MoeA3B();
  j["partial_rotary_factor"] = 0.5;
  ExpectRefused(j, "partial_rotary_factor");
  j = Qwen3MoeA3B();
  j["num_experts_per_tok"] = 129;
  ExpectRefused(j, "num_experts_per_tok");
  j = Qwen3MoeA3B();
  j["quantization_config"] = {{"quant_method", "mxfp4"}};
  ExpectRefused(j, "quantization_config.quant_method \"mxfp4\"");

  j = Glm45Air();
  j["n_group"] = 3;
  ExpectRefused(j, "n_group");
  j = Glm45Air();
  j["topk_method"] = "greedy";
  ExpectRefused(j, "topk_method");
  j = Glm45Air();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  ExpectRefused(j, "yarn");
}

// The loaders list every expert's tensors before they read the router, so an expert count past
// kMaxExperts is refused by the config (2^30 experts took all memory building names), and one
// past 2^31 is not wrapped into range.
TEST(MoeConfigTest, RefusesExpertCountsPastTheLimit) {
  Json j = Qwen3MoeA3B();
  j["num_experts"] = int64_t{1} << 30;
  ExpectRefused(j, "num_experts 1073741824 exceeds the limit of 65536");
  j = Qwen3MoeA3B();
  j["num_experts"] = (int64_t{1} << 32) + 128;
  ExpectRefused(j, "num_experts 4294967424 exceeds the limit");
  j = Glm45Air();
  j["n_routed_experts"] = int64_t{1} << 30;
  ExpectRefused(j, "number of experts must be in [1, 65536], got 1073741824");
}

TEST(MoeConfigTest, GptOssSlidingLayersAndSinks) {
  Json j = Json::parse(R"({
    "architectures": ["GptOssForCausalLM"], "hidden_size": 2880, "intermediate_size": 2880,
    "num_hidden_layers": 4, "num_attention_heads": 64, "num_key_value_heads": 8,
    "head_dim": 64, "vocab_size": 201088, "max_position_embeddings": 131072,
    "num_local_experts": 32, "num_experts_per_tok": 4, "sliding_window": 128,
    "swiglu_limit": 7.0, "rope_theta": 150000,
    "layer_types": ["sliding_attention", "full_attention", "sliding_attention",
                    "full_attention"]})");
  ModelConfig c = Parse(j);
  EXPECT_TRUE(c.attention_sinks);
  EXPECT_TRUE(c.qkv_bias && c.o_bias);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);  // GptOssConfig's default
  // GptOssConfig defaults attention_bias to true; a file's false reaches the model (transformers
  // sets the file's keys after its own defaults).
  j["attention_bias"] = false;
  EXPECT_FALSE(Parse(j).qkv_bias);
  EXPECT_FALSE(Parse(j).o_bias);
  j.erase("attention_bias");
  EXPECT_EQ(c.SlidingWindowOf(0), 128);
  EXPECT_EQ(c.SlidingWindowOf(1), 0);
  EXPECT_EQ(c.moe.router.scoring, RouterScoring::kTopKSoftmax);
  EXPECT_EQ(c.moe.activation, ExpertActivation::kClampedSwiglu);
  // No rope parameters: GptOssConfig's YaRN (factor 32 over 4,096 positions, not truncated).
  EXPECT_EQ(c.rope.type, RopeType::kYarn);
  EXPECT_DOUBLE_EQ(c.rope.factor, 32.0);
  EXPECT_EQ(c.rope.original_max_position_embeddings, 4096);
  EXPECT_FALSE(c.rope.truncate);
  EXPECT_DOUBLE_EQ(c.rope.theta, 150000.0);
  const float factor = static_cast<float>(0.1 * std::log(32.0) + 1.0);
  EXPECT_FLOAT_EQ(c.score_factor, factor * factor);
  // Explicit parameters are taken as written.
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 150000.0}};
  c = Parse(j);
  EXPECT_EQ(c.rope.type, RopeType::kDefault);
  EXPECT_FLOAT_EQ(c.score_factor, 1.0f);
  j.erase("rope_parameters");

  j["layer_types"] = {"sliding_attention", "chunked_attention", "full_attention", "full_attention"};
  ExpectRefused(j, "chunked_attention");
  j["layer_types"] = {"sliding_attention", "full_attention"};
  ExpectRefused(j, "layer_types");
  j.erase("layer_types");  // transformers' default: even layers slide
  c = Parse(j);
  EXPECT_EQ(c.SlidingWindowOf(2), 128);
  EXPECT_EQ(c.SlidingWindowOf(3), 0);
  j["sliding_window"] = nullptr;
  ExpectRefused(j, "sliding_window");
}

// Qwen3-MoE with use_sliding_window: every layer slides (Qwen3MoeConfig has no
// max_window_layers or layer_types; its model masks all layers as Mixtral's does).
TEST(MoeConfigTest, Qwen3MoeSlidesOnEveryLayerWithUseSlidingWindow) {
  Json j = Qwen3MoeA3B();
  j["use_sliding_window"] = true;
  j["sliding_window"] = 4096;
  j["max_window_layers"] = 40;  // ignored, as transformers ignores it
  ModelConfig c = Parse(j);
  EXPECT_EQ(c.SlidingWindowOf(0), 4096);
  EXPECT_EQ(c.SlidingWindowOf(47), 4096);
  j["use_sliding_window"] = false;
  EXPECT_TRUE(Parse(j).sliding_layers.empty());
}

// Qwen2-MoE with use_sliding_window and no layer_types: Qwen2MoeConfig's rule, every other
// layer below max_window_layers from the first (not Qwen2's "from max_window_layers on").
TEST(MoeConfigTest, Qwen2MoeSlidesOnEvenLayersBelowMaxWindowLayers) {
  Json j = Qwen3MoeA3B();
  j["architectures"] = {"Qwen2MoeForCausalLM"};
  j["shared_expert_intermediate_size"] = 5632;
  j["num_hidden_layers"] = 6;
  j["use_sliding_window"] = true;
  j["sliding_window"] = 4096;
  j["max_window_layers"] = 4;
  ModelConfig c = Parse(j);
  const std::vector<int> expected = {4096, 0, 4096, 0, 0, 0};
  for (int layer = 0; layer < 6; ++layer) {
    EXPECT_EQ(c.SlidingWindowOf(layer), expected[layer]) << "layer " << layer;
  }
  j.erase("sliding_window");  // Qwen2MoeConfig's default window, 4096
  EXPECT_EQ(Parse(j).SlidingWindowOf(0), 4096);
}

// A file without the sliding_window key takes its config class's default; null is no window.
TEST(MoeConfigTest, AbsentSlidingWindowTakesTheConfigClassDefault) {
  Json gpt_oss = Json::parse(R"({
    "architectures": ["GptOssForCausalLM"], "hidden_size": 2880, "intermediate_size": 2880,
    "num_hidden_layers": 2, "num_attention_heads": 64, "num_key_value_heads": 8,
    "head_dim": 64, "vocab_size": 201088, "max_position_embeddings": 131072,
    "num_local_experts": 32, "num_experts_per_tok": 4, "swiglu_limit": 7.0})");
  EXPECT_EQ(Parse(gpt_oss).SlidingWindowOf(0), 128);
  Json mixtral = Qwen3MoeA3B();
  mixtral["architectures"] = {"MixtralForCausalLM"};
  mixtral["num_local_experts"] = 8;
  mixtral.erase("sliding_window");  // MixtralConfig: none
  EXPECT_TRUE(Parse(mixtral).sliding_layers.empty());
}

// A MoE layer's weight memory counts every expert: Qwen3-30B-A3B's layer holds 128 experts of
// 3 x 2048 x 768 plus attention and the router; a dense layer of the same model is far smaller.
TEST(MoeConfigTest, LayerWeightBytesCountEveryExpert) {
  Json j = Qwen3MoeA3B();
  j["mlp_only_layers"] = {0};
  ModelConfig c = Parse(j);
  const int64_t attention = (2048 * 4096 + 2 * 2048 * 512 + 4096 * 2048) + 2 * 128 + 2 * 2048;
  const int64_t experts = int64_t{128} * 3 * 2048 * 768;
  const int64_t router = 128 * 2048;
  EXPECT_EQ(LayerWeightBytes(c, 1, 2), 2 * (attention + experts + router));
  EXPECT_EQ(LayerWeightBytes(c, 0, 2), 2 * (attention + 3 * 2048 * 6144));
  EXPECT_NEAR(LayerWeightBytes(c, 1, 2) / 1e9, 1.246, 0.001);  // bf16 GB of one MoE layer
}

// DeepSeek-V3: a MoE layer (256 experts of 3 x 7168 x 2048, a shared one, the router and its
// correction bias, latent attention) holds 23.0 GB in bf16; a dense layer 1.17 GB.
TEST(MoeConfigTest, DeepseekV3LayerWeightBytes) {
  ModelConfig c = Parse(Json::parse(R"({
    "architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 7168, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
    "num_key_value_heads": 128, "vocab_size": 129280, "max_position_embeddings": 163840,
    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "n_routed_experts": 256, "num_experts_per_tok": 8, "n_group": 8,
    "topk_group": 4, "n_shared_experts": 1, "routed_scaling_factor": 2.5,
    "first_k_dense_replace": 3, "rope_theta": 10000})"));
  EXPECT_EQ(LayerWeightBytes(c, 3, 2), 23014572544);
  EXPECT_EQ(LayerWeightBytes(c, 2, 2), 1166966784);
}

// The coordinator's parameter count (ring/, from the config alone) and the checkpoint tensors a
// stage reads (slice_weights) agree on every layer of every fixture, dense and MoE.
TEST(MoeConfigTest, LayerParameterCountMatchesTheTensorsAStageReads) {
  const char* source = std::getenv("RINGSERVE_SOURCE_DIR");
  for (const char* arch :
       {"llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral", "qwen2_moe", "glm4_moe",
        "gpt_oss", "deepseek_v3", "deepseek_v3_nolora", "deepseek_v2", "deepseek_v3_moe",
        "deepseek_v2_moe", "deepseek_v2_moe_group"}) {
    SCOPED_TRACE(arch);
    auto config =
        LoadModelConfig(std::string(source ? source : ".") + "/tests/fixtures/models/" + arch);
    ASSERT_TRUE(config.ok()) << config.status();
    for (int layer = 0; layer < config->num_layers; ++layer) {
      EXPECT_EQ(LayerParameterCount(*config, layer) * 4, LayerWeightBytes(*config, layer, 4))
          << "layer " << layer;
    }
  }
}

}  // namespace
}  // namespace ringserve
