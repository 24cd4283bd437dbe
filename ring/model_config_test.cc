#include "ring/model_config.h"

#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "ring/hub_configs_testing.h"

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
  // MistralForCausalLM never reads layer_types: every layer slides with the window.
  j["layer_types"] = {"full_attention", "sliding_attention"};
  auto typed = Parse(j);
  ASSERT_TRUE(typed.ok()) << typed.status();
  EXPECT_EQ(typed->SlidingWindowOf(0), 128);
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

// Every hub config.json of the supported families, as published (transformers 4.x spellings) and
// as transformers 5 writes it, with the fields that decide the computation. Sliding and MoE
// patterns have one character per layer: 'S' slides / '.' attends to everything; 'M' MoE / 'D'
// dense.
struct HubCase {
  std::string name;
  const char* json;
  Architecture architecture;
  int layers, hidden, heads, kv_heads, head_dim, vocab, max_positions;
  float rms_norm_eps;
  RopeType rope_type = RopeType::kDefault;
  double theta = 10000.0;
  double rope_factor = 1.0;                // linear, llama3, yarn
  int rope_original_max = 0;               // llama3, yarn
  double low_freq = 1.0, high_freq = 4.0;  // llama3
  double mscale = 0, mscale_all_dim = 0;   // yarn
  bool truncate = true;                    // yarn
  int rotary_dim = 0;                      // 0: head_dim
  int window = 0;
  std::string sliding = "";  // empty: no layer slides
  bool qkv_bias = false, o_bias = false, qk_norm = false, tie = false, sinks = false;
  std::optional<int32_t> bos = std::nullopt;
  std::vector<int32_t> eos = {};
  DType dtype = DType::kBF16;
  // Mixture of experts (experts == 0: dense).
  RouterScoring scoring = RouterScoring::kSoftmaxTopK;
  int experts = 0, top_k = 0, expert_intermediate = 0, shared_intermediate = 0;
  bool norm_topk_prob = false, shared_gate = false, correction_bias = false, router_bias = false;
  float routed_scaling_factor = 1.0f;
  int n_group = 1, topk_group = 1;
  ExpertLayout layout = ExpertLayout::kPerExpert;
  std::string moe_layers = "";
  // Multi-head latent attention (kv_lora_rank == 0: none).
  int q_lora_rank = 0, kv_lora_rank = 0, qk_nope = 0, v_head = 0, first_dense = 0, nextn = 0;
};

std::string Repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

double YarnMscale(double factor, double mscale) { return 0.1 * mscale * std::log(factor) + 1.0; }

