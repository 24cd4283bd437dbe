// The CUDA slice on quantized MoE checkpoints (C++-written copies of the MoE fixtures and of tiny
// random MoE models: stage/model/testing/quantized_copy.h) against the CPU slice on the same
// checkpoint. Routed experts are held quantized where they pack (cuda_moe_layer.h: sizes that are
// multiples of the kernels' chunk), else dequantized to bf16 at load; each case states which,
// and the memory report must count them so. The GPU's activations are bf16 either way, so the
// comparison is the dense GPU tests' (bf16 against the fp32 CPU reference): relative L2 of the
// prefill logits and of each graphed greedy decode step <= max(3e-2, 2 x the CPU reference's
// bf16-noise sensitivity, measured on the dequantized float copy: testing/bf16_noise_probe.h,
// 1.5 x the GPU slice's own distance on that float copy). The last term is the bf16 GPU on the
// same weights: a tiny random model can sit on a router near-tie the probe does not see (the
// AWQ copy of tiny-glm4-moe: GPU float copy 0.064 from the CPU, quantized path 0.047), and the
// quantized path must then be no worse than bf16 on the dequantized weights.
// The prefill (20 tokens) runs the grouped GEMM on models of 8 experts (more than 4 rows per
// expert: the quantized experts dequantized range by range), the decode steps the grouped GEMV.
#include <algorithm>
#include <cstdlib>
#include <string>

#include "bench/model/random_model.h"
#include "gtest/gtest.h"
#include "kernels/cuda/test_util.h"
#include "stage/cuda/cuda_model_slice.h"
#include "stage/model/cpu_model_slice.h"
#include "stage/model/testing/bf16_noise_probe.h"
#include "stage/model/testing/latent512_deepseek.h"
#include "stage/model/testing/quantized_copy.h"
#include "stage/sampling/sampler.h"

