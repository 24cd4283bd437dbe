#include "stage/model/quant/quant_config.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "common/testing/fifo_watchdog.h"
#include "common/testing/temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ring/hub_configs_testing.h"
#include "ring/model_config.h"

namespace ringserve::quant {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<QuantConfig> Parse(const std::string& quantization_config) {
  return ParseQuantConfig(
      nlohmann::json::parse(R"({"model_type": "llama", "quantization_config": )" +
                            quantization_config + "}"),
      "config.json");
}

std::string ErrorOf(const std::string& quantization_config) {
  auto config = Parse(quantization_config);
  EXPECT_FALSE(config.ok());
  return config.ok() ? "" : std::string(config.status().message());
}

TEST(QuantConfigTest, NoQuantizationConfigIsNone) {
  auto config = ParseQuantConfig(nlohmann::json::parse(R"({"model_type": "llama"})"), "c");
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(config->method, QuantMethod::kNone);
  EXPECT_EQ(StorageOf(*config, "model.layers.0.mlp.up_proj").method, QuantMethod::kNone);
}

TEST(QuantConfigTest, DeepSeekFp8WithUe8m0AndModulesToNotConvert) {
  auto config = Parse(R"({"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
      "scale_fmt": "ue8m0", "weight_block_size": [128, 64],
      "modules_to_not_convert": ["model.layers.*.self_attn.o_proj", "mlp.gate."]})");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->method, QuantMethod::kFp8);
  EXPECT_EQ(config->block_rows, 128);
  EXPECT_EQ(config->block_cols, 64);
  EXPECT_TRUE(config->scale_ue8m0);
  EXPECT_EQ(StorageOf(*config, "model.layers.3.self_attn.q_proj").method, QuantMethod::kFp8);
  EXPECT_EQ(StorageOf(*config, "model.layers.12.self_attn.o_proj").method, QuantMethod::kNone);
  EXPECT_EQ(StorageOf(*config, "model.layers.1.mlp.gate_proj").method, QuantMethod::kFp8);
  // With a list that leaves lm_head out, transformers quantizes it.
  EXPECT_EQ(StorageOf(*config, "lm_head").method, QuantMethod::kFp8);
  // transformers 5's key test: from the name's start as an expression, or a suffix; a key inside
  // the name ("self_attn") is no match.
  config = Parse(R"({"quant_method": "fp8", "weight_block_size": [128, 128],
                     "modules_to_not_convert": ["self_attn", "down_proj", "model.layers.2"]})");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(StorageOf(*config, "model.layers.0.self_attn.q_proj").method, QuantMethod::kFp8);
  EXPECT_EQ(StorageOf(*config, "model.layers.0.mlp.down_proj").method, QuantMethod::kNone);
  EXPECT_EQ(StorageOf(*config, "model.layers.2.mlp.up_proj").method, QuantMethod::kNone);
  EXPECT_EQ(StorageOf(*config, "model.layers.1.mlp.up_proj").method, QuantMethod::kFp8);
}

TEST(QuantConfigTest, Fp8QuantizesLmHeadWhenASkipListLeavesItOut) {
  // No list: transformers' default skip keeps lm_head in full precision.
  auto config = Parse(R"({"quant_method": "fp8", "weight_block_size": [128, 128]})");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(StorageOf(*config, "lm_head").method, QuantMethod::kNone);
  // A list without lm_head: transformers quantizes it.
  config = Parse(R"({"quant_method": "fp8", "weight_block_size": [128, 128],
                     "modules_to_not_convert": ["model.layers.0.mlp.gate"]})");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(StorageOf(*config, "lm_head").method, QuantMethod::kFp8);
  config = Parse(R"({"quant_method": "fp8", "weight_block_size": [128, 128],
                     "modules_to_not_convert": ["lm_head"]})");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(StorageOf(*config, "lm_head").method, QuantMethod::kNone);
}