std::vector<HubCase> HubCases() {
  namespace hub = hub_configs;
  const std::vector<int32_t> kLlama3InstructEos = {128001, 128008, 128009};
  const std::vector<int32_t> kGlmEos = {151329, 151336, 151338};
  auto llama31 = [&](std::string name, const char* json) {
    return HubCase{.name = std::move(name),
                   .json = json,
                   .architecture = Architecture::kLlama,
                   .layers = 32,
                   .hidden = 4096,
                   .heads = 32,
                   .kv_heads = 8,
                   .head_dim = 128,
                   .vocab = 128256,
                   .max_positions = 131072,
                   .rms_norm_eps = 1e-5f,
                   .rope_type = RopeType::kLlama3,
                   .theta = 500000.0,
                   .rope_factor = 8.0,
                   .rope_original_max = 8192,
                   .bos = 128000,
                   .eos = {128001}};
  };
  auto mistral7b = [&](std::string name, const char* json) {
    return HubCase{.name = std::move(name),
                   .json = json,
                   .architecture = Architecture::kMistral,
                   .layers = 32,
                   .hidden = 4096,
                   .heads = 32,
                   .kv_heads = 8,
                   .head_dim = 128,
                   .vocab = 32000,
                   .max_positions = 32768,
                   .rms_norm_eps = 1e-5f,
                   .window = 4096,
                   .sliding = Repeat("S", 32),
                   .bos = 1,
                   .eos = {2}};
  };
  auto mixtral = [&](std::string name, const char* json) {
    return HubCase{.name = std::move(name),
                   .json = json,
                   .architecture = Architecture::kMixtral,
                   .layers = 32,
                   .hidden = 4096,
                   .heads = 32,
                   .kv_heads = 8,
                   .head_dim = 128,
                   .vocab = 32000,
                   .max_positions = 32768,
                   .rms_norm_eps = 1e-5f,
                   .theta = 1e6,
                   .bos = 1,
                   .eos = {2},
                   .experts = 8,
                   .top_k = 2,
                   .expert_intermediate = 14336,
                   .norm_topk_prob = true,
                   .layout = ExpertLayout::kMixtral,
                   .moe_layers = Repeat("M", 32)};
  };
  auto qwen25_7b = [&](std::string name, const char* json, int max_positions, int32_t eos) {
    return HubCase{.name = std::move(name),
                   .json = json,
                   .architecture = Architecture::kQwen2,
                   .layers = 28,
                   .hidden = 3584,
                   .heads = 28,
                   .kv_heads = 4,
                   .head_dim = 128,
                   .vocab = 152064,
                   .max_positions = max_positions,
                   .rms_norm_eps = 1e-6f,
                   .theta = 1e6,
                   .qkv_bias = true,
                   .bos = 151643,
                   .eos = {eos}};
  };
  auto qwen3_06b = [&](std::string name, const char* json) {
    return HubCase{.name = std::move(name),
                   .json = json,
                   .architecture = Architecture::kQwen3,
                   .layers = 28,
                   .hidden = 1024,
                   .heads = 16,
                   .kv_heads = 8,
                   .head_dim = 128,
                   .vocab = 151936,
                   .max_positions = 40960,
                   .rms_norm_eps = 1e-6f,
                   .theta = 1e6,
                   .qk_norm = true,
                   .tie = true,
                   .bos = 151643,
                   .eos = {151645}};
  };
  auto qwen3_30b = [&](std::string name, const char* json) {
    return HubCase{.name = std::move(name),
                   .json = json,
                   .architecture = Architecture::kQwen3Moe,
                   .layers = 48,
                   .hidden = 2048,
                   .heads = 32,
                   .kv_heads = 4,
                   .head_dim = 128,
                   .vocab = 151936,
                   .max_positions = 40960,
                   .rms_norm_eps = 1e-6f,
                   .theta = 1e6,
                   .qk_norm = true,
                   .bos = 151643,
                   .eos = {151645},
                   .experts = 128,
                   .top_k = 8,
                   .expert_intermediate = 768,
                   .norm_topk_prob = true,
                   .moe_layers = Repeat("M", 48)};
  };
  auto qwen15_moe = [&](std::string name, const char* json) {
    return HubCase{.name = std::move(name),
                   .json = json,
                   .architecture = Architecture::kQwen2Moe,
                   .layers = 24,
                   .hidden = 2048,
                   .heads = 16,
                   .kv_heads = 16,
                   .head_dim = 128,
                   .vocab = 151936,
                   .max_positions = 8192,
                   .rms_norm_eps = 1e-6f,
                   .theta = 1e6,
                   .qkv_bias = true,
                   .bos = 151643,
                   .eos = {151643},
                   .experts = 60,
                   .top_k = 4,
                   .expert_intermediate = 1408,
                   .shared_intermediate = 5632,
                   .shared_gate = true,
                   .moe_layers = Repeat("M", 24)};
  };
  auto glm45_air = [&](std::string name, const char* json) {
    return HubCase{.name = std::move(name),
                   .json = json,
                   .architecture = Architecture::kGlm4Moe,
                   .layers = 46,
                   .hidden = 4096,
                   .heads = 96,
                   .kv_heads = 8,
                   .head_dim = 128,
                   .vocab = 151552,
                   .max_positions = 131072,
                   .rms_norm_eps = 1e-5f,
                   .theta = 1e6,
                   .rotary_dim = 64,
                   .qkv_bias = true,
                   .eos = kGlmEos,
                   .scoring = RouterScoring::kSigmoidGroupedTopK,
                   .experts = 128,
                   .top_k = 8,
                   .expert_intermediate = 1408,
                   .shared_intermediate = 1408,
                   .norm_topk_prob = true,
                   .correction_bias = true,
                   .moe_layers = "D" + Repeat("M", 45)};
  };
  auto gpt_oss_20b = [&](std::string name, const char* json) {
    return HubCase{.name = std::move(name),
                   .json = json,
                   .architecture = Architecture::kGptOss,
                   .layers = 24,
                   .hidden = 2880,
                   .heads = 64,
                   .kv_heads = 8,
                   .head_dim = 64,
                   .vocab = 201088,
                   .max_positions = 131072,
                   .rms_norm_eps = 1e-5f,
                   .rope_type = RopeType::kYarn,
                   .theta = 150000.0,
                   .rope_factor = 32.0,
                   .rope_original_max = 4096,
                   .truncate = false,
                   .window = 128,
                   .sliding = Repeat("S.", 12),
                   .qkv_bias = true,
                   .o_bias = true,
                   .sinks = true,
                   .eos = {200002},
                   .scoring = RouterScoring::kTopKSoftmax,
                   .experts = 32,
                   .top_k = 4,
                   .expert_intermediate = 2880,
                   .router_bias = true,
                   .layout = ExpertLayout::kGptOssStacked,
                   .moe_layers = Repeat("M", 24)};
  };
  auto deepseek_v3 = [&](std::string name, const char* json) {
    return HubCase{.name = std::move(name),
                   .json = json,
                   .architecture = Architecture::kDeepseekV3,
                   .layers = 61,
                   .hidden = 7168,
                   .heads = 128,
                   .kv_heads = 128,
                   .head_dim = 64,
                   .vocab = 129280,
                   .max_positions = 163840,
                   .rms_norm_eps = 1e-6f,
                   .rope_type = RopeType::kYarn,
                   .rope_factor = 40.0,
                   .rope_original_max = 4096,
                   .mscale = 1.0,
                   .mscale_all_dim = 1.0,
                   .bos = 0,
                   .eos = {1},
                   .scoring = RouterScoring::kSigmoidGroupedTopK,
                   .experts = 256,
                   .top_k = 8,
                   .expert_intermediate = 2048,
                   .shared_intermediate = 2048,
                   .norm_topk_prob = true,
                   .correction_bias = true,
                   .routed_scaling_factor = 2.5f,
                   .n_group = 8,
                   .topk_group = 4,
                   .moe_layers = "DDD" + Repeat("M", 58),
                   .q_lora_rank = 1536,
                   .kv_lora_rank = 512,
                   .qk_nope = 128,
                   .v_head = 128,
                   .first_dense = 3,
                   .nextn = 1};
  };
  auto deepseek_v2_lite = [&](std::string name, const char* json) {
    return HubCase{.name = std::move(name),
                   .json = json,
                   .architecture = Architecture::kDeepseekV2,
                   .layers = 27,
                   .hidden = 2048,
                   .heads = 16,
                   .kv_heads = 16,
                   .head_dim = 64,
                   .vocab = 102400,
                   .max_positions = 163840,
                   .rms_norm_eps = 1e-6f,
                   .rope_type = RopeType::kYarn,
                   .rope_factor = 40.0,
                   .rope_original_max = 4096,
                   .mscale = 0.707,
                   .mscale_all_dim = 0.707,
                   .bos = 100000,
                   .eos = {100001},
                   .experts = 64,
                   .top_k = 6,
                   .expert_intermediate = 1408,
                   .shared_intermediate = 2816,
                   .moe_layers = "D" + Repeat("M", 26),
                   .kv_lora_rank = 512,
                   .qk_nope = 128,
                   .v_head = 128,
                   .first_dense = 1};
  };

  // A case from a family's, with `edit` applied.
  auto with = [](HubCase c, const std::function<void(HubCase&)>& edit) {
    edit(c);
    return c;
  };

  return {
      HubCase{.name = "Llama2_7B",
              .json = hub::kLlama2_7B,
              .architecture = Architecture::kLlama,
              .layers = 32,
              .hidden = 4096,
              .heads = 32,
              .kv_heads = 32,
              .head_dim = 128,
              .vocab = 32000,
              .max_positions = 4096,
              .rms_norm_eps = 1e-5f,
              .bos = 1,
              .eos = {2},
              .dtype = DType::kF16},
      llama31("Llama31_8B", hub::kLlama31_8B),
      with(llama31("Llama31_8BInstruct_Transformers5", hub::kLlama31_8BInstructV5),
           [&](HubCase& c) { c.eos = kLlama3InstructEos; }),
      with(llama31("Llama31_8BInstruct_Gptq", hub::kLlama31_8BInstructGptq),
           [&](HubCase& c) {
             c.eos = kLlama3InstructEos;
             c.dtype = DType::kF16;
           }),
      HubCase{.name = "Llama32_1B",
              .json = hub::kLlama32_1B,
              .architecture = Architecture::kLlama,
              .layers = 16,
              .hidden = 2048,
              .heads = 32,
              .kv_heads = 8,
              .head_dim = 64,
              .vocab = 128256,
              .max_positions = 131072,
              .rms_norm_eps = 1e-5f,
              .rope_type = RopeType::kLlama3,
              .theta = 500000.0,
              .rope_factor = 32.0,
              .rope_original_max = 8192,
              .tie = true,
              .bos = 128000,
              .eos = {128001}},
      mistral7b("Mistral7Bv01", hub::kMistral7Bv01),
      mistral7b("Mistral7Bv01_Transformers5", hub::kMistral7Bv01V5),
      HubCase{.name = "Mistral7Bv03",
              .json = hub::kMistral7Bv03,
              .architecture = Architecture::kMistral,
              .layers = 32,
              .hidden = 4096,
              .heads = 32,
              .kv_heads = 8,
              .head_dim = 128,
              .vocab = 32768,
              .max_positions = 32768,
              .rms_norm_eps = 1e-5f,
              .theta = 1e6,
              .bos = 1,
              .eos = {2}},
      HubCase{.name = "MistralNemo",
              .json = hub::kMistralNemo,
              .architecture = Architecture::kMistral,
              .layers = 40,
              .hidden = 5120,
              .heads = 32,
              .kv_heads = 8,
              .head_dim = 128,
              .vocab = 131072,
              .max_positions = 1024000,
              .rms_norm_eps = 1e-5f,
              .theta = 1e6,
              .bos = 1,
              .eos = {2}},
      mixtral("Mixtral8x7B", hub::kMixtral8x7B),
      mixtral("Mixtral8x7B_Transformers5", hub::kMixtral8x7BV5),
      with(mixtral("Mixtral8x7B_Awq", hub::kMixtral8x7BAwq),
           [](HubCase& c) { c.dtype = DType::kF16; }),
      qwen25_7b("Qwen25_7B", hub::kQwen25_7B, 131072, 151643),
      with(qwen25_7b("Qwen25_7BInstruct_Yarn", hub::kQwen25_7BInstructYarn, 32768, 151645),
           [](HubCase& c) {
             c.rope_type = RopeType::kYarn;
             c.rope_factor = 4.0;
             c.rope_original_max = 32768;
           }),
      qwen25_7b("Qwen25_7BInstruct_Transformers5", hub::kQwen25_7BInstructV5, 32768, 151645),
      qwen3_06b("Qwen3_06B", hub::kQwen3_06B),
      qwen3_06b("Qwen3_06B_Transformers5", hub::kQwen3_06BV5),
      qwen3_30b("Qwen3_30B_A3B", hub::kQwen3_30B_A3B),
      qwen3_30b("Qwen3_30B_A3B_Transformers5", hub::kQwen3_30B_A3BV5),
      qwen3_30b("Qwen3_30B_A3B_Fp8", hub::kQwen3_30B_A3BFp8),
      qwen3_30b("Qwen3_30B_A3B_Fp8Dynamic", hub::kQwen3_30B_A3BFp8Dynamic),
      qwen15_moe("Qwen15MoeA27B", hub::kQwen15MoeA27B),
      qwen15_moe("Qwen15MoeA27B_Transformers5", hub::kQwen15MoeA27BV5),
      HubCase{.name = "Qwen2_57B_A14B",
              .json = hub::kQwen2_57B_A14B,
              .architecture = Architecture::kQwen2Moe,
              .layers = 28,
              .hidden = 3584,
              .heads = 28,
              .kv_heads = 4,
              .head_dim = 128,
              .vocab = 151936,
              .max_positions = 131072,
              .rms_norm_eps = 1e-6f,
              .theta = 1e6,
              .qkv_bias = true,
              .bos = 151643,
              .eos = {151643},
              .experts = 64,
              .top_k = 8,
              .expert_intermediate = 2560,
              .shared_intermediate = 20480,
              .shared_gate = true,
              .moe_layers = Repeat("M", 28)},
      glm45_air("Glm45Air", hub::kGlm45Air),
      glm45_air("Glm45Air_Transformers5", hub::kGlm45AirV5),
      HubCase{.name = "Glm45",
              .json = hub::kGlm45,
              .architecture = Architecture::kGlm4Moe,
              .layers = 92,
              .hidden = 5120,
              .heads = 96,
              .kv_heads = 8,
              .head_dim = 128,
              .vocab = 151552,
              .max_positions = 131072,
              .rms_norm_eps = 1e-5f,
              .theta = 1e6,
              .rotary_dim = 64,
              .qkv_bias = true,
              .qk_norm = true,
              .eos = kGlmEos,
              .scoring = RouterScoring::kSigmoidGroupedTopK,
              .experts = 160,
              .top_k = 8,
              .expert_intermediate = 1536,
              .shared_intermediate = 1536,
              .norm_topk_prob = true,
              .correction_bias = true,
              .routed_scaling_factor = 2.5f,
              .moe_layers = "DDD" + Repeat("M", 89)},
      gpt_oss_20b("GptOss20B", hub::kGptOss20B),
      gpt_oss_20b("GptOss20B_Transformers5", hub::kGptOss20BV5),
      deepseek_v3("DeepseekV3", hub::kDeepseekV3),
      deepseek_v3("DeepseekV3_Transformers5", hub::kDeepseekV3V5),
      deepseek_v2_lite("DeepseekV2Lite", hub::kDeepseekV2Lite),
      HubCase{.name = "DeepseekV2",
              .json = hub::kDeepseekV2,
              .architecture = Architecture::kDeepseekV2,
              .layers = 60,
              .hidden = 5120,
              .heads = 128,
              .kv_heads = 128,
              .head_dim = 64,
              .vocab = 102400,
              .max_positions = 163840,
              .rms_norm_eps = 1e-6f,
              .rope_type = RopeType::kYarn,
              .rope_factor = 40.0,
              .rope_original_max = 4096,
              .mscale = 0.707,
              .mscale_all_dim = 0.707,
              .bos = 100000,
              .eos = {100001},
              .experts = 160,
              .top_k = 6,
              .expert_intermediate = 1536,
              .shared_intermediate = 3072,
              .routed_scaling_factor = 16.0f,
              .n_group = 8,
              .topk_group = 3,
              .moe_layers = "D" + Repeat("M", 59),
              .q_lora_rank = 1536,
              .kv_lora_rank = 512,
              .qk_nope = 128,
              .v_head = 128,
              .first_dense = 1},
      HubCase{.name = "DeepseekV2Tiny_Transformers5",
              .json = hub::kDeepseekV2TinyV5,
              .architecture = Architecture::kDeepseekV2,
              .layers = 2,
              .hidden = 64,
              .heads = 4,
              .kv_heads = 4,
              .head_dim = 16,
              .vocab = 128,
              .max_positions = 2048,
              .rms_norm_eps = 1e-6f,
              .bos = 1,
              .eos = {2},
              .dtype = DType::kF32,
              .experts = 8,
              .top_k = 2,
              .expert_intermediate = 32,
              .shared_intermediate = 64,
              .moe_layers = "MM",
              .q_lora_rank = 48,
              .kv_lora_rank = 32,
              .qk_nope = 16,
              .v_head = 16},
  };
}

