#include "ring/model_config.h"

#include <cmath>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ringserve {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

Json LlamaJson() {
  return Json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100,
    "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "hidden_act": "silu",
    "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16"
  })");
}

absl::StatusOr<ModelConfig> Parse(const Json& j) { return ParseModelConfig(j.dump(), "test.json"); }

void ExpectRefused(const Json& j, const std::string& message) {
  auto config = Parse(j);
  ASSERT_FALSE(config.ok()) << j.dump();
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(config.status().message()), HasSubstr(message));
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("test.json"));
}

TEST(ModelConfigTest, ParsesLlamaWithDefaults) {
  auto config = Parse(LlamaJson());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->architecture, Architecture::kLlama);
  EXPECT_EQ(config->hidden_size, 64);
  EXPECT_EQ(config->num_layers, 2);
  EXPECT_EQ(config->num_heads, 4);
  EXPECT_EQ(config->num_kv_heads, 2);
  EXPECT_EQ(config->head_dim, 16);  // hidden / heads
  EXPECT_FLOAT_EQ(config->rms_norm_eps, 1e-5f);
  EXPECT_EQ(config->rope.type, RopeType::kDefault);
  EXPECT_DOUBLE_EQ(config->rope.theta, 10000.0);
  EXPECT_FALSE(config->qkv_bias);
  EXPECT_FALSE(config->o_bias);
  EXPECT_FALSE(config->qk_norm);
  EXPECT_FALSE(config->tie_word_embeddings);
  EXPECT_EQ(config->bos_token_id, 1);
  EXPECT_EQ(config->eos_token_ids, std::vector<int32_t>{2});
  EXPECT_EQ(config->dtype, DType::kBF16);
}

TEST(ModelConfigTest, KvHeadsDefaultToHeadsAndExplicitHeadDimWins) {
  Json j = LlamaJson();
  j.erase("num_key_value_heads");
  j["head_dim"] = 32;
  auto config = Parse(j);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->num_kv_heads, 4);
  EXPECT_EQ(config->head_dim, 32);
  EXPECT_EQ(config->q_size(), 128);
}

TEST(ModelConfigTest, Llama3RopeOldSpelling) {
  Json j = LlamaJson();
  j["rope_theta"] = 500000.0;
  j["rope_scaling"] = {{"rope_type", "llama3"},
                       {"factor", 8.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  auto config = Parse(j);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rope.type, RopeType::kLlama3);
  EXPECT_DOUBLE_EQ(config->rope.theta, 500000.0);
  EXPECT_DOUBLE_EQ(config->rope.factor, 8.0);
  EXPECT_DOUBLE_EQ(config->rope.high_freq_factor, 4.0);
  EXPECT_EQ(config->rope.original_max_position_embeddings, 8192);
  // Very old files say "type" instead of "rope_type".
  j["rope_scaling"].erase("rope_type");
  j["rope_scaling"]["type"] = "llama3";
  config = Parse(j);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rope.type, RopeType::kLlama3);
  // Without original_max_position_embeddings, transformers takes max_position_embeddings.
  j["rope_scaling"].erase("original_max_position_embeddings");
  config = Parse(j);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rope.original_max_position_embeddings, 256);
}

TEST(ModelConfigTest, Llama3RopeTransformers5Spelling) {
  Json j = LlamaJson();
  j["rope_parameters"] = {{"rope_type", "llama3"},   {"rope_theta", 500000.0},
                          {"factor", 32.0},          {"low_freq_factor", 1.0},
                          {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  auto config = Parse(j);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rope.type, RopeType::kLlama3);
  EXPECT_DOUBLE_EQ(config->rope.theta, 500000.0);
  EXPECT_DOUBLE_EQ(config->rope.factor, 32.0);
  // Default type with theta only inside rope_parameters.
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1000000.0}};
  config = Parse(j);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rope.type, RopeType::kDefault);
  EXPECT_DOUBLE_EQ(config->rope.theta, 1000000.0);
  // With both spellings, rope_scaling wins (transformers 5: `rope_scaling or rope_parameters`).
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  config = Parse(j);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rope.type, RopeType::kLinear);
}