TEST(QuantConfigTest, CompressedTensorsPrecedenceExactThenRegexThenLinearThenLaterGroup) {
  // group_10 comes after group_2 in the file (and in name order taken numerically).
  auto config = Parse(R"({"quant_method": "compressed-tensors", "format": "pack-quantized",
    "config_groups": {
      "group_10": {"targets": ["re:.*down_proj$"], "weights": {"num_bits": 8}},
      "group_2": {"targets": ["Linear", "re:.*down_proj$"], "weights": {"num_bits": 4}},
      "group_3": {"targets": ["model.layers.0.mlp.up_proj"], "weights": {"num_bits": 2}}}})");
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_EQ(config->schemes.size(), 3u);
  EXPECT_EQ(config->schemes[0].group_name, "group_2");
  EXPECT_EQ(config->schemes[2].group_name, "group_10");
  // A pattern beats "Linear"; of two equal patterns the later group wins.
  EXPECT_EQ(StorageOf(*config, "model.layers.0.mlp.down_proj").scheme->num_bits, 8);
  // An exact name beats everything.
  EXPECT_EQ(StorageOf(*config, "model.layers.0.mlp.up_proj").scheme->num_bits, 2);
  // Otherwise "Linear".
  EXPECT_EQ(StorageOf(*config, "model.layers.1.mlp.up_proj").scheme->num_bits, 4);
}

TEST(QuantConfigTest, Fp8DefaultsToBlocksOf128) {
  auto config = Parse(R"({"quant_method": "fp8"})");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->block_rows, 128);
  EXPECT_FALSE(config->scale_ue8m0);
}

TEST(QuantConfigTest, CompressedTensorsGroupsTargetsAndIgnore) {
  auto config = Parse(R"({"quant_method": "compressed-tensors", "format": "pack-quantized",
    "quantization_status": "compressed", "kv_cache_scheme": null, "sparsity_config": {},
    "ignore": ["lm_head", "re:.*layers\\.1\\.mlp\\.down_proj$"],
    "config_groups": {
      "group_0": {"targets": ["re:.*self_attn\\.(q|k|v)_proj$"], "input_activations": null,
        "weights": {"num_bits": 4, "type": "int", "symmetric": false, "strategy": "group",
                    "group_size": 32, "actorder": "group", "dynamic": false}},
      "group_1": {"targets": ["Linear"], "format": "float-quantized",
        "weights": {"num_bits": 8, "type": "float", "symmetric": true, "strategy": "block",
                    "block_structure": [32, 16]}}}})");
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_EQ(config->schemes.size(), 2u);
  const LinearStorage q = StorageOf(*config, "model.layers.0.self_attn.q_proj");
  ASSERT_NE(q.scheme, nullptr);
  EXPECT_EQ(q.scheme->storage, CompressedScheme::Storage::kPacked);
  EXPECT_EQ(q.scheme->strategy, CompressedScheme::Strategy::kGroup);
  EXPECT_EQ(q.scheme->group_size, 32);
  EXPECT_FALSE(q.scheme->symmetric);
  const LinearStorage o = StorageOf(*config, "model.layers.0.self_attn.o_proj");
  ASSERT_NE(o.scheme, nullptr);
  EXPECT_EQ(o.scheme->storage, CompressedScheme::Storage::kFloat);
  EXPECT_EQ(o.scheme->block_rows, 32);
  EXPECT_EQ(o.scheme->block_cols, 16);
  EXPECT_EQ(StorageOf(*config, "model.layers.1.mlp.down_proj").method, QuantMethod::kNone);
  EXPECT_NE(StorageOf(*config, "model.layers.11.mlp.down_proj").method, QuantMethod::kNone);
  EXPECT_EQ(StorageOf(*config, "lm_head").method, QuantMethod::kNone);
}