std::string Pattern(const std::vector<bool>& flags, char on, char off, int layers) {
  std::string out;
  for (int layer = 0; layer < layers; ++layer) {
    out += layer < static_cast<int>(flags.size()) && flags[layer] ? on : off;
  }
  return out;
}

void PrintTo(const HubCase& c, std::ostream* os) { *os << c.name; }

class HubConfigTest : public ::testing::TestWithParam<HubCase> {};

TEST_P(HubConfigTest, ParsesTheFieldsThatDecideTheComputation) {
  const HubCase& c = GetParam();
  auto parsed = ParseModelConfig(c.json, c.name);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const ModelConfig& m = *parsed;
  EXPECT_EQ(m.architecture, c.architecture);
  EXPECT_EQ(m.num_layers, c.layers);
  EXPECT_EQ(m.hidden_size, c.hidden);
  EXPECT_EQ(m.num_heads, c.heads);
  EXPECT_EQ(m.num_kv_heads, c.kv_heads);
  EXPECT_EQ(m.head_dim, c.head_dim);
  EXPECT_EQ(m.vocab_size, c.vocab);
  EXPECT_EQ(m.max_position_embeddings, c.max_positions);
  EXPECT_FLOAT_EQ(m.rms_norm_eps, c.rms_norm_eps);
  EXPECT_EQ(m.rotary_dim, c.rotary_dim == 0 ? c.head_dim : c.rotary_dim);

  EXPECT_EQ(m.rope.type, c.rope_type);
  EXPECT_DOUBLE_EQ(m.rope.theta, c.theta);
  if (c.rope_type != RopeType::kDefault) {
    EXPECT_DOUBLE_EQ(m.rope.factor, c.rope_factor);
    EXPECT_EQ(m.rope.original_max_position_embeddings, c.rope_original_max);
  }
  if (c.rope_type == RopeType::kLlama3) {
    EXPECT_DOUBLE_EQ(m.rope.low_freq_factor, c.low_freq);
    EXPECT_DOUBLE_EQ(m.rope.high_freq_factor, c.high_freq);
  }
  if (c.rope_type == RopeType::kYarn) {
    EXPECT_DOUBLE_EQ(m.rope.beta_fast, 32.0);
    EXPECT_DOUBLE_EQ(m.rope.beta_slow, 1.0);
    EXPECT_DOUBLE_EQ(m.rope.mscale, c.mscale);
    EXPECT_DOUBLE_EQ(m.rope.mscale_all_dim, c.mscale_all_dim);
    EXPECT_EQ(m.rope.truncate, c.truncate);
    EXPECT_FALSE(m.rope.attention_factor.has_value());
  }
  // YaRN's attention factor scales ordinary attention's scores by its square; MLA folds mscale
  // into its softmax scale instead.
  const bool yarn_scores = c.rope_type == RopeType::kYarn && c.kv_lora_rank == 0;
  const float factor = static_cast<float>(yarn_scores ? YarnMscale(c.rope_factor, 1.0) : 1.0);
  EXPECT_FLOAT_EQ(m.score_factor, factor * factor);

  EXPECT_EQ(m.sliding_window, c.window);
  EXPECT_EQ(Pattern(m.sliding_layers, 'S', '.', m.num_layers),
            c.sliding.empty() ? std::string(c.layers, '.') : c.sliding);
  EXPECT_EQ(m.qkv_bias, c.qkv_bias);
  EXPECT_EQ(m.o_bias, c.o_bias);
  EXPECT_EQ(m.qk_norm, c.qk_norm);
  EXPECT_EQ(m.tie_word_embeddings, c.tie);
  EXPECT_EQ(m.attention_sinks, c.sinks);
  EXPECT_EQ(m.bos_token_id, c.bos);
  EXPECT_EQ(m.eos_token_ids, c.eos);
  EXPECT_EQ(m.dtype, c.dtype);

  const MoeConfig& moe = m.moe;
  EXPECT_EQ(moe.router.num_experts, c.experts);
  if (c.experts > 0) {
    EXPECT_EQ(moe.router.scoring, c.scoring);
    EXPECT_EQ(moe.router.top_k, c.top_k);
    EXPECT_EQ(moe.router.norm_topk_prob, c.norm_topk_prob);
    EXPECT_FLOAT_EQ(moe.router.routed_scaling_factor, c.routed_scaling_factor);
    EXPECT_EQ(moe.router.n_group, c.n_group);
    EXPECT_EQ(moe.router.topk_group, c.topk_group);
    EXPECT_EQ(moe.expert_intermediate_size, c.expert_intermediate);
    EXPECT_EQ(moe.shared_intermediate_size, c.shared_intermediate);
    EXPECT_EQ(moe.shared_expert_gate, c.shared_gate);
    EXPECT_EQ(moe.correction_bias, c.correction_bias);
    EXPECT_EQ(moe.router_bias, c.router_bias);
    EXPECT_EQ(moe.layout, c.layout);
    EXPECT_EQ(Pattern(moe.layers, 'M', 'D', m.num_layers), c.moe_layers);
  }

  ASSERT_EQ(m.mla.has_value(), c.kv_lora_rank > 0);
  if (m.mla) {
    const MlaConfig& mla = *m.mla;
    EXPECT_EQ(mla.q_lora_rank, c.q_lora_rank);
    EXPECT_EQ(mla.kv_lora_rank, c.kv_lora_rank);
    EXPECT_EQ(mla.qk_nope_head_dim, c.qk_nope);
    EXPECT_EQ(mla.qk_rope_head_dim, c.head_dim);
    EXPECT_EQ(mla.v_head_dim, c.v_head);
    EXPECT_EQ(mla.first_k_dense_replace, c.first_dense);
    EXPECT_EQ(mla.num_nextn_predict_layers, c.nextn);
    EXPECT_TRUE(mla.rope_interleave);
    EXPECT_FALSE(mla.attention_bias);
    // qk_head_dim^-0.5, times yarn_get_mscale(factor, mscale_all_dim)^2 with YaRN.
    const double mscale = c.rope_type == RopeType::kYarn && c.mscale_all_dim != 0
                              ? YarnMscale(c.rope_factor, c.mscale_all_dim)
                              : 1.0;
    EXPECT_NEAR(mla.softmax_scale, mscale * mscale / std::sqrt(c.qk_nope + c.head_dim), 1e-12);
    EXPECT_DOUBLE_EQ(mla.rope_attention_factor, 1.0);  // mscale == mscale_all_dim
  }
}

