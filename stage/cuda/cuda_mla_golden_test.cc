// The CUDA slice on the DeepSeek golden fixtures at the latent sizes its MLA kernels run
// (kv_lora_rank 512, qk_rope_head_dim 64; scripts/make_mla_fixtures.py) against transformers:
// each prompt prefilled in two chunks (the second attends to the first's compressed cache rows),
// then all prompts decoded together, one graphed step at a time (a padded batch bucket),
// teacher-forced with the golden tokens. Tolerance as the MoE GPU golden test: relative L2 of
// the prompt's logits and of its greedy steps' logits <= max(3e-2, 2x the CPU reference's own
// sensitivity to bf16 weight noise on the same batches: a MoE router's near-tie may flip an
// expert; testing/bf16_noise_probe.h), every greedy token equal except
// near-ties within twice the row's bf16 logit error (at most 2 a prompt). Fixtures at other
// latent sizes are refused at load with the reason.
#include <algorithm>
#include <cmath>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda/test_util.h"
#include "stage/cuda/cuda_model_slice.h"
#include "stage/model/cpu_model_slice.h"
#include "stage/model/testing/bf16_noise_probe.h"
#include "stage/sampling/sampler.h"
#include "tests/golden/golden_fixture.h"

namespace ringserve::cuda {
namespace {

using testing::RelL2;

constexpr double kLogitsTol = 3e-2;
constexpr double kSensitivityFactor = 2.0;
constexpr int kBlockSize = 4;
constexpr int kBlocksPerSeq = 32;

class CudaMlaGoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaMlaGoldenTest, ChunkedPrefillAndBatchedGreedyDecodeMatchTransformers) {
  RS_SKIP_WITHOUT_GPU();
  const std::string dir = golden::FixtureDir(GetParam());
  auto fixture = golden::LoadGoldenFixture(dir);
  ASSERT_TRUE(fixture.ok()) << fixture.status();
  auto config = LoadModelConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  const int num_prompts = static_cast<int>(fixture->prompts.size());
  auto gpu = CudaModelSlice::Load({.model_dir = dir,
                                   .layers = {0, config->num_layers},
                                   .kv_block_size = kBlockSize,
                                   .kv_num_blocks = kBlocksPerSeq * num_prompts},
                                  {.max_batch_tokens = 64, .max_seqs = 8});
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  // The CPU reference and its bf16-noise probe run the same batches (for the bound only).
  const SliceOptions cpu_options{.model_dir = dir,
                                 .layers = {0, config->num_layers},
                                 .kv_block_size = kBlockSize,
                                 .kv_num_blocks = kBlocksPerSeq * num_prompts};
  auto cpu = CpuModelSlice::Load(cpu_options);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto probe = ringserve::testing::Bf16NoiseProbe::Load(cpu_options);
  ASSERT_TRUE(probe.ok()) << probe.status();
  // Runs `batch` on the CPU reference and the probe (once per batch: their caches follow) and
  // returns the reference's logits.
  auto reference = [&](const MicroBatch& batch) {
    auto want = (*cpu)->Forward(batch, {});
    EXPECT_TRUE(want.ok()) << want.status();
    EXPECT_TRUE((*probe)->Forward(batch).ok());
    return want.ok() ? *want : std::vector<float>();
  };
  // The bound for values [begin, end) of the batch `want` came from.
  auto bound_for = [&](const std::vector<float>& want, size_t begin, size_t end) {
    return want.empty()
               ? kLogitsTol
               : std::max(kLogitsTol, kSensitivityFactor * (*probe)->Sensitivity(want, begin, end));
  };
  const int vocab = fixture->vocab_size;
  // Interleaved, descending blocks: no sequence's table is contiguous.
  std::vector<std::vector<int32_t>> tables(num_prompts);
  for (int s = 0; s < num_prompts; ++s) {
    for (int i = 0; i < kBlocksPerSeq; ++i) {
      tables[s].push_back(kBlocksPerSeq * num_prompts - 1 - (i * num_prompts + s));
    }
  }
  std::vector<std::vector<float>> last(num_prompts);
  for (int s = 0; s < num_prompts; ++s) {
    const golden::GoldenPrompt& prompt = fixture->prompts[s];
    SCOPED_TRACE(::testing::Message() << "prompt of " << prompt.token_ids.size() << " tokens");
    const int n = static_cast<int>(prompt.token_ids.size());
    const int first = std::max(1, n / 2);
    std::vector<float> logits;
    double bound = kLogitsTol;
    for (const auto& [start, count] : {std::pair{0, first}, std::pair{first, n - first}}) {
      if (count == 0) continue;
      MicroBatch chunk;
      chunk.chunks.push_back({.seq_id = static_cast<uint64_t>(s + 1),
                              .start_position = start,
                              .num_tokens = count,
                              .block_table = tables[s],
                              .logits = LogitsMode::kAllTokens});
      chunk.token_ids.assign(prompt.token_ids.begin() + start,
                             prompt.token_ids.begin() + start + count);
      auto out = (*gpu)->Forward(chunk, {});
      ASSERT_TRUE(out.ok()) << out.status();
      logits.insert(logits.end(), out->begin(), out->end());
      bound = std::max(bound, bound_for(reference(chunk), 0, SIZE_MAX));
    }
    EXPECT_LT(RelL2(logits, prompt.logits), bound);
    last[s].assign(logits.end() - vocab, logits.end());
  }
  // Greedy steps of every prompt in one micro-batch per step.
  std::vector<std::vector<float>> got_rows(num_prompts);
  std::vector<int> near_ties(num_prompts, 0);
  std::vector<double> bounds(num_prompts, kLogitsTol);
  for (size_t step = 0;; ++step) {
    MicroBatch decode;
    std::vector<int> in_batch;
    for (int s = 0; s < num_prompts; ++s) {
      const golden::GoldenPrompt& prompt = fixture->prompts[s];
      if (step >= prompt.greedy_token_ids.size()) continue;
      const int32_t want = prompt.greedy_token_ids[step];
      const float* want_row = prompt.greedy_logits.data() + step * vocab;
      got_rows[s].insert(got_rows[s].end(), last[s].begin(), last[s].end());
      const int32_t got = GreedyToken(last[s]);
      if (got != want) {
        float max_err = 0;
        for (int i = 0; i < vocab; ++i) {
          max_err = std::max(max_err, std::abs(last[s][i] - want_row[i]));
        }
        EXPECT_LE(want_row[want] - want_row[got], 2 * max_err)
            << "prompt " << s << " step " << step << ": chose " << got << ", transformers " << want;
        ++near_ties[s];
      }
      if (step + 1 == prompt.greedy_token_ids.size()) continue;
      decode.chunks.push_back({.seq_id = static_cast<uint64_t>(s + 1),
                               .start_position = static_cast<int>(prompt.token_ids.size() + step),
                               .num_tokens = 1,
                               .block_table = tables[s],
                               .logits = LogitsMode::kLastToken});
      decode.token_ids.push_back(want);  // teacher-forced: both stay on the golden text
      in_batch.push_back(s);
    }
    if (in_batch.empty()) break;
    auto next = (*gpu)->Forward(decode, {});
    ASSERT_TRUE(next.ok()) << next.status();
    ASSERT_EQ(next->size(), in_batch.size() * vocab);
    const std::vector<float> want = reference(decode);
    for (size_t i = 0; i < in_batch.size(); ++i) {
      last[in_batch[i]].assign(next->begin() + i * vocab, next->begin() + (i + 1) * vocab);
      bounds[in_batch[i]] =
          std::max(bounds[in_batch[i]], bound_for(want, i * vocab, (i + 1) * vocab));
    }
  }
  for (int s = 0; s < num_prompts; ++s) {
    EXPECT_LT(RelL2(got_rows[s], fixture->prompts[s].greedy_logits), bounds[s]) << "prompt " << s;
    EXPECT_LE(near_ties[s], 2) << "prompt " << s << ": too many greedy disagreements";
  }
  EXPECT_GT((*gpu)->num_graphs(), 0);
}

INSTANTIATE_TEST_SUITE_P(Deepseek, CudaMlaGoldenTest,
                         ::testing::Values("deepseek_v3_latent512", "deepseek_v3_moe_latent512",
                                           "deepseek_v2_moe_latent512"),
                         [](const auto& info) { return info.param; });

TEST(CudaMlaSliceTest, RefusesLatentSizesTheKernelsDoNotRun) {
  RS_SKIP_WITHOUT_GPU();
  const std::string dir = golden::FixtureDir("deepseek_v3");  // kv_lora_rank 16
  auto config = LoadModelConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  auto gpu = CudaModelSlice::Load(
      {.model_dir = dir, .layers = {0, config->num_layers}, .kv_block_size = 4, .kv_num_blocks = 8},
      {.max_batch_tokens = 16, .max_seqs = 2});
  ASSERT_FALSE(gpu.ok());
  EXPECT_EQ(gpu.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(gpu.status().message()), ::testing::HasSubstr("kv_lora_rank 16"));
}

}  // namespace
}  // namespace ringserve::cuda