TEST(QuantConfigTest, GptqAndAwq) {
  auto gptq = Parse(R"({"quant_method": "gptq", "bits": 8, "group_size": -1, "desc_act": true,
                        "sym": false, "checkpoint_format": "gptq_v2"})");
  ASSERT_TRUE(gptq.ok()) << gptq.status();
  EXPECT_EQ(gptq->bits, 8);
  EXPECT_EQ(gptq->group_size, -1);
  EXPECT_TRUE(gptq->desc_act);
  EXPECT_EQ(gptq->gptq_zero_offset, 0);
  EXPECT_EQ(StorageOf(*gptq, "model.layers.0.mlp.up_proj").method, QuantMethod::kGptq);
  EXPECT_EQ(StorageOf(*gptq, "lm_head").method, QuantMethod::kNone);
  auto awq = Parse(R"({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": true,
                       "version": "GEMM", "modules_to_not_convert": ["v_proj"]})");
  ASSERT_TRUE(awq.ok()) << awq.status();
  EXPECT_EQ(StorageOf(*awq, "model.layers.0.self_attn.v_proj").method, QuantMethod::kNone);
  EXPECT_EQ(StorageOf(*awq, "model.layers.0.self_attn.k_proj").method, QuantMethod::kAwq);
  // modules_in_block_to_quantize: a block module whose name ends with a listed one.
  gptq = Parse(R"({"quant_method": "gptq", "bits": 4, "group_size": 128,
                   "modules_in_block_to_quantize": [["q_proj", "k_proj"], ["mlp.down_proj"]]})");
  ASSERT_TRUE(gptq.ok()) << gptq.status();
  EXPECT_EQ(StorageOf(*gptq, "model.layers.0.self_attn.q_proj").method, QuantMethod::kGptq);
  EXPECT_EQ(StorageOf(*gptq, "model.layers.0.mlp.down_proj").method, QuantMethod::kGptq);
  EXPECT_EQ(StorageOf(*gptq, "model.layers.0.self_attn.v_proj").method, QuantMethod::kNone);
  EXPECT_EQ(StorageOf(*gptq, "model.layers.0.mlp.up_proj").method, QuantMethod::kNone);
  // transformers 5 re-saves AutoAWQ's backend as "auto" (same GEMM storage).
  awq = Parse(R"({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": true,
                  "version": "gemm", "backend": "auto"})");
  ASSERT_TRUE(awq.ok()) << awq.status();
}

TEST(QuantConfigTest, CompressedIntQuantizedTakesAnyWidthUpTo8Bits) {
  // llm-compressor stores W4A8 weights one int8 each under int-quantized.
  auto config = Parse(R"({"quant_method": "compressed-tensors", "format": "int-quantized",
      "config_groups": {"group_0": {"targets": ["Linear"],
        "weights": {"num_bits": 4, "type": "int", "strategy": "channel"}}},
      "transform_config": {}})");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(StorageOf(*config, "model.layers.0.mlp.up_proj").method,
            QuantMethod::kCompressedTensors);
}

absl::StatusOr<QuantConfig> ParseHub(const char* config_json) {
  return ParseQuantConfig(nlohmann::json::parse(config_json), "config.json");
}

absl::StatusOr<QuantConfig> ParseHubBlock(const char* quantization_config) {
  return Parse(quantization_config);
}