INSTANTIATE_TEST_SUITE_P(Hub, HubConfigTest, ::testing::ValuesIn(HubCases()),
                         [](const ::testing::TestParamInfo<HubCase>& info) {
                           return info.param.name;
                         });

// The published files with every nullable key set to null and the config.json spellings that
// vary between transformers versions: each must parse to the same computation.
TEST(HubConfigTest, NullsAndSpellingsOfTheSameModelAgree) {
  const Json llama = Json::parse(hub_configs::kLlama31_8B);
  Json nulls = llama;
  nulls["bos_token_id"] = nullptr;
  nulls["pad_token_id"] = nullptr;
  nulls["head_dim"] = nullptr;  // LlamaConfig: hidden_size / num_attention_heads
  nulls["attention_bias"] = nullptr;
  nulls["mlp_bias"] = nullptr;
  nulls["partial_rotary_factor"] = nullptr;
  nulls["torch_dtype"] = nullptr;
  nulls["dtype"] = "bfloat16";
  nulls["rope_parameters"] = nullptr;  // rope_scaling decides
  nulls["layer_types"] = nullptr;
  nulls["sliding_window"] = nullptr;
  nulls["some_key_of_a_future_transformers"] = {{"nested", {1, 2, 3}}};
  auto parsed = Parse(nulls);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_FALSE(parsed->bos_token_id.has_value());
  EXPECT_EQ(parsed->head_dim, 128);
  EXPECT_EQ(parsed->rope.type, RopeType::kLlama3);
  EXPECT_EQ(parsed->dtype, DType::kBF16);
  EXPECT_TRUE(parsed->sliding_layers.empty());

  // eos_token_id as a one-element list, and no eos at all.
  Json eos = llama;
  eos["eos_token_id"] = {128009};
  parsed = Parse(eos);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->eos_token_ids, std::vector<int32_t>{128009});
  eos["eos_token_id"] = nullptr;
  parsed = Parse(eos);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->eos_token_ids.empty());

  // The rope dictionary's "type" (oldest files) and "rope_type", and both with rope_scaling null
  // next to rope_parameters (a file written by one version and edited by another).
  Json both = llama;
  both["rope_parameters"] = both["rope_scaling"];
  both["rope_parameters"]["rope_theta"] = 500000.0;
  both["rope_scaling"] = nullptr;
  both.erase("rope_theta");
  parsed = Parse(both);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->rope.type, RopeType::kLlama3);
  EXPECT_DOUBLE_EQ(parsed->rope.theta, 500000.0);
}

