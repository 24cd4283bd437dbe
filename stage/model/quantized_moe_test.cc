// Quantized MoE checkpoints on the CPU slice. Each float MoE fixture (tests/fixtures/models) is
// copied into a temp dir quantized in a hub layout by C++ reference quantizers
// (testing/quantized_copy.h) beside its DEQUANTIZED float copy; then
//   * every quantized tensor -- attention, dense MLP, each expert, shared experts, gpt-oss's
//     stacked MXFP4 experts -- reads back (ReadWeightFloat) as exactly the writer's dequantized
//     values (the format's rule), and the MoE layers load (LoadCpuMoeLayer) equal to the float
//     copy's, expert by expert;
//   * the CPU slice on the quantized copy gives the float copy's logits bit for bit on a prefill
//     and greedy decode steps (and DeepSeek's MTP layer, on the dense deepseek_v3 fixture which
//     has one, its draft logits), so routers and all else the config leaves unquantized stay
//     float;
//   * a 2-stage split of the quantized copy equals the whole slice.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "ring/model_config.h"
#include "stage/model/cpu_model_slice.h"
#include "stage/model/cpu_moe.h"
#include "stage/model/cpu_mtp_layer.h"
#include "stage/model/packed_weights.h"
#include "stage/model/quantized_weights.h"
#include "stage/model/slice_weights.h"
#include "stage/model/testing/latent512_deepseek.h"
#include "stage/model/testing/quantized_copy.h"
#include "stage/model/testing/safetensors_writer.h"
#include "stage/sampling/sampler.h"

namespace ringserve {
namespace {

using testing::CopyFormat;
using testing::CopyOptions;
using ::testing::HasSubstr;
using testing::WriteLatent512Moe;

std::string Fixture(const std::string& name) {
  const char* root = std::getenv("RINGSERVE_SOURCE_DIR");
  return std::string(root != nullptr ? root : ".") + "/tests/fixtures/models/" + name;
}

absl::Status WriteWideGptOss(const std::string& dir) {
  return testing::WriteMxfp4ReadyGptOss(Fixture("gpt_oss"), dir);
}

struct Case {
  std::string name;     // test name
  std::string fixture;  // tests/fixtures/models/<fixture>, or "gpt_oss_wide"
  CopyOptions options;
};

std::ostream& operator<<(std::ostream& os, const Case& c) { return os << c.name; }

class QuantizedMoeTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const Case& c = GetParam();
    std::string src = Fixture(c.fixture);
    if (c.fixture == "gpt_oss_wide") {
      src = tmp_.path() + "/src";
      ASSERT_TRUE(WriteWideGptOss(src).ok());
    } else if (c.fixture == "deepseek_latent512") {
      src = tmp_.path() + "/src";
      const absl::Status written = WriteLatent512Moe(src);
      ASSERT_TRUE(written.ok()) << written;
    }
    quant_dir_ = tmp_.path() + "/quant";
    float_dir_ = tmp_.path() + "/float";
    auto copy = testing::WriteQuantizedCopy(src, c.options, quant_dir_, float_dir_);
    ASSERT_TRUE(copy.ok()) << copy.status();
    copy_ = *std::move(copy);
    ASSERT_FALSE(copy_.dequantized.empty());
    auto config = LoadModelConfig(quant_dir_);
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
  }

  // Prefill of a 9-token prompt (all logits) and 4 greedy decode steps; the logits of each.
  std::vector<std::vector<float>> Run(ModelSlice& slice) {
    std::vector<std::vector<float>> out;
    std::vector<int32_t> table(16);
    for (int i = 0; i < 16; ++i) table[i] = 15 - i;
    MicroBatch prefill;
    prefill.chunks.push_back({.seq_id = 1,
                              .start_position = 0,
                              .num_tokens = 9,
                              .block_table = table,
                              .logits = LogitsMode::kAllTokens});
    prefill.token_ids = {5, 17, 99, 3, 42, 64, 8, 120, 31};
    auto logits = slice.Forward(prefill, {});
    EXPECT_TRUE(logits.ok()) << logits.status();
    if (!logits.ok()) return out;
    out.push_back(*logits);
    std::vector<float> last(logits->end() - config_.vocab_size, logits->end());
    for (int step = 0; step < 4; ++step) {
      MicroBatch decode;
      decode.chunks.push_back({.seq_id = 1,
                               .start_position = 9 + step,
                               .num_tokens = 1,
                               .block_table = table,
                               .logits = LogitsMode::kLastToken});
      decode.token_ids = {GreedyToken(last)};
      auto next = slice.Forward(decode, {});
      EXPECT_TRUE(next.ok()) << next.status();
      if (!next.ok()) return out;
      out.push_back(*next);
      last = *next;
    }
    return out;
  }