// The quantization_config of released checkpoints (ring/hub_configs_testing.h), whole config.json
// files where the test has them.
TEST(QuantConfigTest, HubFp8Blocks) {
  namespace hub = hub_configs;
  // DeepSeek-V3: no skip list, so transformers' default keeps lm_head in bf16.
  auto v3 = ParseHub(hub::kDeepseekV3);
  ASSERT_TRUE(v3.ok()) << v3.status();
  EXPECT_EQ(v3->method, QuantMethod::kFp8);
  EXPECT_EQ(v3->block_rows, 128);
  EXPECT_EQ(v3->block_cols, 128);
  EXPECT_FALSE(v3->scale_ue8m0);
  EXPECT_FALSE(v3->fp8_skip_list_given);
  EXPECT_EQ(StorageOf(*v3, "model.layers.0.self_attn.q_a_proj").method, QuantMethod::kFp8);
  EXPECT_EQ(StorageOf(*v3, "model.layers.3.mlp.experts.255.down_proj").method, QuantMethod::kFp8);
  EXPECT_EQ(StorageOf(*v3, "model.layers.61.eh_proj").method, QuantMethod::kFp8);
  EXPECT_EQ(StorageOf(*v3, "lm_head").method, QuantMethod::kNone);
  // DeepSeek-V3.1: power-of-two scales.
  auto v31 = ParseHubBlock(hub::kDeepseekV31QuantizationConfig);
  ASSERT_TRUE(v31.ok()) << v31.status();
  EXPECT_TRUE(v31->scale_ue8m0);
  // Qwen3-30B-A3B-FP8 lists lm_head, the norms and the routers.
  auto qwen = ParseHub(hub::kQwen3_30B_A3BFp8);
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  EXPECT_EQ(qwen->method, QuantMethod::kFp8);
  EXPECT_TRUE(qwen->fp8_skip_list_given);
  EXPECT_EQ(StorageOf(*qwen, "lm_head").method, QuantMethod::kNone);
  EXPECT_EQ(StorageOf(*qwen, "model.layers.1.mlp.gate").method, QuantMethod::kNone);
  EXPECT_EQ(StorageOf(*qwen, "model.layers.1.mlp.experts.5.gate_proj").method, QuantMethod::kFp8);
  EXPECT_EQ(StorageOf(*qwen, "model.layers.11.self_attn.q_proj").method, QuantMethod::kFp8);
}

TEST(QuantConfigTest, HubCompressedTensors) {
  namespace hub = hub_configs;
  // RedHatAI's FP8-dynamic Qwen3-30B-A3B: float weights per channel; input activations quantized
  // per token at run time (read, not applied: the stage computes in full precision).
  auto fp8 = ParseHub(hub::kQwen3_30B_A3BFp8Dynamic);
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  EXPECT_EQ(fp8->method, QuantMethod::kCompressedTensors);
  const LinearStorage expert = StorageOf(*fp8, "model.layers.0.mlp.experts.7.down_proj");
  ASSERT_NE(expert.scheme, nullptr);
  EXPECT_EQ(expert.scheme->storage, CompressedScheme::Storage::kFloat);
  EXPECT_EQ(expert.scheme->strategy, CompressedScheme::Strategy::kChannel);
  EXPECT_EQ(expert.scheme->num_bits, 8);
  EXPECT_EQ(StorageOf(*fp8, "model.layers.0.mlp.gate").method, QuantMethod::kNone);
  EXPECT_EQ(StorageOf(*fp8, "lm_head").method, QuantMethod::kNone);
  // RedHatAI's w4a16 Llama 3.1: int4 groups of 128, packed.
  auto w4a16 = ParseHubBlock(hub::kLlamaW4A16QuantizationConfig);
  ASSERT_TRUE(w4a16.ok()) << w4a16.status();
  const LinearStorage q = StorageOf(*w4a16, "model.layers.31.self_attn.q_proj");
  ASSERT_NE(q.scheme, nullptr);
  EXPECT_EQ(q.scheme->storage, CompressedScheme::Storage::kPacked);
  EXPECT_EQ(q.scheme->strategy, CompressedScheme::Strategy::kGroup);
  EXPECT_EQ(q.scheme->group_size, 128);
  EXPECT_EQ(q.scheme->num_bits, 4);
  EXPECT_TRUE(q.scheme->symmetric);
  EXPECT_EQ(StorageOf(*w4a16, "lm_head").method, QuantMethod::kNone);
}