TEST(ModelConfigTest, LinearRopeScalesFrequencies) {
  Json j = LlamaJson();
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 4.0}};
  auto config = Parse(j);
  ASSERT_TRUE(config.ok()) << config.status();
  const auto scaled = RopeInverseFrequencies(config->rope, 16);
  config->rope.type = RopeType::kDefault;
  const auto plain = RopeInverseFrequencies(config->rope, 16);
  ASSERT_EQ(scaled.size(), 8u);
  for (size_t i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(scaled[i], plain[i] / 4);
}

TEST(ModelConfigTest, YarnOnOrdinaryAttentionScalesTheScoresBySquaredAttentionFactor) {
  Json j = LlamaJson();
  j["rope_parameters"] = {{"rope_type", "yarn"},
                          {"rope_theta", 10000.0},
                          {"factor", 4.0},
                          {"original_max_position_embeddings", 64}};
  auto config = Parse(j);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rope.type, RopeType::kYarn);
  // transformers multiplies cos and sin by 0.1 ln 4 + 1; q.k carries its square.
  const float factor = static_cast<float>(0.1 * std::log(4.0) + 1.0);
  EXPECT_FLOAT_EQ(config->score_factor, factor * factor);
  EXPECT_FLOAT_EQ(config->AttentionScale(), factor * factor / 4.0f);  // head_dim 16
  // The frequencies are YaRN's: the fastest pair extrapolated, the slowest interpolated.
  const std::vector<float> yarn = RopeInverseFrequencies(config->rope, 16);
  config->rope.type = RopeType::kDefault;
  const std::vector<float> plain = RopeInverseFrequencies(config->rope, 16);
  EXPECT_FLOAT_EQ(yarn[0], plain[0]);
  EXPECT_FLOAT_EQ(yarn[7], plain[7] / 4);

  // An explicit attention_factor wins; without a factor, max_position_embeddings / original.
  j["rope_parameters"].erase("factor");
  j["rope_parameters"]["attention_factor"] = 1.5;
  config = Parse(j);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_DOUBLE_EQ(config->rope.factor, 4.0);  // 256 / 64
  EXPECT_FLOAT_EQ(config->score_factor, 2.25f);

  // Without YaRN the scale is plain.
  config = Parse(LlamaJson());
  ASSERT_TRUE(config.ok());
  EXPECT_FLOAT_EQ(config->AttentionScale(), 0.25f);
}

TEST(ModelConfigTest, DynamicRopeKeepsPlainFrequenciesWithinMaxPositions) {
  Json j = LlamaJson();
  j["rope_parameters"] = {{"rope_type", "dynamic"}, {"factor", 2.0}, {"rope_theta", 10000.0}};
  auto config = Parse(j);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->rope.type, RopeType::kDefault);
  EXPECT_FLOAT_EQ(config->score_factor, 1.0f);
  j["rope_parameters"].erase("factor");
  ExpectRefused(j, "factor");
}

