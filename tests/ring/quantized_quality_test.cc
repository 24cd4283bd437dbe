// Quality of the quantized formats on a trained model: models/ringserve-tiny quantized by each
// format's reference quantizer into the layout the hub stores (bench/model/quant_layout.h:
// compressed-tensors int4 group 128 and int8 per channel, fine-grained FP8 128x128), then the
// perplexity of the held-out document of tests/fixtures/trained/perplexity_golden.json through a
// 2-stage CPU ring, against the bf16 model's (transformers' golden, which the ring equals). The
// figures are printed (bench/cuda/NOTES.md records them); the test fails when a format loses
// more than its bound, or when quantizing changes nothing (the checkpoint would not be read
// quantized).
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "bench/model/quant_layout.h"
#include "bench/perplexity/perplexity.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "stage/model/safetensors.h"
#include "stage/model/testing/safetensors_writer.h"
#include "tests/ring/perplexity_golden_testing.h"
#include "tests/ring/ring_harness.h"

namespace ringserve::testing {
namespace {

namespace fs = std::filesystem;

std::string ReadText(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Writes models/ringserve-tiny with its decoder's linear layers quantized as `quant` into `dir`.
absl::Status WriteQuantizedCopy(const fs::path& dir, CheckpointQuant quant) {
  const fs::path src = fs::path(SourceDir()) / "models/ringserve-tiny";
  fs::create_directories(dir);
  for (const char* name : {"tokenizer.json", "generation_config.json", "special_tokens_map.json"}) {
    if (fs::exists(src / name)) {
      fs::copy_file(src / name, dir / name, fs::copy_options::overwrite_existing);
    }
  }
  nlohmann::ordered_json config = nlohmann::ordered_json::parse(ReadText(src / "config.json"));
  config["quantization_config"] = QuantizationConfig(quant);
  RS_RETURN_IF_ERROR(WriteFile((dir / "config.json").string(), config.dump(2)));
  RS_ASSIGN_OR_RETURN(auto weights, SafetensorsModel::Open(src.string()));
  std::vector<TensorToWrite> tensors;
  for (const std::string& name : weights->TensorNames()) {
    RS_ASSIGN_OR_RETURN(TensorView view, weights->GetAnyShape(name));
    const std::vector<int64_t>& shape = view.info->shape;
    if (name.starts_with("model.layers.") && name.ends_with("_proj.weight")) {
      RS_ASSIGN_OR_RETURN(std::vector<float> values, weights->ReadFloat(name, shape));
      RS_ASSIGN_OR_RETURN(std::vector<StoredTensor> parts,
                          QuantizeWeight(name, shape[0], shape[1], values, quant));
      for (StoredTensor& p : parts) {
        tensors.push_back({.name = p.name,
                           .dtype = p.dtype,
                           .shape = p.shape,
                           .values = {},
                           .raw = std::move(p.bytes)});
      }
      continue;
    }
    tensors.push_back({.name = name,
                       .dtype = view.info->dtype,
                       .shape = shape,
                       .values = {},
                       .raw = std::string(view.bytes.begin(), view.bytes.end())});
  }
  return WriteFile((dir / "model.safetensors").string(), SafetensorsBytes(tensors));
}

absl::StatusOr<perplexity::Report> RingPerplexity(const std::string& model_dir,
                                                  const nlohmann::json& golden) {
  RS_ASSIGN_OR_RETURN(auto ring, Ring::Start({.model_dir = model_dir, .partition = {4, 4}}));
  return MeasureGoldenPerplexity(ring->stub(), golden);
}

TEST(QuantizedQualityTest, HeldOutPerplexityPerFormatThroughTheRing) {
  const PerplexityGolden golden = LoadPerplexityGolden();
  ASSERT_FALSE(golden.json.is_discarded());
  // The bf16 model's figure: transformers' (the ring equals it: trained_model_test).
  const double base_perplexity = golden.perplexity();
  std::printf("bf16: perplexity %.4f over %lld tokens\n", base_perplexity,
              static_cast<long long>(golden.tokens));
  struct Bound {
    CheckpointQuant quant;
    double max_relative_increase;
  };
  for (const Bound b :
       {Bound{CheckpointQuant::kInt8, 0.005}, Bound{CheckpointQuant::kFp8Block, 0.01},
        Bound{CheckpointQuant::kInt4G128, 0.05}}) {
    const std::string name(CheckpointQuantName(b.quant));
    SCOPED_TRACE(name);
    const fs::path dir = fs::path(::testing::TempDir()) / ("rs_quality_" + name);
    fs::remove_all(dir);
    const absl::Status written = WriteQuantizedCopy(dir, b.quant);
    ASSERT_TRUE(written.ok()) << written;
    auto report = RingPerplexity(dir.string(), golden.json);
    ASSERT_TRUE(report.ok()) << report.status();
    const double increase = report->perplexity / base_perplexity - 1;
    std::printf("%s: perplexity %.4f (%+.3f%% against bf16)\n", name.c_str(), report->perplexity,
                100 * increase);
    EXPECT_EQ(report->tokens, golden.tokens);
    EXPECT_GT(std::fabs(report->nll - golden.nll), 1e-5 * golden.nll);  // the ring: ~1e-7
    EXPECT_LT(increase, b.max_relative_increase);
    fs::remove_all(dir);
  }
}

}  // namespace
}  // namespace ringserve::testing
