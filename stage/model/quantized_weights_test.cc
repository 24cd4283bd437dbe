// The shared loader on checkpoints in the hub's layouts (tests/fixtures/models/quant/<format>,
// written by scripts/make_quant_fixtures.py): every dequantized linear weight must equal the
// writer's reference dequantization (its float64 sum and index-weighted sum, from golden.json),
// and broken or mismatched checkpoints fail with errors naming the tensor or key.
#include "stage/model/quantized_weights.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "ring/model_config.h"
#include "stage/model/model_slice.h"
#include "stage/model/quant/fp8_block.h"
#include "stage/model/quant/mxfp4.h"
#include "stage/model/testing/safetensors_writer.h"

namespace ringserve {
namespace {

using ::testing::HasSubstr;

std::string QuantFixture(const std::string& format) {
  const char* root = std::getenv("RINGSERVE_SOURCE_DIR");
  return std::string(root != nullptr ? root : ".") + "/tests/fixtures/models/quant/" + format;
}

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str());
}

class QuantizedFixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(QuantizedFixtureTest, EveryLinearWeightEqualsTheReferenceDequantization) {
  const std::string dir = QuantFixture(GetParam());
  auto config = LoadModelConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  auto quant = quant::LoadQuantConfig(dir);
  ASSERT_TRUE(quant.ok()) << quant.status();
  ASSERT_NE(quant->method, quant::QuantMethod::kNone);
  auto weights = SafetensorsModel::Open(dir);
  ASSERT_TRUE(weights.ok()) << weights.status();
  const nlohmann::json sums = ReadJson(dir + "/golden.json").at("dequantized_checksums");
  int quantized = 0, checked = 0;
  for (const TensorSpec& spec : SliceTensorSpecs(*config, {0, config->num_layers}, **weights)) {
    if (!spec.linear || spec.name == "lm_head.weight") continue;
    quantized += IsQuantizedWeight(*quant, spec) ? 1 : 0;
    auto w = ReadWeightFloat(**weights, *quant, spec);
    ASSERT_TRUE(w.ok()) << w.status();
    double sum = 0, weighted = 0, magnitude = 0;
    for (size_t i = 0; i < w->size(); ++i) {
      sum += (*w)[i];
      weighted += static_cast<double>((*w)[i]) * static_cast<double>(static_cast<int>(i % 97) - 48);
      magnitude += std::fabs((*w)[i]) * 48;
    }
    const nlohmann::json& want = sums.at(spec.name);
    EXPECT_NEAR(sum, want.at("sum").get<double>(), 1e-12 * magnitude) << spec.name;
    EXPECT_NEAR(weighted, want.at("weighted").get<double>(), 1e-12 * magnitude) << spec.name;
    ++checked;
  }
  EXPECT_EQ(checked, 14);
  EXPECT_GE(quantized, 13) << "the fixture should quantize all but at most one linear layer";
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantizedFixtureTest,
                         ::testing::Values("fp8_block", "fp8_hf", "ct_int4", "ct_int8", "ct_fp8",
                                           "gptq_int4", "gptq_int8", "awq_int4"),
                         [](const auto& info) { return info.param; });

// An FP8 file whose skip list leaves lm_head out (transformers then quantizes it) but whose
// writer stored lm_head in bf16: read as stored.
TEST(QuantizedWeightsTest, Fp8ModuleStoredInFloatIsReadAsStored) {
  const std::string dir = QuantFixture("fp8_block");
  auto config = LoadModelConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  nlohmann::json j = ReadJson(dir + "/config.json");
  j["quantization_config"]["modules_to_not_convert"] = {"model.layers.1.self_attn.o_proj"};
  auto quant = quant::ParseQuantConfig(j, "config.json");
  ASSERT_TRUE(quant.ok()) << quant.status();
  auto weights = SafetensorsModel::Open(dir);
  ASSERT_TRUE(weights.ok()) << weights.status();
  for (const TensorSpec& spec : SliceTensorSpecs(*config, {0, config->num_layers}, **weights)) {
    if (spec.name != "lm_head.weight") continue;
    ASSERT_TRUE(IsQuantizedWeight(*quant, spec));
    EXPECT_TRUE(StoredUnquantized(**weights, *quant, spec));
    auto w = ReadWeightFloat(**weights, *quant, spec);
    ASSERT_TRUE(w.ok()) << w.status();
    auto plain = (*weights)->ReadFloat(spec.name, spec.shape);
    ASSERT_TRUE(plain.ok());
    EXPECT_EQ(*w, *plain);
    return;
  }
  FAIL() << "no lm_head.weight in the fixture";
}