TEST(ModelConfigTest, QwenFamiliesBiasAndNorms) {
  Json j = LlamaJson();
  j["architectures"] = {"Qwen2ForCausalLM"};
  j["use_sliding_window"] = false;
  j["sliding_window"] = 4096;
  j["layer_types"] = {"full_attention", "full_attention"};
  auto qwen2 = Parse(j);
  ASSERT_TRUE(qwen2.ok()) << qwen2.status();
  EXPECT_TRUE(qwen2->qkv_bias);
  EXPECT_FALSE(qwen2->o_bias);
  EXPECT_FALSE(qwen2->qk_norm);

  j["architectures"] = {"Qwen3ForCausalLM"};
  j["attention_bias"] = false;
  j["tie_word_embeddings"] = true;
  j["eos_token_id"] = {2, 7};
  j.erase("torch_dtype");
  j["dtype"] = "float32";
  auto qwen3 = Parse(j);
  ASSERT_TRUE(qwen3.ok()) << qwen3.status();
  EXPECT_FALSE(qwen3->qkv_bias);
  EXPECT_TRUE(qwen3->qk_norm);
  EXPECT_TRUE(qwen3->tie_word_embeddings);
  EXPECT_EQ(qwen3->eos_token_ids, (std::vector<int32_t>{2, 7}));
  EXPECT_EQ(qwen3->dtype, DType::kF32);

  Json llama = LlamaJson();
  llama["attention_bias"] = true;
  auto biased = Parse(llama);
  ASSERT_TRUE(biased.ok()) << biased.status();
  EXPECT_TRUE(biased->qkv_bias);
  EXPECT_TRUE(biased->o_bias);
}

TEST(ModelConfigTest, MistralSlidesOnEveryLayerWhenItsWindowIsShorterThanTheContext) {
  Json j = LlamaJson();
  j["architectures"] = {"MistralForCausalLM"};
  j["sliding_window"] = nullptr;
  auto full = Parse(j);
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_TRUE(full->sliding_layers.empty());
  j["sliding_window"] = 256;  // == max_position_embeddings: never drops a key
  auto covering = Parse(j);
  ASSERT_TRUE(covering.ok()) << covering.status();
  EXPECT_TRUE(covering->sliding_layers.empty());
  j["sliding_window"] = 128;  // Mistral-7B-v0.1's kind: 4096 of 32768
  auto sliding = Parse(j);
  ASSERT_TRUE(sliding.ok()) << sliding.status();
  EXPECT_EQ(sliding->SlidingWindowOf(0), 128);
  EXPECT_EQ(sliding->SlidingWindowOf(1), 128);
  j["layer_types"] = {"full_attention", "sliding_attention"};  // the file's layer_types decide
  auto typed = Parse(j);
  ASSERT_TRUE(typed.ok()) << typed.status();
  EXPECT_EQ(typed->SlidingWindowOf(0), 0);
  EXPECT_EQ(typed->SlidingWindowOf(1), 128);
  // Without the key, MistralConfig's default window: 4096.
  j.erase("layer_types");
  j.erase("sliding_window");
  j["max_position_embeddings"] = 32768;
  auto absent = Parse(j);
  ASSERT_TRUE(absent.ok()) << absent.status();
  EXPECT_EQ(absent->SlidingWindowOf(1), 4096);
}

TEST(ModelConfigTest, QwenSlidesFromMaxWindowLayersWhenUseSlidingWindow) {
  Json j = LlamaJson();
  j["architectures"] = {"Qwen2ForCausalLM"};
  j["sliding_window"] = 64;
  j["max_window_layers"] = 1;
  auto off = Parse(j);
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_TRUE(off->sliding_layers.empty());
  j["layer_types"] = {"full_attention", "sliding_attention"};  // dropped with the window
  auto typed_off = Parse(j);
  ASSERT_TRUE(typed_off.ok()) << typed_off.status();
  EXPECT_TRUE(typed_off->sliding_layers.empty());
  j.erase("layer_types");
  j["use_sliding_window"] = true;
  auto on = Parse(j);
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_EQ(on->SlidingWindowOf(0), 0);
  EXPECT_EQ(on->SlidingWindowOf(1), 64);
}

