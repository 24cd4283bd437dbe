// The CUDA slice on DeepSeek-V3 models against the CPU slice (itself exact to transformers on the
// golden fixtures): random weights in tiny-deepseek-v3's layout at the latent sizes the CUDA
// kernels run (kv_lora_rank 512, qk_rope_head_dim 64), YaRN with positions past its original
// length, one dense layer then grouped sigmoid MoE layers with a correction bias and a shared
// expert; with q low-rank and with a plain q_proj. Steps: a batched prefill of three sequences,
// a mixed step (one sequence's second prefill chunk over its compressed cache beside another's
// decode), then graphed greedy decode steps of all three, teacher-forced with the CPU's tokens.
// Tolerance as cuda_model_slice_test's random-weight models: relative L2 of each step's logits
// <= max(5e-2, 2x the CPU reference's own sensitivity to bf16 weight noise on the same batch:
// a MoE router's near-tie may flip an expert; testing/bf16_noise_probe.h) (bf16 against fp32,
// fp32 weights, init_std 0.1), greedy tokens equal up to bf16 near-ties.
#include <algorithm>
#include <cmath>
#include <string>

#include "bench/model/random_model.h"
#include "fmt/format.h"
#include "gtest/gtest.h"
#include "kernels/cuda/test_util.h"
#include "stage/cuda/cuda_model_slice.h"
#include "stage/model/cpu_model_slice.h"
#include "stage/model/testing/bf16_noise_probe.h"
#include "stage/model/testing/latent512_deepseek.h"
#include "stage/sampling/sampler.h"

