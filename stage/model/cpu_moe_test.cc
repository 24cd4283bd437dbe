#include "stage/model/cpu_moe.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "stage/model/model_slice.h"
#include "stage/model/slice_weights.h"
#include "stage/model/testing/safetensors_writer.h"

namespace ringserve {
namespace {

using testing::CopyFile;
using ::testing::HasSubstr;
using testing::SafetensorsBytes;
using testing::TempDir;
using testing::TensorToWrite;
using testing::WriteFile;

// A one-layer gpt-oss model: hidden 4, 3 experts of inter 2, top-2.
constexpr char kGptOssConfig[] = R"({
  "architectures": ["GptOssForCausalLM"], "hidden_size": 4, "intermediate_size": 2,
  "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 2,
  "vocab_size": 8, "max_position_embeddings": 64, "num_local_experts": 3,
  "num_experts_per_tok": 2, "sliding_window": 4, "layer_types": ["sliding_attention"],
  "rope_parameters": {"rope_type": "default", "rope_theta": 150000.0}})";

std::vector<float> Random(int64_t n, std::mt19937& rng, float scale) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

class GptOssMoeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto config = ParseModelConfig(kGptOssConfig);
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
    std::mt19937 rng(11);
    std::vector<TensorToWrite> tensors;
    for (const TensorSpec& spec : MoeLayerTensorSpecs(config_, 0).All()) {
      int64_t n = 1;
      for (int64_t d : spec.shape) n *= d;
      // Large gate/up weights so that the clamp at 7 bites.
      const float scale = spec.name.ends_with("gate_up_proj") ? 6.0f : 0.5f;
      values_[spec.name] = Random(n, rng, scale);
      tensors.push_back({.name = spec.name, .shape = spec.shape, .values = values_[spec.name]});
    }
    ASSERT_TRUE(WriteFile(dir_.path() + "/model.safetensors", SafetensorsBytes(tensors)).ok());
    auto weights = SafetensorsModel::Open(dir_.path());
    ASSERT_TRUE(weights.ok()) << weights.status();
    auto layer = LoadCpuMoeLayer(config_, 0, **weights, quant::QuantConfig{});
    ASSERT_TRUE(layer.ok()) << layer.status();
    layer_ = *std::move(layer);
  }

  TempDir dir_;
  ModelConfig config_;
  std::map<std::string, std::vector<float>> values_;
  CpuMoeLayer layer_;
};

TEST_F(GptOssMoeTest, StackedInterleavedExpertsAreSplitAndTransposed) {
  const auto& gate_up = values_["model.layers.0.mlp.experts.gate_up_proj"];  // [3, 4, 4]
  const auto& down = values_["model.layers.0.mlp.experts.down_proj"];        // [3, 2, 4]
  ASSERT_EQ(layer_.experts.size(), 3u);
  for (int e = 0; e < 3; ++e) {
    for (int h = 0; h < 4; ++h) {
      for (int i = 0; i < 2; ++i) {
        EXPECT_EQ(layer_.experts[e].gate[i * 4 + h], gate_up[(e * 4 + h) * 4 + 2 * i]);
        EXPECT_EQ(layer_.experts[e].up[i * 4 + h], gate_up[(e * 4 + h) * 4 + 2 * i + 1]);
        EXPECT_EQ(layer_.experts[e].down[h * 2 + i], down[(e * 2 + i) * 4 + h]);
      }
    }
  }
  EXPECT_EQ(layer_.experts[2].down_bias[3],
            values_["model.layers.0.mlp.experts.down_proj_bias"][2 * 4 + 3]);
}