  SliceOptions Options(const std::string& dir, LayerRange layers) const {
    return {.model_dir = dir, .layers = layers, .kv_block_size = 4, .kv_num_blocks = 16};
  }

  ringserve::testing::TempDir tmp_;
  std::string quant_dir_, float_dir_;
  testing::QuantizedCopy copy_;
  ModelConfig config_;
};

TEST_P(QuantizedMoeTest, EveryQuantizedTensorReadsBackAsTheFormatRule) {
  auto quant = quant::LoadQuantConfig(quant_dir_);
  ASSERT_TRUE(quant.ok()) << quant.status();
  auto weights = SafetensorsModel::Open(quant_dir_);
  ASSERT_TRUE(weights.ok()) << weights.status();
  auto float_weights = SafetensorsModel::Open(float_dir_);
  ASSERT_TRUE(float_weights.ok()) << float_weights.status();
  int experts = 0;
  for (const auto& [name, want] : copy_.dequantized) {
    SCOPED_TRACE(name);
    const bool stacked =
        name.ends_with("experts.gate_up_proj") || name.ends_with("experts.down_proj");
    // The float copy's tensor gives the shape.
    auto float_view = (*float_weights)->GetAnyShape(name);
    ASSERT_TRUE(float_view.ok()) << float_view.status();
    const TensorSpec spec{.name = name,
                          .shape = float_view->info->shape,
                          .linear = !stacked,
                          .stacked_experts = stacked};
    EXPECT_TRUE(IsQuantizedWeight(*quant, spec));
    auto got = ReadWeightFloat(**weights, *quant, spec);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ((*got)[i], want[i]) << "at " << i;
    experts += name.find(".experts.") != std::string::npos ? 1 : 0;
  }
  if (config_.moe.enabled()) {
    EXPECT_GT(experts, 0) << "no expert was quantized";
  }
  // Expert by expert, the MoE blocks equal the float copy's (gpt-oss: split and transposed).
  for (int layer = 0; layer < config_.num_layers; ++layer) {
    if (!config_.moe.IsMoeLayer(layer)) continue;
    auto q = LoadCpuMoeLayer(config_, layer, **weights, *quant);
    ASSERT_TRUE(q.ok()) << q.status();
    auto f = LoadCpuMoeLayer(config_, layer, **float_weights, quant::QuantConfig{});
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ(q->router, f->router);
    EXPECT_EQ(q->correction_bias, f->correction_bias);
    ASSERT_EQ(q->experts.size(), f->experts.size());
    for (size_t x = 0; x < q->experts.size(); ++x) {
      EXPECT_EQ(q->experts[x].gate, f->experts[x].gate) << "layer " << layer << " expert " << x;
      EXPECT_EQ(q->experts[x].up, f->experts[x].up) << "layer " << layer << " expert " << x;
      EXPECT_EQ(q->experts[x].down, f->experts[x].down) << "layer " << layer << " expert " << x;
      EXPECT_EQ(q->experts[x].gate_bias, f->experts[x].gate_bias);
    }
    EXPECT_EQ(q->shared.gate, f->shared.gate);
    EXPECT_EQ(q->shared.down, f->shared.down);
  }
}