// Tensors of tests/fixtures/quant/reference_vectors.safetensors (scripts/make_quant_fixtures.py):
// transformers' own dequantization functions on random inputs.
class ReferenceVectors {
 public:
  static std::unique_ptr<SafetensorsFile> Open() {
    const char* root = std::getenv("RINGSERVE_SOURCE_DIR");
    auto file = SafetensorsFile::Open(std::string(root != nullptr ? root : ".") +
                                      "/tests/fixtures/quant/reference_vectors.safetensors");
    EXPECT_TRUE(file.ok()) << file.status();
    return file.ok() ? *std::move(file) : nullptr;
  }
  static quant::QTensor Get(const SafetensorsFile& file, const std::string& name) {
    const TensorInfo* info = file.Find(name);
    EXPECT_NE(info, nullptr) << name;
    if (info == nullptr) return {};
    return quant::QTensor{
        .name = name, .dtype = info->dtype, .shape = info->shape, .bytes = file.Bytes(*info)};
  }
  static std::vector<float> Floats(const quant::QTensor& t) {
    std::vector<float> out(t.NumElements());
    std::memcpy(out.data(), t.bytes.data(), std::min(t.bytes.size(), out.size() * sizeof(float)));
    return out;
  }
};

// MXFP4: transformers' convert_moe_packed_tensors turns [E, rows, G, 16] + [E, rows, G] into its
// transposed parameter layout [E, G * 32, rows]; ours is [E, rows, G * 32].
TEST(QuantizedWeightsTest, Mxfp4MatchesTransformersConvertMoePackedTensors) {
  auto file = ReferenceVectors::Open();
  ASSERT_NE(file, nullptr);
  const quant::QTensor want = ReferenceVectors::Get(*file, "mxfp4.dequantized");
  ASSERT_EQ(want.shape, (std::vector<int64_t>{2, 64, 4}));
  auto got = quant::DequantizeMxfp4(ReferenceVectors::Get(*file, "mxfp4.blocks"),
                                    ReferenceVectors::Get(*file, "mxfp4.scales"));
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 2u * 4 * 64);
  const std::vector<float> ref = ReferenceVectors::Floats(want);
  int nonzero = 0;
  for (int e = 0; e < 2; ++e) {
    for (int r = 0; r < 4; ++r) {
      for (int c = 0; c < 64; ++c) {
        const float ours = (*got)[(e * 4 + r) * 64 + c];
        ASSERT_EQ(ours, ref[(e * 64 + c) * 4 + r]) << e << "," << r << "," << c;
        nonzero += ours != 0;
      }
    }
  }
  EXPECT_GT(nonzero, 400);
}

// The loader reads gpt-oss's `_blocks` / `_scales` pair from a checkpoint.
TEST(QuantizedWeightsTest, ReadsAnMxfp4PairFromACheckpoint) {
  auto file = ReferenceVectors::Open();
  ASSERT_NE(file, nullptr);
  const quant::QTensor blocks = ReferenceVectors::Get(*file, "mxfp4.blocks");
  const quant::QTensor scales = ReferenceVectors::Get(*file, "mxfp4.scales");
  const std::string prefix = "model.layers.0.mlp.experts.down_proj";
  testing::TempDir tmp;
  ASSERT_TRUE(
      testing::WriteFile(tmp.path() + "/model.safetensors",
                         testing::SafetensorsBytes(
                             {{.name = prefix + "_blocks",
                               .dtype = DType::kU8,
                               .shape = blocks.shape,
                               .values = {},
                               .raw = std::string(blocks.bytes.begin(), blocks.bytes.end())},
                              {.name = prefix + "_scales",
                               .dtype = DType::kU8,
                               .shape = scales.shape,
                               .values = {},
                               .raw = std::string(scales.bytes.begin(), scales.bytes.end())}}))
          .ok());
  auto weights = SafetensorsModel::Open(tmp.path());
  ASSERT_TRUE(weights.ok()) << weights.status();
  const std::vector<int64_t> shape = {2, 4, 64};
  auto got = ReadMxfp4Float(**weights, prefix, shape);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, *quant::DequantizeMxfp4(blocks, scales));
  const std::vector<int64_t> wrong = {2, 64, 4};
  auto bad = ReadMxfp4Float(**weights, prefix, wrong);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr(prefix + "_blocks"));
  EXPECT_EQ(
      ReadMxfp4Float(**weights, "model.layers.0.mlp.experts.gate_up_proj", shape).status().code(),
      absl::StatusCode::kNotFound);
}