// The output equals the formula written out for one token: router logits with bias, the top
// two, softmax over them, each expert's clamped SwiGLU with biases, weighted sum.
TEST_F(GptOssMoeTest, ForwardMatchesTheFormulaAndTheClampBites) {
  const std::vector<float> x = {0.9f, -1.2f, 0.4f, 1.5f};
  std::vector<float> out(4);
  CpuMoeForward(config_.moe, 4, layer_, x.data(), 1, out.data());

  const auto& rw = values_["model.layers.0.mlp.router.weight"];
  const auto& rb = values_["model.layers.0.mlp.router.bias"];
  std::vector<float> logits(3);
  for (int e = 0; e < 3; ++e) {
    logits[e] = rb[e];
    for (int h = 0; h < 4; ++h) logits[e] += rw[e * 4 + h] * x[h];
  }
  int worst = 0;
  for (int e = 1; e < 3; ++e) worst = logits[e] < logits[worst] ? e : worst;
  float denom = 0;
  for (int e = 0; e < 3; ++e) denom += e == worst ? 0.0f : std::exp(logits[e]);
  const auto& gu = values_["model.layers.0.mlp.experts.gate_up_proj"];
  const auto& gub = values_["model.layers.0.mlp.experts.gate_up_proj_bias"];
  const auto& dw = values_["model.layers.0.mlp.experts.down_proj"];
  const auto& db = values_["model.layers.0.mlp.experts.down_proj_bias"];
  std::vector<float> want(4, 0.0f);
  int clamped = 0;
  for (int e = 0; e < 3; ++e) {
    if (e == worst) continue;
    float act[2];
    for (int i = 0; i < 2; ++i) {
      float g = gub[e * 4 + 2 * i], u = gub[e * 4 + 2 * i + 1];
      for (int h = 0; h < 4; ++h) {
        g += x[h] * gu[(e * 4 + h) * 4 + 2 * i];
        u += x[h] * gu[(e * 4 + h) * 4 + 2 * i + 1];
      }
      clamped += (g > 7.0f) + (std::abs(u) > 7.0f);
      g = std::min(g, 7.0f);
      u = std::max(-7.0f, std::min(u, 7.0f));
      act[i] = (u + 1.0f) * g / (1.0f + std::exp(-1.702f * g));
    }
    const float w = std::exp(logits[e]) / denom;
    for (int h = 0; h < 4; ++h) {
      float y = db[e * 4 + h];
      for (int i = 0; i < 2; ++i) y += act[i] * dw[(e * 2 + i) * 4 + h];
      want[h] += w * y;
    }
  }
  EXPECT_GT(clamped, 0) << "the test input does not exercise the clamp";
  for (int h = 0; h < 4; ++h) EXPECT_NEAR(out[h], want[h], 1e-4f * (1 + std::abs(want[h])));
}

TEST(MoeConfigTest, GptOssRefusesAnotherSwigluLimitAndQuantizedCheckpoints) {
  std::string text = kGptOssConfig;
  text.insert(text.rfind('}'), R"(, "swiglu_limit": 5.0)");
  EXPECT_THAT(ParseModelConfig(text).status().message(), HasSubstr("swiglu_limit"));
  text = kGptOssConfig;
  text.insert(text.rfind('}'), R"(, "quantization_config": {"quant_method": "fp8"})");
  EXPECT_THAT(ParseModelConfig(text).status().message(),
              HasSubstr("quantization_config.quant_method \"fp8\""));
  text = kGptOssConfig;
  text.insert(text.rfind('}'), R"(, "quantization_config": {"quant_method": "mxfp4"})");
  EXPECT_TRUE(ParseModelConfig(text).ok()) << ParseModelConfig(text).status();
}

// A stage reads only its own layers' experts: the GLM-4.5 fixture with layers 0 and 1 removed
// from the checkpoint still loads as the slice [2, 3), and the slice [1, 3) fails naming a
// missing layer-1 tensor.
TEST(CpuMoeSliceTest, StageReadsOnlyItsOwnLayersExperts) {
  const char* source = std::getenv("RINGSERVE_SOURCE_DIR");
  const std::string fixture =
      std::string(source ? source : ".") + "/tests/fixtures/models/glm4_moe";
  auto file = SafetensorsFile::Open(fixture + "/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<TensorToWrite> kept;
  for (const auto& [name, info] : (*file)->tensors()) {
    if (name.starts_with("model.layers.0.") || name.starts_with("model.layers.1.")) continue;
    ASSERT_EQ(info.dtype, DType::kF32);
    const std::span<const uint8_t> bytes = (*file)->Bytes(info);
    std::vector<float> values(info.NumElements());
    std::memcpy(values.data(), bytes.data(), bytes.size());
    kept.push_back({.name = name, .shape = info.shape, .values = std::move(values)});
  }
  TempDir dir;
  ASSERT_TRUE(CopyFile(fixture + "/config.json", dir.path() + "/config.json").ok());
  ASSERT_TRUE(WriteFile(dir.path() + "/model.safetensors", SafetensorsBytes(kept)).ok());
  auto last = ModelSlice::LoadCpu(
      {.model_dir = dir.path(), .layers = {2, 3}, .kv_block_size = 4, .kv_num_blocks = 4});
  EXPECT_TRUE(last.ok()) << last.status();
  auto two = ModelSlice::LoadCpu(
      {.model_dir = dir.path(), .layers = {1, 3}, .kv_block_size = 4, .kv_num_blocks = 4});
  ASSERT_FALSE(two.ok());
  EXPECT_THAT(two.status().message(), HasSubstr("model.layers.1."));
}

}  // namespace
}  // namespace ringserve