TEST(QuantConfigTest, HubGptqAwqAndMxfp4) {
  namespace hub = hub_configs;
  // optimum's block (hugging-quants' Llama 3.1 GPTQ): act order, v1 zeros, no lm_head.
  auto gptq = ParseHub(hub::kLlama31_8BInstructGptq);
  ASSERT_TRUE(gptq.ok()) << gptq.status();
  EXPECT_EQ(gptq->method, QuantMethod::kGptq);
  EXPECT_EQ(gptq->bits, 4);
  EXPECT_EQ(gptq->group_size, 128);
  EXPECT_TRUE(gptq->desc_act);
  EXPECT_TRUE(gptq->symmetric);
  EXPECT_EQ(gptq->gptq_zero_offset, 1);
  EXPECT_EQ(StorageOf(*gptq, "model.layers.0.mlp.down_proj").method, QuantMethod::kGptq);
  EXPECT_EQ(StorageOf(*gptq, "lm_head").method, QuantMethod::kNone);
  // GPTQModel's spelling.
  auto gptq_model = ParseHubBlock(hub::kGptqModelQuantizationConfig);
  ASSERT_TRUE(gptq_model.ok()) << gptq_model.status();
  EXPECT_EQ(gptq_model->gptq_zero_offset, 1);
  EXPECT_FALSE(gptq_model->gptq_lm_head);
  EXPECT_FALSE(gptq_model->desc_act);
  // Qwen2.5's AWQ release (modules_to_not_convert null) and Mixtral's (the router kept).
  auto awq = ParseHubBlock(hub::kQwen25AwqQuantizationConfig);
  ASSERT_TRUE(awq.ok()) << awq.status();
  EXPECT_EQ(awq->method, QuantMethod::kAwq);
  EXPECT_EQ(awq->group_size, 128);
  EXPECT_EQ(StorageOf(*awq, "model.layers.0.self_attn.q_proj").method, QuantMethod::kAwq);
  EXPECT_EQ(StorageOf(*awq, "lm_head").method, QuantMethod::kNone);
  auto mixtral = ParseHub(hub::kMixtral8x7BAwq);
  ASSERT_TRUE(mixtral.ok()) << mixtral.status();
  EXPECT_EQ(StorageOf(*mixtral, "model.layers.0.block_sparse_moe.gate").method, QuantMethod::kNone);
  EXPECT_EQ(StorageOf(*mixtral, "model.layers.0.block_sparse_moe.experts.3.w2").method,
            QuantMethod::kAwq);
  // gpt-oss-20b: only the stacked experts are MXFP4.
  auto mxfp4 = ParseHub(hub::kGptOss20B);
  ASSERT_TRUE(mxfp4.ok()) << mxfp4.status();
  EXPECT_EQ(mxfp4->method, QuantMethod::kMxfp4);
  EXPECT_EQ(StorageOf(*mxfp4, "model.layers.0.mlp.experts.gate_up_proj").method,
            QuantMethod::kMxfp4);
  EXPECT_EQ(StorageOf(*mxfp4, "model.layers.23.mlp.experts.down_proj").method, QuantMethod::kMxfp4);
  EXPECT_EQ(StorageOf(*mxfp4, "model.layers.0.self_attn.q_proj").method, QuantMethod::kNone);
  EXPECT_EQ(StorageOf(*mxfp4, "model.layers.0.mlp.router").method, QuantMethod::kNone);
  EXPECT_EQ(StorageOf(*mxfp4, "lm_head").method, QuantMethod::kNone);
  // Unquantized releases parse as none.
  for (const char* json : {hub::kQwen3_30B_A3B, hub::kGptOss20BV5, hub::kDeepseekV3V5}) {
    auto none = ParseHub(json);
    ASSERT_TRUE(none.ok()) << none.status();
    EXPECT_EQ(none->method, QuantMethod::kNone);
  }
}