TEST(ModelConfigTest, RefusesUnsupported) {
  Json j = LlamaJson();
  j["architectures"] = {"GPT2LMHeadModel"};
  ExpectRefused(j, "unsupported architecture \"GPT2LMHeadModel\"");

  j = LlamaJson();
  j["layer_types"] = {"full_attention", "sliding_attention"};  // no sliding_window
  ExpectRefused(j, "sliding_window");

  j = LlamaJson();
  j["layer_types"] = {"full_attention", "chunked_attention"};
  ExpectRefused(j, "chunked_attention");

  j = LlamaJson();
  j["layer_types"] = {"full_attention"};
  ExpectRefused(j, "layer_types");

  j = LlamaJson();
  j["rope_parameters"] = {{"rope_type", "longrope"}, {"factor", 2.0}, {"rope_theta", 10000.0}};
  ExpectRefused(j, "rope type \"longrope\"");

  j = LlamaJson();
  j["rope_parameters"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"rope_theta", 10000.0}};
  ExpectRefused(j, "needs low_freq_factor");

  j = LlamaJson();
  j["mlp_bias"] = true;
  ExpectRefused(j, "mlp_bias");

  j = LlamaJson();
  j["hidden_act"] = "gelu";
  ExpectRefused(j, "hidden_act");

  j = LlamaJson();
  j["partial_rotary_factor"] = 0.5;
  ExpectRefused(j, "partial_rotary_factor");
}

TEST(ModelConfigTest, RejectsMalformedValues) {
  auto bad = ParseModelConfig("{not json", "broken.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("broken.json: malformed JSON"));

  Json j = LlamaJson();
  j.erase("hidden_size");
  ExpectRefused(j, "missing required field \"hidden_size\"");

  j = LlamaJson();
  j["num_attention_heads"] = "four";
  ExpectRefused(j, "\"num_attention_heads\" must be an integer");

  j = LlamaJson();
  j["num_key_value_heads"] = 3;
  ExpectRefused(j, "must be positive and divide num_attention_heads");

  j = LlamaJson();
  j["vocab_size"] = -5;
  ExpectRefused(j, "positive integer");

  j = LlamaJson();
  j["eos_token_id"] = "x";
  ExpectRefused(j, "eos_token_id");

  j = LlamaJson();
  j["eos_token_id"] = 1e20;  // not an integer
  ExpectRefused(j, "eos_token_id");
}

// Integers are range-checked before they are narrowed: a cast would turn 2^32 + 2 KV heads into
// 2 and eos_token_id 2^32 into token 0, and num_attention_heads x head_dim past 2^31 would wrap
// q_size() to a small (even zero) width that an empty q_proj then matches.
TEST(ModelConfigTest, RefusesIntegersThatWouldWrap) {
  Json j = LlamaJson();
  j["num_key_value_heads"] = (int64_t{1} << 32) + 2;
  ExpectRefused(j, "num_key_value_heads 4294967298 must be positive and divide");

  j = LlamaJson();
  j["head_dim"] = (int64_t{1} << 32) + 16;
  ExpectRefused(j, "head_dim 4294967312 must be positive");

  j = LlamaJson();
  j["head_dim"] = int64_t{1} << 30;  // 4 heads x 2^30 = 2^32
  ExpectRefused(j, "num_attention_heads 4 x head_dim at most 2^30");

  j = LlamaJson();
  j["eos_token_id"] = int64_t{1} << 32;
  ExpectRefused(j, "eos_token_id 4294967296 is out of range");

  j = LlamaJson();
  j["eos_token_id"] = {2, int64_t{1} << 40};
  ExpectRefused(j, "eos_token_id 1099511627776 is out of range");

  j = LlamaJson();
  j["bos_token_id"] = -(int64_t{1} << 33);
  ExpectRefused(j, "bos_token_id -8589934592 is out of range");

  j = LlamaJson();
  j["head_dim"] = 16;
  j["eos_token_id"] = {2, 7};
  auto config = Parse(j);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->q_size(), 64);
  EXPECT_EQ(config->eos_token_ids, (std::vector<int32_t>{2, 7}));
}

TEST(ModelConfigTest, LoadReportsMissingFile) {
  auto config = LoadModelConfig("/nonexistent/model");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("/nonexistent/model/config.json"));
}

}  // namespace
}  // namespace ringserve