// Keys a file may leave out take the config class's default, which is not always the generic one.
TEST(HubConfigTest, AbsentKeysTakeTheConfigClassDefaults) {
  // MixtralConfig's rope_theta is 1e6, GptOssConfig's 1.5e5 (also next to a rope_scaling).
  Json mixtral = Json::parse(hub_configs::kMixtral8x7B);
  mixtral.erase("rope_theta");
  auto parsed = Parse(mixtral);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_DOUBLE_EQ(parsed->rope.theta, 1e6);
  Json gpt_oss = Json::parse(hub_configs::kGptOss20B);
  gpt_oss.erase("rope_theta");
  parsed = Parse(gpt_oss);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_DOUBLE_EQ(parsed->rope.theta, 150000.0);
  EXPECT_EQ(parsed->rope.type, RopeType::kYarn);

  // Qwen3Config's head_dim is 128 and GptOssConfig's 64 whatever hidden_size / heads is; null
  // derives it.
  Json qwen3 = Json::parse(hub_configs::kQwen3_06B);
  qwen3["hidden_size"] = 2048;  // 2048 / 16 heads = 128 would hide the default
  qwen3["num_attention_heads"] = 32;
  qwen3["num_key_value_heads"] = 8;
  qwen3.erase("head_dim");
  parsed = Parse(qwen3);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->head_dim, 128);
  qwen3["head_dim"] = nullptr;
  parsed = Parse(qwen3);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->head_dim, 64);
  gpt_oss.erase("head_dim");
  parsed = Parse(gpt_oss);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->head_dim, 64);  // 2880 / 64 heads would be 45

  // GptOssConfig's attention_bias defaults to true; transformers 5 honours a false.
  gpt_oss.erase("attention_bias");
  parsed = Parse(gpt_oss);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->qkv_bias);
  EXPECT_TRUE(parsed->o_bias);
  gpt_oss["attention_bias"] = false;
  parsed = Parse(gpt_oss);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_FALSE(parsed->qkv_bias);
  EXPECT_FALSE(parsed->o_bias);

  // num_key_value_heads: MistralConfig 8, Qwen3MoeConfig 4, LlamaConfig the heads; null is the
  // heads for every class.
  Json mistral = Json::parse(hub_configs::kMistral7Bv03);
  mistral.erase("num_key_value_heads");
  parsed = Parse(mistral);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->num_kv_heads, 8);
  mistral["num_key_value_heads"] = nullptr;
  parsed = Parse(mistral);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->num_kv_heads, 32);
  Json qwen3_moe = Json::parse(hub_configs::kQwen3_30B_A3B);
  qwen3_moe.erase("num_key_value_heads");
  parsed = Parse(qwen3_moe);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->num_kv_heads, 4);
  Json llama = Json::parse(hub_configs::kLlama31_8B);
  llama.erase("num_key_value_heads");
  parsed = Parse(llama);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->num_kv_heads, 32);

  // A config saved without a model has no "architectures": model_type names the class.
  Json bare = Json::parse(hub_configs::kQwen3_30B_A3BV5);
  bare.erase("architectures");
  parsed = Parse(bare);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->architecture, Architecture::kQwen3Moe);
  EXPECT_EQ(parsed->moe.router.num_experts, 128);
  bare = Json::parse(hub_configs::kDeepseekV3V5);
  bare["architectures"] = nullptr;
  parsed = Parse(bare);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->architecture, Architecture::kDeepseekV3);
  bare["model_type"] = "gemma3_text";
  ExpectRefused(bare, "unsupported model_type \"gemma3_text\"");
}