namespace ringserve::cuda {
namespace {

using ringserve::testing::CopyFormat;
using ringserve::testing::CopyOptions;
using ringserve::testing::WriteLatent512Moe;
using testing::RelL2;

constexpr double kLogitsTol = 3e-2;
constexpr double kSensitivityFactor = 2.0;
constexpr double kFloatCopyFactor = 1.5;

std::string Fixture(const std::string& name) {
  const char* root = std::getenv("RINGSERVE_SOURCE_DIR");
  return std::string(root != nullptr ? root : ".") + "/tests/fixtures/models/" + name;
}

// A tiny random MoE model of make_random_model's shape `name` (experts of 32 values, which every
// quantized format's kernels hold) with a 128-token vocabulary.
absl::Status WriteTinyMoe(const std::string& name, const std::string& dir) {
  auto shape = FindShape(name);
  if (!shape.ok()) return shape.status();
  shape->vocab_size = 128;
  shape->max_position_embeddings = 128;
  shape->bos_token_id = 1;
  shape->eos_token_ids = {2};
  return WriteRandomModel({.output_dir = dir,
                           .shape = *shape,
                           .seed = 5,
                           .init_std = 0.1,
                           .num_threads = 2,
                           .tokenizers_dir = ""})
      .status();
}

struct Case {
  std::string name;
  // tests/fixtures/models/<fixture>, "gpt_oss_wide" (MXFP4-ready), "deepseek_latent512" or
  // "random:<make_random_model shape>" (WriteTinyMoe)
  std::string fixture;
  CopyOptions options;
  bool experts_held_quantized = false;  // else dequantized to bf16 at load
};

class CudaQuantizedMoeTest : public ::testing::TestWithParam<Case> {};

TEST_P(CudaQuantizedMoeTest, GpuSliceMatchesTheCpuSliceOnTheQuantizedCheckpoint) {
  RS_SKIP_WITHOUT_GPU();
  const Case& c = GetParam();
  ringserve::testing::TempDir tmp;
  std::string src = Fixture(c.fixture);
  if (c.fixture == "gpt_oss_wide") {
    src = tmp.path() + "/src";
    ASSERT_TRUE(ringserve::testing::WriteMxfp4ReadyGptOss(Fixture("gpt_oss"), src).ok());
  } else if (c.fixture == "deepseek_latent512") {
    src = tmp.path() + "/src";
    const absl::Status written = WriteLatent512Moe(src);
    ASSERT_TRUE(written.ok()) << written;
  } else if (c.fixture.starts_with("random:")) {
    src = tmp.path() + "/src";
    const absl::Status written = WriteTinyMoe(c.fixture.substr(7), src);
    ASSERT_TRUE(written.ok()) << written;
  }
  const std::string dir = tmp.path() + "/quant", float_dir = tmp.path() + "/float";
  auto copy = ringserve::testing::WriteQuantizedCopy(src, c.options, dir, float_dir);
  ASSERT_TRUE(copy.ok()) << copy.status();
  auto config = LoadModelConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  const LayerRange all{0, config->num_layers};
  auto gpu = CudaModelSlice::Load(
      {.model_dir = dir, .layers = all, .kv_block_size = 4, .kv_num_blocks = 64},
      {.max_batch_tokens = 64, .max_seqs = 8});
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  auto gpu_float = CudaModelSlice::Load(
      {.model_dir = float_dir, .layers = all, .kv_block_size = 4, .kv_num_blocks = 64},
      {.max_batch_tokens = 64, .max_seqs = 8});
  ASSERT_TRUE(gpu_float.ok()) << gpu_float.status();
  if (c.experts_held_quantized) {
    EXPECT_GT((*gpu)->memory().quantized_expert_bytes, 0);
  } else {
    EXPECT_EQ((*gpu)->memory().quantized_expert_bytes, 0);
    EXPECT_GT((*gpu)->memory().dequantized_expert_bytes, 0);
  }
  auto cpu = CpuModelSlice::Load(
      {.model_dir = dir, .layers = all, .kv_block_size = 4, .kv_num_blocks = 64});
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto probe = ringserve::testing::Bf16NoiseProbe::Load(
      {.model_dir = float_dir, .layers = all, .kv_block_size = 4, .kv_num_blocks = 64});
  ASSERT_TRUE(probe.ok()) << probe.status();
  auto check = [&](const MicroBatch& batch) -> std::vector<float> {
    auto want = (*cpu)->Forward(batch, {});
    EXPECT_TRUE(want.ok()) << want.status();
    EXPECT_TRUE((*probe)->Forward(batch).ok());
    auto got = (*gpu)->Forward(batch, {});
    EXPECT_TRUE(got.ok()) << got.status();
    auto bf16_got = (*gpu_float)->Forward(batch, {});
    EXPECT_TRUE(bf16_got.ok()) << bf16_got.status();
    if (!want.ok() || !got.ok() || !bf16_got.ok()) return {};
    const double float_copy = RelL2(*bf16_got, *want);
    const double bound = std::max({kLogitsTol, kSensitivityFactor * (*probe)->Sensitivity(*want),
                                   kFloatCopyFactor * float_copy});
    EXPECT_LT(RelL2(*got, *want), bound) << "GPU on the float copy: " << float_copy;
    return *want;
  };
  std::vector<int32_t> table(64);
  for (int i = 0; i < 64; ++i) table[i] = 63 - i;
  MicroBatch prefill;
  prefill.chunks.push_back({.seq_id = 1,
                            .start_position = 0,
                            .num_tokens = 20,
                            .block_table = table,
                            .logits = LogitsMode::kAllTokens});
  prefill.token_ids = {5, 17, 99, 3, 42, 64, 8, 120, 31, 77, 2, 14, 90, 61, 7, 33, 101, 45, 12, 88};
  std::vector<float> logits = check(prefill);
  ASSERT_FALSE(logits.empty());
  std::vector<float> last(logits.end() - config->vocab_size, logits.end());
  for (int step = 0; step < 6; ++step) {
    MicroBatch decode;
    decode.chunks.push_back({.seq_id = 1,
                             .start_position = 20 + step,
                             .num_tokens = 1,
                             .block_table = table,
                             .logits = LogitsMode::kLastToken});
    decode.token_ids = {GreedyToken(last)};  // the CPU reference's token: both stay together
    last = check(decode);
    ASSERT_FALSE(last.empty());
  }
  EXPECT_GT((*gpu)->num_graphs(), 0);
}

CopyOptions Opt(CopyFormat format, int block) { return {.format = format, .block = block}; }
constexpr bool kHeld = true;

INSTANTIATE_TEST_SUITE_P(
    Formats, CudaQuantizedMoeTest,
    ::testing::Values(
        // The fixtures' experts of 12 values are no multiple of a chunk: dequantized at load.
        Case{"Qwen3MoeFp8Block", "qwen3_moe", Opt(CopyFormat::kFp8Block, 16)},
        Case{"Glm4MoeFp8BlockUe8m0", "glm4_moe", Opt(CopyFormat::kFp8BlockUe8m0, 16)},
        Case{"MixtralCompressedInt4", "mixtral", Opt(CopyFormat::kCompressedInt4, 8)},
        Case{"DeepseekV3Awq", "deepseek_latent512", Opt(CopyFormat::kAwq4, 8)},
        // Held quantized (gpt-oss's MXFP4 experts as fp4, gate/up deinterleaved).
        Case{"GptOssMxfp4", "gpt_oss_wide", Opt(CopyFormat::kMxfp4, 32), kHeld},
        Case{"DeepseekV3Fp8Block128", "deepseek_latent512", Opt(CopyFormat::kFp8Block, 128), kHeld},
        Case{"TinyQwen3MoeCompressedInt4", "random:tiny-qwen3-moe",
             Opt(CopyFormat::kCompressedInt4, 32), kHeld},
        Case{"TinyQwen3MoeGptq", "random:tiny-qwen3-moe", Opt(CopyFormat::kGptq4, 32), kHeld},
        Case{"TinyQwen3MoeCompressedFp8", "random:tiny-qwen3-moe",
             Opt(CopyFormat::kCompressedFp8, 32), kHeld},
        Case{"TinyGlm4MoeFp8Block", "random:tiny-glm4-moe", Opt(CopyFormat::kFp8Block, 32), kHeld},
        Case{"TinyGlm4MoeAwq", "random:tiny-glm4-moe", Opt(CopyFormat::kAwq4, 32), kHeld}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace ringserve::cuda