TEST_P(QuantizedMoeTest, SliceEqualsTheDequantizedFloatCheckpoint) {
  const LayerRange all{0, config_.num_layers};
  auto quantized = CpuModelSlice::Load(Options(quant_dir_, all));
  ASSERT_TRUE(quantized.ok()) << quantized.status();
  auto reference = CpuModelSlice::Load(Options(float_dir_, all));
  ASSERT_TRUE(reference.ok()) << reference.status();
  const auto got = Run(**quantized);
  const auto want = Run(**reference);
  ASSERT_EQ(got.size(), 5u);
  ASSERT_EQ(want.size(), 5u);
  for (size_t step = 0; step < got.size(); ++step) {
    EXPECT_EQ(got[step], want[step]) << "step " << step << " (0: prefill)";
  }
  // DeepSeek's MTP layer (quantized as the decoder layers are) drafts as the float one does.
  if (GetParam().fixture == "deepseek_v3") {
    ASSERT_NE((*reference)->mtp(), nullptr);
  }
  if ((*reference)->mtp() != nullptr) {
    ASSERT_NE((*quantized)->mtp(), nullptr) << "the quantized MTP layer did not load";
    MicroBatch batch;
    batch.chunks.push_back({.seq_id = 2,
                            .start_position = 0,
                            .num_tokens = 3,
                            .block_table = {0, 1, 2},
                            .logits = LogitsMode::kAllTokens});
    batch.token_ids = {7, 8, 9};
    std::vector<float> hidden(3 * config_.hidden_size);
    for (size_t i = 0; i < hidden.size(); ++i) hidden[i] = std::sin(0.37f * i);
    auto q = (*quantized)->mtp()->Forward(batch, hidden);
    auto f = (*reference)->mtp()->Forward(batch, hidden);
    ASSERT_TRUE(q.ok()) << q.status();
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ(*q, *f);
  }
}

// Two stages of the quantized checkpoint, hidden states handed on, give the whole slice's logits.
TEST_P(QuantizedMoeTest, TwoStagesEqualTheWholeSlice) {
  const int split = config_.num_layers / 2 > 0 ? config_.num_layers / 2 : 1;
  auto whole = CpuModelSlice::Load(Options(quant_dir_, {0, config_.num_layers}));
  ASSERT_TRUE(whole.ok()) << whole.status();
  auto first = CpuModelSlice::Load(Options(quant_dir_, {0, split}));
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = CpuModelSlice::Load(Options(quant_dir_, {split, config_.num_layers}));
  ASSERT_TRUE(second.ok()) << second.status();
  MicroBatch batch;
  batch.chunks.push_back({.seq_id = 3,
                          .start_position = 0,
                          .num_tokens = 5,
                          .block_table = {3, 4},
                          .logits = LogitsMode::kAllTokens});
  batch.token_ids = {11, 22, 33, 44, 55};
  auto want = (*whole)->Forward(batch, {});
  ASSERT_TRUE(want.ok()) << want.status();
  auto hidden = (*first)->Forward(batch, {});
  ASSERT_TRUE(hidden.ok()) << hidden.status();
  auto got = (*second)->Forward(batch, *hidden);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), want->size());
  for (size_t i = 0; i < got->size(); ++i) {
    ASSERT_NEAR((*got)[i], (*want)[i], 1e-5f * (1 + std::abs((*want)[i]))) << "at " << i;
  }
}

CopyOptions Opt(CopyFormat format, int block, std::vector<std::string> keep = {}) {
  return {.format = format, .block = block, .keep_float = std::move(keep)};
}