namespace ringserve::cuda {
namespace {

using testing::RelL2;

constexpr double kLogitsTol = 5e-2;
constexpr double kSensitivityFactor = 2.0;
constexpr int kBlockSize = 4;
constexpr int kBlocksPerSeq = 16;

std::vector<int32_t> Table(int seq) {
  std::vector<int32_t> t(kBlocksPerSeq);
  for (int i = 0; i < kBlocksPerSeq; ++i) t[i] = i * 3 + seq;  // interleaved
  return t;
}

// Writes the model; q_lora_rank 0 gives a plain q_proj.
std::string WriteLatent512Model(int q_lora_rank) {
  auto shape = ringserve::testing::Latent512DeepseekShape(
      fmt::format("tiny-deepseek-v3-latent512-q{}", q_lora_rank), 512, q_lora_rank);
  EXPECT_TRUE(shape.ok()) << shape.status();
  shape->mla.yarn_factor = 4;
  shape->mla.yarn_original_max_position_embeddings = 16;
  const std::string dir = ::testing::TempDir() + "/rs_" + shape->name;
  const auto written = WriteRandomModel({.output_dir = dir,
                                         .shape = *shape,
                                         .dtype = DType::kF32,
                                         .seed = 11,
                                         .init_std = 0.1,
                                         .num_threads = 2,
                                         .tokenizers_dir = ""});
  EXPECT_TRUE(written.ok()) << written.status();
  return dir;
}

class CudaMlaSliceTest : public ::testing::TestWithParam<int> {};  // q_lora_rank

TEST_P(CudaMlaSliceTest, PrefillChunksAndGraphedDecodeMatchCpu) {
  RS_SKIP_WITHOUT_GPU();
  const std::string dir = WriteLatent512Model(GetParam());
  auto config = LoadModelConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_TRUE(config->mla.has_value());
  const SliceOptions options{.model_dir = dir,
                             .layers = {0, config->num_layers},
                             .kv_block_size = kBlockSize,
                             .kv_num_blocks = 3 * kBlocksPerSeq};
  auto cpu = CpuModelSlice::Load(options);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto probe = ringserve::testing::Bf16NoiseProbe::Load(options);
  ASSERT_TRUE(probe.ok()) << probe.status();
  auto gpu = CudaModelSlice::Load(options, {.max_batch_tokens = 64, .max_seqs = 8});
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  const int vocab = config->vocab_size;
  std::vector<int> pos = {7, 13, 1};
  std::vector<int32_t> next(3);
  int near_ties = 0;
  // Both slices on `batch`; the GPU's logits within tolerance, and next[s] = the CPU's greedy
  // token of each chunk's last row (the GPU's may differ only by a near-tie).
  auto step = [&](const MicroBatch& batch, const std::string& what) {
    SCOPED_TRACE(what);
    auto want = (*cpu)->Forward(batch, {});
    auto got = (*gpu)->Forward(batch, {});
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_TRUE((*probe)->Forward(batch).ok());
    ASSERT_EQ(got->size(), want->size());
    EXPECT_LT(RelL2(*got, *want),
              std::max(kLogitsTol, kSensitivityFactor * (*probe)->Sensitivity(*want)))
        << "sensitivity " << (*probe)->Sensitivity(*want);
    int64_t row = 0;
    for (const SequenceChunk& chunk : batch.chunks) {
      row += chunk.logits == LogitsMode::kAllTokens ? chunk.num_tokens : 1;
      const std::span<const float> w(want->data() + (row - 1) * vocab, vocab);
      const std::span<const float> g(got->data() + (row - 1) * vocab, vocab);
      const int s = static_cast<int>(chunk.seq_id);
      next[s] = GreedyToken(w);
      const int32_t chose = GreedyToken(g);
      if (chose == next[s]) continue;
      float max_err = 0;
      for (int i = 0; i < vocab; ++i) max_err = std::max(max_err, std::abs(g[i] - w[i]));
      EXPECT_LE(w[next[s]] - w[chose], 2 * max_err) << "seq " << s;
      ++near_ties;
    }
  };
  int32_t id = 5;
  auto tokens = [&](int n) {
    std::vector<int32_t> ids;
    for (int i = 0; i < n; ++i) ids.push_back(id = (id * 37 + 11) % vocab);
    return ids;
  };
  MicroBatch prefill;
  for (int s = 0; s < 3; ++s) {
    prefill.chunks.push_back({.seq_id = static_cast<uint64_t>(s),
                              .start_position = 0,
                              .num_tokens = pos[s],
                              .block_table = Table(s),
                              .logits = LogitsMode::kAllTokens});
    for (int32_t t : tokens(pos[s])) prefill.token_ids.push_back(t);
  }
  step(prefill, "batched prefill");
  // Sequence 0's second chunk (9 tokens over its 7 cached rows) beside sequence 1's decode.
  MicroBatch mixed;
  mixed.chunks.push_back({.seq_id = 0,
                          .start_position = pos[0],
                          .num_tokens = 9,
                          .block_table = Table(0),
                          .logits = LogitsMode::kAllTokens});
  mixed.token_ids = tokens(9);
  mixed.chunks.push_back({.seq_id = 1,
                          .start_position = pos[1],
                          .num_tokens = 1,
                          .block_table = Table(1),
                          .logits = LogitsMode::kLastToken});
  mixed.token_ids.push_back(next[1]);
  pos[0] += 9;
  pos[1] += 1;
  step(mixed, "second prefill chunk beside a decode");
  for (int i = 0; i < 10; ++i) {
    MicroBatch decode;
    for (int s = 0; s < 3; ++s) {
      decode.chunks.push_back({.seq_id = static_cast<uint64_t>(s),
                               .start_position = pos[s]++,
                               .num_tokens = 1,
                               .block_table = Table(s),
                               .logits = LogitsMode::kLastToken});
      decode.token_ids.push_back(next[s]);
    }
    step(decode, fmt::format("decode step {}", i));
  }
  EXPECT_LE(near_ties, 3) << "too many greedy disagreements for bf16 near-ties";
  EXPECT_GT((*gpu)->num_graphs(), 0);
}

INSTANTIATE_TEST_SUITE_P(QLoraRank, CudaMlaSliceTest, ::testing::Values(64, 0));

}  // namespace
}  // namespace ringserve::cuda
