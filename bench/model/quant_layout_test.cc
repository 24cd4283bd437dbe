// make_random_model --quant (quant_layout.h): each format's checkpoint is read back by the model
// core's own loaders as that format (quantization_config parsed, every linear weight dequantized
// with about init_std, and packed exactly into the CUDA layout: stage/model/packed_weights.h), and
// the CPU slice runs it to finite logits. Bad requests fail naming the reason.
#include "bench/model/quant_layout.h"

#include <cmath>
#include <filesystem>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ring/model_config.h"
#include "stage/model/model_slice.h"
#include "stage/model/packed_weights.h"
#include "stage/model/quantized_weights.h"
#include "stage/model/slice_weights.h"

namespace ringserve {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

ModelShape SmallShape() {
  ModelShape shape = *FindShape("tiny");
  shape.hidden_size = 256;
  shape.intermediate_size = 512;
  shape.num_heads = 4;
  shape.num_kv_heads = 2;
  shape.head_dim = 64;
  shape.vocab_size = 1000;
  shape.bos_token_id = 1;
  shape.eos_token_ids = {2};
  return shape;
}

struct Case {
  CheckpointQuant quant;
  quant::QuantMethod method;
  quant::PackedFormat format;
  int64_t group;  // packed group columns; 0 = all input columns
};

class QuantLayoutTest : public ::testing::TestWithParam<Case> {};

TEST_P(QuantLayoutTest, LoadersReadTheCheckpointAsItsFormat) {
  const Case c = GetParam();
  const fs::path dir = fs::path(::testing::TempDir()) /
                       ("quant_layout_" + std::string(CheckpointQuantName(c.quant)));
  fs::remove_all(dir);
  RandomModelOptions options{.output_dir = dir.string(),
                             .shape = SmallShape(),
                             .seed = 3,
                             .init_std = 0.02,
                             .num_threads = 2,
                             .tokenizers_dir = "",
                             .quant = c.quant};
  auto written = WriteRandomModel(options);
  ASSERT_TRUE(written.ok()) << written.status();

  auto config = LoadModelConfig(dir.string());
  ASSERT_TRUE(config.ok()) << config.status();
  auto q = quant::LoadQuantConfig(dir.string());
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->method, c.method);
  auto weights = SafetensorsModel::Open(dir.string());
  ASSERT_TRUE(weights.ok()) << weights.status();
  int linear = 0;
  for (int layer = 0; layer < config->num_layers; ++layer) {
    for (const TensorSpec& spec : LayerTensorSpecs(*config, layer)) {
      if (!spec.linear) continue;
      ++linear;
      ASSERT_TRUE(IsQuantizedWeight(*q, spec)) << spec.name;
      auto w = ReadWeightFloat(**weights, *q, spec);
      ASSERT_TRUE(w.ok()) << w.status();
      double sum2 = 0;
      for (float v : *w) sum2 += double{v} * v;
      const double std = std::sqrt(sum2 / static_cast<double>(w->size()));
      EXPECT_GT(std, 0.01) << spec.name;
      EXPECT_LT(std, 0.04) << spec.name;
      auto packed = ReadPackedWeight(**weights, *q, spec);
      ASSERT_TRUE(packed.ok()) << packed.status();
      ASSERT_TRUE(packed->matrix.has_value()) << spec.name << ": " << packed->why_not;
      EXPECT_EQ(packed->matrix->format, c.format);
      EXPECT_EQ(packed->matrix->group_cols, c.group > 0 ? c.group : spec.shape[1]);
    }
  }
  EXPECT_EQ(linear, 2 * 7);
  // lm_head stays bf16.
  EXPECT_FALSE(IsQuantizedWeight(*q, LmHeadSpec(*config, **weights)));

  auto slice = ModelSlice::LoadCpu({.model_dir = dir.string(),
                                    .layers = {0, config->num_layers},
                                    .kv_block_size = 4,
                                    .kv_num_blocks = 4});
  ASSERT_TRUE(slice.ok()) << slice.status();
  MicroBatch batch;
  batch.chunks.push_back({.seq_id = 0,
                          .start_position = 0,
                          .num_tokens = 5,
                          .block_table = {0, 1},
                          .logits = LogitsMode::kLastToken});
  batch.token_ids = {1, 17, 400, 999, 3};
  auto logits = (*slice)->Forward(batch, {});
  ASSERT_TRUE(logits.ok()) << logits.status();
  ASSERT_EQ(static_cast<int>(logits->size()), config->vocab_size);
  for (float v : *logits) ASSERT_TRUE(std::isfinite(v));
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Formats, QuantLayoutTest,
    ::testing::Values(Case{CheckpointQuant::kInt4G128, quant::QuantMethod::kCompressedTensors,
                           quant::PackedFormat::kInt4, 128},
                      Case{CheckpointQuant::kInt8, quant::QuantMethod::kCompressedTensors,
                           quant::PackedFormat::kInt8, 0},
                      Case{CheckpointQuant::kFp8Block, quant::QuantMethod::kFp8,
                           quant::PackedFormat::kFp8, 128}),
    [](const auto& info) {
      std::string name(CheckpointQuantName(info.param.quant));
      for (char& ch : name) ch = ch == '-' ? '_' : ch;
      return name;
    });