// FP8: transformers' Fp8Quantize + Fp8Dequantize (blocks [32, 32]) on a [64, 96] matrix, with fp32
// scales and with scale_fmt ue8m0 (scales stored as float8_e8m0fnu, safetensors F8_E8M0).
TEST(QuantizedWeightsTest, Fp8MatchesTransformersFp8Dequantize) {
  auto file = ReferenceVectors::Open();
  ASSERT_NE(file, nullptr);
  for (const std::string prefix : {"fp8", "fp8_ue8m0"}) {
    const quant::QTensor scale = ReferenceVectors::Get(*file, prefix + ".weight_scale_inv");
    EXPECT_EQ(scale.dtype, prefix == "fp8" ? DType::kF32 : DType::kF8E8M0);
    auto got =
        quant::DequantizeFp8(ReferenceVectors::Get(*file, prefix + ".weight"), scale, {32, 32});
    ASSERT_TRUE(got.ok()) << got.status();
    const std::vector<float> want =
        ReferenceVectors::Floats(ReferenceVectors::Get(*file, prefix + ".dequantized"));
    ASSERT_EQ(got->size(), want.size());
    EXPECT_EQ(*got, want) << prefix;
  }
}

// A copy of a fixture with config.json changed by `edit`.
std::string CopyWithConfig(const testing::TempDir& tmp, const std::string& format,
                           const std::function<void(nlohmann::json&)>& edit) {
  const std::string src = QuantFixture(format);
  EXPECT_TRUE(
      testing::CopyFile(src + "/model.safetensors", tmp.path() + "/model.safetensors").ok());
  nlohmann::json config = ReadJson(src + "/config.json");
  edit(config);
  EXPECT_TRUE(testing::WriteFile(tmp.path() + "/config.json", config.dump()).ok());
  return tmp.path();
}

absl::Status LoadWhole(const std::string& dir) {
  return ModelSlice::LoadCpu(
             {.model_dir = dir, .layers = {0, 2}, .kv_block_size = 4, .kv_num_blocks = 4})
      .status();
}

TEST(QuantizedWeightsTest, QuantizedTensorsWithoutTheirConfigAreRefused) {
  testing::TempDir tmp;
  const std::string dir =
      CopyWithConfig(tmp, "fp8_block", [](nlohmann::json& c) { c.erase("quantization_config"); });
  const absl::Status status = LoadWhole(dir);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("F8_E4M3"));
  EXPECT_THAT(status.message(), HasSubstr("quantization_config"));
}

TEST(QuantizedWeightsTest, AConfigThatDisagreesWithTheTensorsNamesTheTensor) {
  testing::TempDir tmp;
  const std::string dir = CopyWithConfig(
      tmp, "gptq_int4", [](nlohmann::json& c) { c["quantization_config"]["bits"] = 8; });
  const absl::Status status = LoadWhole(dir);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("model.layers.0.self_attn.q_proj.qweight"));
  EXPECT_THAT(status.message(), HasSubstr("gptq"));
}

TEST(QuantizedWeightsTest, AModuleTheConfigSaysIsQuantizedMustBeStoredQuantized) {
  // The fixture keeps layer 1's down_proj in bf16 through `ignore`; without the entry the loader
  // looks for its packed weight.
  testing::TempDir tmp;
  const std::string dir = CopyWithConfig(tmp, "ct_int8", [](nlohmann::json& c) {
    c["quantization_config"]["ignore"] = nlohmann::json::array({"lm_head"});
  });
  const absl::Status status = LoadWhole(dir);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("model.layers.1.mlp.down_proj.weight_packed"));
}

TEST(QuantizedWeightsTest, UnsupportedSchemesAreRefusedAtLoadNamingTheKey) {
  testing::TempDir tmp;
  const std::string dir = CopyWithConfig(
      tmp, "awq_int4", [](nlohmann::json& c) { c["quantization_config"]["version"] = "exllama"; });
  const absl::Status status = LoadWhole(dir);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("quantization_config.version"));
}

}  // namespace
}  // namespace ringserve