// MistralForCausalLM and MixtralForCausalLM slide every layer with config.sliding_window and
// never read layer_types (transformers warns that such a file wants Ministral); Qwen3-MoE with a
// null window does not slide.
TEST(HubConfigTest, SlidingWindowFollowsEachFamilysModel) {
  Json mistral = Json::parse(hub_configs::kMistral7Bv01V5);
  mistral["layer_types"] = Json::array();
  for (int layer = 0; layer < 32; ++layer) {
    mistral["layer_types"].push_back(layer % 4 == 3 ? "full_attention" : "sliding_attention");
  }
  auto parsed = Parse(mistral);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(Pattern(parsed->sliding_layers, 'S', '.', 32), Repeat("S", 32));
  Json mixtral = Json::parse(hub_configs::kMixtral8x7BV5);
  mixtral["sliding_window"] = 4096;
  mixtral["layer_types"] = Json::array();
  for (int layer = 0; layer < 32; ++layer) mixtral["layer_types"].push_back("full_attention");
  parsed = Parse(mixtral);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->SlidingWindowOf(5), 4096);

  Json qwen3_moe = Json::parse(hub_configs::kQwen3_30B_A3B);
  qwen3_moe["use_sliding_window"] = true;  // sliding_window stays null
  parsed = Parse(qwen3_moe);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->sliding_layers.empty());
  qwen3_moe["sliding_window"] = 4096;
  parsed = Parse(qwen3_moe);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(Pattern(parsed->sliding_layers, 'S', '.', 48), Repeat("S", 48));

  // Qwen2.5 with use_sliding_window true: the layers from max_window_layers on.
  Json qwen25 = Json::parse(hub_configs::kQwen25_7B);
  qwen25["use_sliding_window"] = true;
  qwen25["sliding_window"] = 4096;
  qwen25["max_window_layers"] = 21;
  parsed = Parse(qwen25);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(Pattern(parsed->sliding_layers, 'S', '.', 28), Repeat(".", 21) + Repeat("S", 7));
}