TEST(QuantConfigTest, UnsupportedSchemesNameTheKey) {
  EXPECT_THAT(ErrorOf(R"({"quant_method": "bitsandbytes"})"), HasSubstr("quant_method"));
  EXPECT_THAT(ErrorOf(R"({"quant_method": "gptq", "bits": 3})"),
              HasSubstr("quantization_config.bits: 3"));
  EXPECT_THAT(ErrorOf(R"({"quant_method": "awq", "version": "gemv"})"), HasSubstr("version"));
  EXPECT_THAT(ErrorOf(R"({"quant_method": "gptq", "checkpoint_format": "marlin"})"),
              HasSubstr("checkpoint_format"));
  EXPECT_THAT(ErrorOf(R"({"quant_method": "fp8", "fmt": "e5m2"})"), HasSubstr("fmt"));
  EXPECT_THAT(ErrorOf(R"({"quant_method": "fp8", "modules_to_convert": ["q_proj"]})"),
              HasSubstr("modules_to_convert"));
  EXPECT_THAT(ErrorOf(R"({"quant_method": "fp8", "weight_block_size": null})"),
              HasSubstr("weight_block_size"));
  EXPECT_THAT(ErrorOf(R"({"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
      "config_groups": {"group_0": {"targets": ["Linear"],
        "weights": {"num_bits": 4, "type": "float", "strategy": "tensor_group"}}}})"),
              HasSubstr("config_groups.group_0.weights.num_bits"));
  EXPECT_THAT(ErrorOf(R"({"quant_method": "compressed-tensors", "format": "pack-quantized",
      "config_groups": {"group_0": {"targets": ["Linear"],
        "weights": {"num_bits": 4, "type": "int", "strategy": "token"}}}})"),
              HasSubstr("config_groups.group_0.weights.strategy"));
  EXPECT_THAT(ErrorOf(R"({"quant_method": "compressed-tensors", "format": "pack-quantized",
      "sparsity_config": {"format": "sparse-24-bitmask"},
      "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4}}}})"),
              HasSubstr("sparsity_config"));
  EXPECT_THAT(ErrorOf(R"({"quant_method": "compressed-tensors", "format": "pack-quantized",
      "transform_config": {"config_groups": {"u": {"type": "hadamard"}}},
      "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4}}}})"),
              HasSubstr("transform_config"));
  EXPECT_THAT(ErrorOf(R"({"quant_method": "compressed-tensors", "format": "pack-quantized",
      "ignore": ["re:(unclosed"],
      "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4}}}})"),
              HasSubstr("ignore"));
}

TEST(QuantConfigTest, LoadReadsASymlinkedConfigAndRefusesAFifoOrDevice) {
  ringserve::testing::TempDir dir;
  const std::string path = dir.path() + "/config.json";
  std::ofstream(dir.path() + "/blob") << R"({"model_type": "llama"})";
  std::filesystem::create_symlink(dir.path() + "/blob", path);
  auto linked = LoadQuantConfig(dir.path());
  ASSERT_TRUE(linked.ok()) << linked.status();
  EXPECT_EQ(linked->method, QuantMethod::kNone);

  std::filesystem::remove(path);
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  absl::StatusOr<QuantConfig> config;
  EXPECT_TRUE(ringserve::testing::ReturnsWithoutAWriter(path, [&] {
    config = LoadQuantConfig(dir.path());
  })) << "loading blocked on the FIFO";
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << config.status();
  EXPECT_THAT(std::string(config.status().message()), HasSubstr(path + ": not a regular file"));

  std::filesystem::remove(path);
  std::filesystem::create_symlink("/dev/zero", path);
  config = LoadQuantConfig(dir.path());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << config.status();
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("character device"));
}

// The coordinator refuses at start every quant_method outside ring/model_config.h's
// kQuantMethods (ParseModelConfig); each of those must be a method this parser reads.
TEST(QuantConfigTest, ReadsEveryQuantMethodTheCoordinatorAccepts) {
  for (std::string_view method : kQuantMethods) {
    auto config = Parse(nlohmann::json{{"quant_method", method}}.dump());
    if (!config.ok()) {  // a required key of that method, never the method itself
      EXPECT_THAT(std::string(config.status().message()),
                  ::testing::Not(HasSubstr("quantization_config.quant_method")))
          << method;
    } else {
      EXPECT_EQ(QuantMethodName(config->method), method);
    }
  }
  EXPECT_THAT(ErrorOf(R"({"quant_method": "bitsandbytes"})"),
              HasSubstr("quantization_config.quant_method"));
}

}  // namespace
}  // namespace ringserve::quant