INSTANTIATE_TEST_SUITE_P(
    Formats, QuantizedMoeTest,
    ::testing::Values(
        // fp8 blocks of 16: partial edge blocks (12-row experts); layer 1 (dense) and one
        // expert left in float through modules_to_not_convert.
        Case{"Qwen3MoeFp8Block", "qwen3_moe",
             Opt(CopyFormat::kFp8Block, 16,
                 {"model.layers.1.mlp", "model.layers.2.mlp.experts.3.down_proj"})},
        Case{"Glm4MoeFp8BlockUe8m0", "glm4_moe", Opt(CopyFormat::kFp8BlockUe8m0, 16)},
        // DeepSeek-V3's own 128x128 blocks: every matrix one partial block; MLA, dense layer 0,
        // shared experts and the MTP layer included.
        Case{"DeepseekV3Fp8Block128", "deepseek_v3_moe", Opt(CopyFormat::kFp8Block, 128)},
        // compressed-tensors int4 groups of 8 (the experts' 12 inputs: a partial group) with an
        // expert in `ignore`.
        Case{"MixtralCompressedInt4", "mixtral",
             Opt(CopyFormat::kCompressedInt4, 8, {"model.layers.1.block_sparse_moe.experts.2.w2"})},
        Case{"DeepseekV3CompressedInt4", "deepseek_v3_moe", Opt(CopyFormat::kCompressedInt4, 8)},
        Case{"Qwen3MoeCompressedFp8", "qwen3_moe", Opt(CopyFormat::kCompressedFp8, 0)},
        Case{"DeepseekV3Gptq", "deepseek_v3_moe", Opt(CopyFormat::kGptq4, 8)},
        // The GPU test's DeepSeek sources (real latent sizes).
        Case{"DeepseekV3Latent512Fp8Block128", "deepseek_latent512",
             Opt(CopyFormat::kFp8Block, 128)},
        Case{"DeepseekV3Latent512Awq", "deepseek_latent512", Opt(CopyFormat::kAwq4, 8)},
        Case{"DeepseekV3Awq", "deepseek_v3_moe",
             Opt(CopyFormat::kAwq4, 8, {"model.layers.1.mlp.shared_experts.down_proj"})},
        Case{"GptOssMxfp4", "gpt_oss_wide", Opt(CopyFormat::kMxfp4, 32)},
        // Dense DeepSeek-V3 (layers and its MTP layer quantized, eh_proj and heads float).
        Case{"DeepseekV3DenseMtpFp8Block", "deepseek_v3", Opt(CopyFormat::kFp8Block, 16)}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// Refusals name the key or the tensor.
TEST(QuantizedMoeRefusalTest, StackedExpertsOtherThanMxfp4AndMxfp4ElsewhereAreRefused) {
  ringserve::testing::TempDir tmp;
  const std::string src = tmp.path() + "/src";
  ASSERT_TRUE(WriteWideGptOss(src).ok());
  // A gpt-oss config saying fp8: refused at config parse, naming the key.
  std::ifstream in(src + "/config.json");
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(text.str());
  j["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}};
  EXPECT_THAT(ParseModelConfig(j.dump()).status().message(),
              HasSubstr("quantization_config.quant_method \"fp8\""));
  // The loader itself refuses stacked experts under another method, naming the tensor.
  auto config = ParseModelConfig(text.str());
  ASSERT_TRUE(config.ok()) << config.status();
  auto quant = quant::ParseQuantConfig(j, "config.json");
  ASSERT_TRUE(quant.ok()) << quant.status();
  auto weights = SafetensorsModel::Open(src);
  ASSERT_TRUE(weights.ok());
  auto layer = LoadCpuMoeLayer(*config, 0, **weights, *quant);
  EXPECT_THAT(layer.status().message(), HasSubstr("model.layers.0.mlp.experts.gate_up_proj"));
  // MXFP4 on an MoE model other than gpt-oss: refused naming the key.
  std::ifstream qwen(Fixture("qwen3_moe") + "/config.json");
  std::stringstream qwen_text;
  qwen_text << qwen.rdbuf();
  nlohmann::json q = nlohmann::json::parse(qwen_text.str());
  q["quantization_config"] = {{"quant_method", "mxfp4"}};
  EXPECT_THAT(ParseModelConfig(q.dump()).status().message(), HasSubstr("quant_method \"mxfp4\""));
}

// gpt-oss's MXFP4 experts packed for the CUDA kernels (ReadPackedMxfp4Expert): each expert's
// stored [out, in] rows unpack to exactly the transpose of the [in, out] values the loader
// dequantizes, for gate_up and down of every layer.
TEST(QuantizedMoeMxfp4PackTest, ExpertsPackToTheDequantizedValues) {
  ringserve::testing::TempDir tmp;
  ASSERT_TRUE(WriteWideGptOss(tmp.path() + "/src").ok());
  auto copy = testing::WriteQuantizedCopy(tmp.path() + "/src", Opt(CopyFormat::kMxfp4, 32),
                                          tmp.path() + "/quant", tmp.path() + "/float");
  ASSERT_TRUE(copy.ok()) << copy.status();
  auto config = LoadModelConfig(tmp.path() + "/quant");
  ASSERT_TRUE(config.ok()) << config.status();
  auto quant = quant::LoadQuantConfig(tmp.path() + "/quant");
  ASSERT_TRUE(quant.ok()) << quant.status();
  auto weights = SafetensorsModel::Open(tmp.path() + "/quant");
  ASSERT_TRUE(weights.ok()) << weights.status();
  int checked = 0;
  for (int layer = 0; layer < config->num_layers; ++layer) {
    const MoeTensorSpecs specs = MoeLayerTensorSpecs(*config, layer);
    for (const TensorSpec* spec : {&*specs.gate_up, &*specs.stacked_down}) {
      auto want = ReadWeightFloat(**weights, *quant, *spec);
      ASSERT_TRUE(want.ok()) << want.status();
      const int64_t e = spec->shape[0], in = spec->shape[1], out = spec->shape[2];
      for (int64_t x = 0; x < e; ++x) {
        auto packed = ReadPackedMxfp4Expert(**weights, *spec, x);
        ASSERT_TRUE(packed.ok()) << packed.status();
        ASSERT_TRUE(packed->matrix.has_value()) << packed->why_not;
        ASSERT_EQ(packed->matrix->format, quant::PackedFormat::kFp4);
        ASSERT_EQ(packed->matrix->rows, out);
        ASSERT_EQ(packed->matrix->cols, in);
        const std::vector<float> got = quant::UnpackMatrix(*packed->matrix);
        for (int64_t o = 0; o < out; ++o) {
          for (int64_t i = 0; i < in; ++i) {
            ASSERT_EQ(got[o * in + i], (*want)[(x * in + i) * out + o])
                << spec->name << " expert " << x << " [" << o << ", " << i << "]";
          }
        }
        ++checked;
      }
    }
    EXPECT_EQ(ReadPackedMxfp4Expert(**weights, *specs.gate_up, config->moe.router.num_experts)
                  .status()
                  .code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(checked, config->num_layers * 2 * config->moe.router.num_experts);
}

// A quantized expert missing from the checkpoint fails naming the tensor and the format.
TEST(QuantizedMoeRefusalTest, MissingExpertTensorIsNamed) {
  ringserve::testing::TempDir tmp;
  // Attention left in float: the experts are the first quantized tensors the slice reads.
  auto copy = testing::WriteQuantizedCopy(Fixture("qwen3_moe"),
                                          Opt(CopyFormat::kFp8Block, 16, {"self_attn"}),
                                          tmp.path() + "/q", tmp.path() + "/f");
  ASSERT_TRUE(copy.ok()) << copy.status();
  // Rewrite the config to say compressed-tensors: the expert's weight_packed is not there.
  std::ifstream in(tmp.path() + "/q/config.json");
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(text.str());
  j["quantization_config"] = {
      {"quant_method", "compressed-tensors"},
      {"format", "pack-quantized"},
      {"ignore", {"lm_head"}},
      {"config_groups",
       {{"group_0",
         {{"targets", {"re:.*experts.*"}},
          {"weights", {{"num_bits", 4}, {"type", "int"}, {"strategy", "channel"}}}}}}}};
  ASSERT_TRUE(testing::WriteFile(tmp.path() + "/q/config.json", j.dump()).ok());
  auto slice = CpuModelSlice::Load(
      {.model_dir = tmp.path() + "/q", .layers = {0, 3}, .kv_block_size = 4, .kv_num_blocks = 4});
  ASSERT_FALSE(slice.ok());
  EXPECT_THAT(slice.status().message(), HasSubstr("model.layers.0.mlp.experts.0.gate_proj"));
  EXPECT_THAT(slice.status().message(), HasSubstr("compressed-tensors"));
}

}  // namespace
}  // namespace ringserve