// transformers 5 nests rope_parameters per layer type for some models: one shared set is read,
// sets that differ are refused naming the key.
TEST(HubConfigTest, RopeParametersPerLayerType) {
  Json gpt_oss = Json::parse(hub_configs::kGptOss20BV5);
  const Json flat = gpt_oss["rope_parameters"];
  gpt_oss["rope_parameters"] = {{"full_attention", flat}, {"sliding_attention", flat}};
  auto parsed = Parse(gpt_oss);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->rope.type, RopeType::kYarn);
  EXPECT_DOUBLE_EQ(parsed->rope.theta, 150000.0);
  EXPECT_DOUBLE_EQ(parsed->rope.factor, 32.0);
  EXPECT_FALSE(parsed->rope.truncate);

  Json glm = Json::parse(hub_configs::kGlm45AirV5);
  const Json glm_flat = glm["rope_parameters"];
  glm["rope_parameters"] = {{"full_attention", glm_flat}};
  parsed = Parse(glm);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->rotary_dim, 64);
  EXPECT_DOUBLE_EQ(parsed->rope.theta, 1e6);

  gpt_oss["rope_parameters"]["sliding_attention"] = {{"rope_type", "default"},
                                                     {"rope_theta", 10000.0}};
  ExpectRefused(gpt_oss, "rope_parameters that differ per layer type");
}

