// The attention variants of the MoE families on the CUDA slice, layer by layer against the CPU
// slice: gpt-oss (attention sinks, a sliding window shorter than the prompt, attention and o
// biases) and GLM-4.5 (partial rotary with q/k norms and biases). For each fixture, slices of the
// first 1, 2, ... layers return their hidden states (the whole model its logits), so a mismatch
// names the first layer that differs. Each case runs a batched prefill (prompts longer than the
// window), a chunked prefill (a second chunk continuing the first) and graphed decode steps, with
// and without programmatic dependent launch, and on config variants that switch one feature off
// (no sliding layers; full rotary), so a failure points at the feature. Tolerance: relative L2
// <= 3e-2, as the other GPU slice tests (bf16 against fp32), or 2x the reference's own
// sensitivity to bf16 noise on the same batch where that is larger (router near-ties:
// testing/bf16_noise_probe.h). Each comparison prints one "variant-diff" line with both figures.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "kernels/cuda/test_util.h"
#include "stage/cuda/cuda_model_slice.h"
#include "stage/model/cpu_model_slice.h"
#include "stage/model/testing/bf16_noise_probe.h"

namespace ringserve::cuda {
namespace {

using testing::RelL2;

constexpr double kTol = 3e-2;
constexpr double kSensitivityFactor = 2.0;
constexpr int kBlockSize = 4;
constexpr int kBlocksPerSeq = 16;

std::string FixtureDir(const std::string& name) {
  const char* root = std::getenv("RINGSERVE_SOURCE_DIR");
  return std::string(root ? root : ".") + "/tests/fixtures/models/" + name;
}

std::vector<int32_t> Table(int seq) {
  std::vector<int32_t> t(kBlocksPerSeq);
  for (int i = 0; i < kBlocksPerSeq; ++i) t[i] = i * 4 + seq;
  return t;
}

// A copy of fixture `name` with every `from` in config.json replaced by `to` (the weights
// linked, not copied).
std::string VariantDir(const std::string& name, const std::string& tag, const std::string& from,
                       const std::string& to) {
  namespace fs = std::filesystem;
  const fs::path src = FixtureDir(name);
  const fs::path dst = fs::path(::testing::TempDir()) / ("rs_variant_" + name + "_" + tag);
  fs::remove_all(dst);
  fs::create_directories(dst);
  for (const auto& entry : fs::directory_iterator(src)) {
    if (entry.path().filename() != "config.json") {
      fs::create_symlink(fs::absolute(entry.path()), dst / entry.path().filename());
    }
  }
  std::ifstream in(src / "config.json");
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string text = buffer.str();
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  std::ofstream(dst / "config.json") << text;
  return dst.string();
}

struct Case {
  std::string label;
  std::string dir;
  bool dependent_launch = true;
};

// `sensitivity`: the reference's own under bf16 noise on the same batch.
void Compare(const Case& c, int layers, const std::string& step, const std::vector<float>& got,
             const std::vector<float>& want, double sensitivity) {
  const double rel = RelL2(got, want);
  std::printf("variant-diff %s pdl=%d layers=%d %s sens=%.4g rel_l2=%.4g\n", c.label.c_str(),
              c.dependent_launch ? 1 : 0, layers, step.c_str(), sensitivity, rel);
  EXPECT_LT(rel, std::max(kTol, kSensitivityFactor * sensitivity))
      << c.label << " layers " << layers << " " << step << ", sensitivity " << sensitivity;
}

// Slices [0, layers) on CPU and GPU: a batched prefill of 7 and 13 tokens (the second a chunk
// of 9, then a continuing chunk of 4), then 4 graphed decode steps of both.
void RunCase(const Case& c, int layers) {
  auto config = LoadModelConfig(c.dir);
  ASSERT_TRUE(config.ok()) << config.status();
  const SliceOptions options{.model_dir = c.dir,
                             .layers = {0, layers},
                             .kv_block_size = kBlockSize,
                             .kv_num_blocks = 4 * kBlocksPerSeq};
  auto cpu = CpuModelSlice::Load(options);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto probe = ringserve::testing::Bf16NoiseProbe::Load(options);
  ASSERT_TRUE(probe.ok()) << probe.status();
  auto gpu = CudaModelSlice::Load(
      options,
      {.max_batch_tokens = 64, .max_seqs = 8, .kernels = {.dependent_launch = c.dependent_launch}});
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  std::mt19937 rng(layers * 101 + 7);
  std::uniform_int_distribution<int32_t> token(3, config->vocab_size - 1);
  auto both = [&](const MicroBatch& batch, const std::string& step) {
    auto want = (*cpu)->Forward(batch, {});
    auto got = (*gpu)->Forward(batch, {});
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_TRUE((*probe)->Forward(batch).ok());
    ASSERT_EQ(got->size(), want->size());
    Compare(c, layers, step, *got, *want, (*probe)->Sensitivity(*want));
  };
  // Prefill: sequence 0 whole (7 tokens), sequence 1's first 9 tokens.
  MicroBatch prefill;
  const int lengths[2] = {7, 9};
  for (int s = 0; s < 2; ++s) {
    prefill.chunks.push_back({.seq_id = static_cast<uint64_t>(s),
                              .start_position = 0,
                              .num_tokens = lengths[s],
                              .block_table = Table(s),
                              .logits = LogitsMode::kAllTokens});
    for (int i = 0; i < lengths[s]; ++i) prefill.token_ids.push_back(token(rng));
  }
  both(prefill, "prefill");
  // Chunked prefill: sequence 1 continues with 4 tokens at positions 9..12.
  MicroBatch chunk;
  chunk.chunks.push_back({.seq_id = 1,
                          .start_position = 9,
                          .num_tokens = 4,
                          .block_table = Table(1),
                          .logits = LogitsMode::kAllTokens});
  for (int i = 0; i < 4; ++i) chunk.token_ids.push_back(token(rng));
  both(chunk, "chunk");
  int pos[2] = {7, 13};
  for (int step = 0; step < 4; ++step) {
    MicroBatch decode;
    for (int s = 0; s < 2; ++s) {
      decode.chunks.push_back({.seq_id = static_cast<uint64_t>(s),
                               .start_position = pos[s]++,
                               .num_tokens = 1,
                               .block_table = Table(s),
                               .logits = LogitsMode::kLastToken});
      decode.token_ids.push_back(token(rng));
    }
    both(decode, "decode" + std::to_string(step));
  }
}

void RunFixture(const std::vector<Case>& cases) {
  for (const Case& c : cases) {
    auto config = LoadModelConfig(c.dir);
    ASSERT_TRUE(config.ok()) << config.status();
    for (int layers = 1; layers <= config->num_layers; ++layers) {
      SCOPED_TRACE(::testing::Message()
                   << c.label << " pdl " << c.dependent_launch << " layers " << layers);
      RunCase(c, layers);
    }
  }
}

TEST(CudaAttentionVariantsTest, GptOssMatchesCpuLayerByLayer) {
  RS_SKIP_WITHOUT_GPU();
  const std::string dir = FixtureDir("gpt_oss");
  const std::string no_window =
      VariantDir("gpt_oss", "no_window", "\"sliding_attention\"", "\"full_attention\"");
  RunFixture({{"gpt_oss", dir, true}, {"gpt_oss", dir, false}, {"gpt_oss_no_window", no_window}});
}

TEST(CudaAttentionVariantsTest, Glm4MoeMatchesCpuLayerByLayer) {
  RS_SKIP_WITHOUT_GPU();
  const std::string dir = FixtureDir("glm4_moe");
  const std::string full_rotary =
      VariantDir("glm4_moe", "full_rotary", "\"partial_rotary_factor\": 0.5",
                 "\"partial_rotary_factor\": 1.0");
  RunFixture(
      {{"glm4_moe", dir, true}, {"glm4_moe", dir, false}, {"glm4_moe_full_rotary", full_rotary}});
}

}  // namespace
}  // namespace ringserve::cuda