// --quant fp8-block on MoE shapes: every expert and shared expert is written in the hub's FP8
// block layout (routers stay float), and the CPU slice loads and runs the checkpoint.
class QuantLayoutMoeTest : public ::testing::TestWithParam<std::string> {};

TEST_P(QuantLayoutMoeTest, Fp8BlockMoeCheckpointLoadsAndRuns) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("quant_layout_moe_" + GetParam());
  fs::remove_all(dir);
  RandomModelOptions options{.output_dir = dir.string(),
                             .shape = *FindShape(GetParam()),
                             .seed = 3,
                             .init_std = 0.02,
                             .num_threads = 2,
                             .tokenizers_dir = "",
                             .quant = CheckpointQuant::kFp8Block};
  auto written = WriteRandomModel(options);
  ASSERT_TRUE(written.ok()) << written.status();
  auto config = LoadModelConfig(dir.string());
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_TRUE(config->moe.enabled());
  auto q = quant::LoadQuantConfig(dir.string());
  ASSERT_TRUE(q.ok()) << q.status();
  auto weights = SafetensorsModel::Open(dir.string());
  ASSERT_TRUE(weights.ok()) << weights.status();
  int experts = 0;
  for (int layer = 0; layer < config->num_layers; ++layer) {
    if (!config->moe.IsMoeLayer(layer)) continue;
    const MoeTensorSpecs specs = MoeLayerTensorSpecs(*config, layer);
    EXPECT_FALSE(IsQuantizedWeight(*q, specs.router));
    for (const TensorSpec& spec : specs.All()) {
      if (!spec.linear) continue;
      ASSERT_TRUE(IsQuantizedWeight(*q, spec)) << spec.name;
      ASSERT_TRUE(
          (*weights)->Contains(spec.name.substr(0, spec.name.size() - 7) + ".weight_scale_inv"))
          << spec.name;
      ++experts;
    }
  }
  EXPECT_GT(experts, 0);
  auto slice = ModelSlice::LoadCpu({.model_dir = dir.string(),
                                    .layers = {0, config->num_layers},
                                    .kv_block_size = 4,
                                    .kv_num_blocks = 4});
  ASSERT_TRUE(slice.ok()) << slice.status();
  MicroBatch batch;
  batch.chunks.push_back({.seq_id = 0,
                          .start_position = 0,
                          .num_tokens = 5,
                          .block_table = {0, 1},
                          .logits = LogitsMode::kLastToken});
  batch.token_ids = {1, 17, 40, 99, 3};
  auto logits = (*slice)->Forward(batch, {});
  ASSERT_TRUE(logits.ok()) << logits.status();
  for (float v : *logits) ASSERT_TRUE(std::isfinite(v));
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(MoeShapes, QuantLayoutMoeTest,
                         ::testing::Values("tiny-qwen3-moe", "tiny-deepseek-v3", "tiny-glm4-moe"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& ch : name) ch = ch == '-' ? '_' : ch;
                           return name;
                         });

TEST(QuantLayoutErrorsTest, UnpackableShapesAndUnknownFormatsAreRefused) {
  EXPECT_THAT(std::string(ParseCheckpointQuant("mxfp4").status().message()), HasSubstr("experts"));
  EXPECT_EQ(ParseCheckpointQuant("int3").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*ParseCheckpointQuant("fp8-block"), CheckpointQuant::kFp8Block);
  // The tiny shape's 64 input features are not a multiple of the 128-column groups.
  const fs::path dir = fs::path(::testing::TempDir()) / "quant_layout_tiny";
  RandomModelOptions options{.output_dir = dir.string(),
                             .shape = *FindShape("tiny"),
                             .num_threads = 1,
                             .tokenizers_dir = "",
                             .quant = CheckpointQuant::kInt4G128};
  auto written = WriteRandomModel(options);
  ASSERT_FALSE(written.ok());
  EXPECT_THAT(std::string(written.status().message()), HasSubstr("do not pack"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ringserve