// What the backends do not implement is refused naming the key, in the spellings real files use.
TEST(HubConfigTest, RefusesWhatIsNotImplementedNamingTheKey) {
  Json j = Json::parse(hub_configs::kLlama31_8B);
  j["rope_scaling"] = {{"type", "longrope"}, {"long_factor", {1.0}}, {"short_factor", {1.0}}};
  ExpectRefused(j, "rope_scaling rope type \"longrope\"");
  j = Json::parse(hub_configs::kLlama31_8B);
  j["mlp_bias"] = true;
  ExpectRefused(j, "mlp_bias");
  j = Json::parse(hub_configs::kLlama31_8B);
  j["pretraining_tp"] = 2;
  ExpectRefused(j, "pretraining_tp");
  j = Json::parse(hub_configs::kQwen3_30B_A3B);
  j["hidden_act"] = "gelu";
  ExpectRefused(j, "hidden_act");
  j = Json::parse(hub_configs::kDeepseekV3);
  j["scoring_func"] = "softmax";
  ExpectRefused(j, "scoring_func");
  j = Json::parse(hub_configs::kDeepseekV3);
  j["moe_layer_freq"] = 2;
  ExpectRefused(j, "moe_layer_freq");
  j = Json::parse(hub_configs::kDeepseekV2);
  j["topk_method"] = "noaux_tc";
  ExpectRefused(j, "topk_method");
  j = Json::parse(hub_configs::kGptOss20B);
  j["swiglu_limit"] = 10.0;
  ExpectRefused(j, "swiglu_limit");
  j = Json::parse(hub_configs::kGptOss20B);
  j["quantization_config"] = {{"quant_method", "fp8"}};
  ExpectRefused(j, "quantization_config.quant_method");
  j = Json::parse(hub_configs::kQwen3_30B_A3B);
  j["quantization_config"] = {{"quant_method", "mxfp4"}};
  ExpectRefused(j, "quantization_config.quant_method");
  j = Json::parse(hub_configs::kQwen25_7B);
  j["partial_rotary_factor"] = 0.5;
  ExpectRefused(j, "partial_rotary_factor");
  j = Json::parse(hub_configs::kGlm45Air);
  j["rope_scaling"] = {
      {"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  ExpectRefused(j, "partial_rotary_factor");  // YaRN needs every value rotated
}

TEST(ModelConfigTest, LoadReportsMissingFile) {
  auto config = LoadModelConfig("/nonexistent/model");
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("/nonexistent/model/config.json"));
}

}  // namespace
}  // namespace ringserve
