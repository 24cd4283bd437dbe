// The CUDA slice's sampling left in flight (SampleAsync / WaitSample) and steps fed their tokens
// on the device (PrepareFed): a prefill and decode steps, each fed the token the step before it
// sampled without the host in between, sample exactly what the same steps sample with the
// tokens copied to the host and back (Sample, Prepare); and the calls' preconditions.
#include <cstdlib>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/test_util.h"
#include "stage/cuda/cuda_model_slice.h"

namespace ringserve::cuda {
namespace {

constexpr int kBlockSize = 4;
constexpr int kBlocksPerSeq = 16;
constexpr int kDecodeSteps = 6;

std::string FixtureDir(const std::string& arch) {
  const char* root = std::getenv("RINGSERVE_SOURCE_DIR");
  return std::string(root ? root : ".") + "/tests/fixtures/models/" + arch;
}

std::vector<int32_t> Table(int seq) {
  std::vector<int32_t> t(kBlocksPerSeq);
  for (int i = 0; i < kBlocksPerSeq; ++i) t[i] = i * 3 + seq;
  return t;
}

// Three sequences: greedy, seeded at temperature 0.8 with top-k, seeded with top-p.
std::vector<RowSampling> Rows(int token_index) {
  const auto index = static_cast<uint64_t>(token_index);
  return {{.config = {}, .token_index = index},
          {.config = {.temperature = 0.8f, .top_k = 20, .seed = 77}, .token_index = index},
          {.config = {.temperature = 1.0f, .top_p = 0.9f, .seed = 5}, .token_index = index}};
}

MicroBatch Prefill(int vocab) {
  MicroBatch batch;
  for (int s = 0; s < 3; ++s) {
    batch.chunks.push_back({.seq_id = static_cast<uint64_t>(s),
                            .start_position = 0,
                            .num_tokens = 4 + 2 * s,
                            .block_table = Table(s),
                            .logits = LogitsMode::kLastToken});
    for (int i = 0; i < 4 + 2 * s; ++i) batch.token_ids.push_back((i * 37 + 11 * s) % vocab);
  }
  return batch;
}

// Decode step `step` (0-based) of the three sequences, with `tokens` as their token ids.
MicroBatch Decode(int step, const std::vector<int32_t>& tokens) {
  MicroBatch batch;
  for (int s = 0; s < 3; ++s) {
    batch.chunks.push_back({.seq_id = static_cast<uint64_t>(s),
                            .start_position = 4 + 2 * s + step,
                            .num_tokens = 1,
                            .block_table = Table(s),
                            .logits = LogitsMode::kLastToken});
  }
  batch.token_ids = tokens;
  return batch;
}

std::unique_ptr<CudaModelSlice> LoadWhole(const std::string& arch) {
  const std::string dir = FixtureDir(arch);
  auto config = LoadModelConfig(dir);
  EXPECT_TRUE(config.ok()) << config.status();
  if (!config.ok()) return nullptr;
  auto slice = CudaModelSlice::Load({.model_dir = dir,
                                     .layers = {0, config->num_layers},
                                     .kv_block_size = kBlockSize,
                                     .kv_num_blocks = 3 * kBlocksPerSeq},
                                    {.max_batch_tokens = 64});
  EXPECT_TRUE(slice.ok()) << slice.status();
  return slice.ok() ? *std::move(slice) : nullptr;
}

class CudaAsyncSampleTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaAsyncSampleTest, FedStepsSampleWhatHostFedStepsSample) {
  RS_SKIP_WITHOUT_GPU();
  std::unique_ptr<CudaModelSlice> host = LoadWhole(GetParam());
  std::unique_ptr<CudaModelSlice> fed = LoadWhole(GetParam());
  ASSERT_NE(host, nullptr);
  ASSERT_NE(fed, nullptr);
  ASSERT_TRUE(fed->can_sample_async());
  const int vocab = host->config().vocab_size;

  // Through the host: every step's tokens come back and go into the next batch.
  std::vector<std::vector<int32_t>> want;
  {
    const MicroBatch prefill = Prefill(vocab);
    ASSERT_TRUE(host->Prepare(prefill).ok());
    ASSERT_TRUE(host->Run(prefill).ok());
    auto sampled = host->Sample(prefill, Rows(0));
    ASSERT_TRUE(sampled.ok()) << sampled.status();
    want.push_back(sampled->tokens);
    for (int step = 0; step < kDecodeSteps; ++step) {
      const MicroBatch decode = Decode(step, want.back());
      ASSERT_TRUE(host->Prepare(decode).ok());
      ASSERT_TRUE(host->Run(decode).ok());
      auto next = host->Sample(decode, Rows(step + 1));
      ASSERT_TRUE(next.ok()) << next.status();
      want.push_back(next->tokens);
    }
  }

  // On the device: each decode is prepared, fed and run before the previous tokens are read.
  std::vector<std::vector<int32_t>> got;
  {
    const MicroBatch prefill = Prefill(vocab);
    ASSERT_TRUE(fed->Prepare(prefill).ok());
    ASSERT_TRUE(fed->Run(prefill).ok());
    ASSERT_TRUE(fed->SampleAsync(prefill, Rows(0)).ok());
    const std::vector<TokenFeed> feeds = {{.token_row = 0, .sampled_row = 0},
                                          {.token_row = 1, .sampled_row = 1},
                                          {.token_row = 2, .sampled_row = 2}};
    for (int step = 0; step < kDecodeSteps; ++step) {
      const MicroBatch decode = Decode(step, {0, 0, 0});  // placeholders
      ASSERT_TRUE(fed->PrepareFed(decode, feeds).ok());
      ASSERT_TRUE(fed->Run(decode).ok());
      ASSERT_TRUE(fed->SampleAsync(decode, Rows(step + 1)).ok());
      auto oldest = fed->WaitSample();
      ASSERT_TRUE(oldest.ok()) << oldest.status();
      got.push_back(oldest->tokens);
    }
    auto last = fed->WaitSample();
    ASSERT_TRUE(last.ok()) << last.status();
    got.push_back(last->tokens);
    EXPECT_TRUE(fed->SampleReady());  // nothing in flight
  }
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "step " << i;
}

TEST_P(CudaAsyncSampleTest, RefusesCallsOutOfOrder) {
  RS_SKIP_WITHOUT_GPU();
  std::unique_ptr<CudaModelSlice> slice = LoadWhole(GetParam());
  ASSERT_NE(slice, nullptr);
  const MicroBatch prefill = Prefill(slice->config().vocab_size);
  const std::vector<TokenFeed> feeds = {{.token_row = 0, .sampled_row = 0}};
  EXPECT_EQ(slice->PrepareFed(prefill, feeds).code(), absl::StatusCode::kFailedPrecondition)
      << "no sampling to feed from";
  EXPECT_EQ(slice->WaitSample().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(slice->SampleAsync(prefill, Rows(0)).code(), absl::StatusCode::kFailedPrecondition)
      << "no Run";

  ASSERT_TRUE(slice->Prepare(prefill).ok());
  ASSERT_TRUE(slice->Run(prefill).ok());
  ASSERT_TRUE(slice->SampleAsync(prefill, Rows(0)).ok());
  EXPECT_EQ(slice->LogitsToHost().status().code(), absl::StatusCode::kFailedPrecondition)
      << "a sampling is in flight";
  const MicroBatch decode = Decode(0, {0, 0, 0});
  const std::vector<TokenFeed> past_the_batch = {{.token_row = 3, .sampled_row = 0}};
  const std::vector<TokenFeed> past_the_rows = {{.token_row = 0, .sampled_row = 3}};
  EXPECT_EQ(slice->PrepareFed(decode, past_the_batch).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(slice->PrepareFed(decode, past_the_rows).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(slice->PrepareFed(decode, feeds).ok());
  ASSERT_TRUE(slice->Run(decode).ok());
  EXPECT_EQ(slice->Sample(decode, Rows(1)).status().code(), absl::StatusCode::kFailedPrecondition)
      << "Sample with a sampling in flight";
  ASSERT_TRUE(slice->Run(decode).ok());  // the same positions again
  ASSERT_TRUE(slice->SampleAsync(decode, Rows(1)).ok());
  const MicroBatch again = Decode(1, {0, 0, 0});
  ASSERT_TRUE(slice->Prepare(again).ok());
  ASSERT_TRUE(slice->Run(again).ok());
  EXPECT_EQ(slice->SampleAsync(again, Rows(2)).code(), absl::StatusCode::kFailedPrecondition)
      << "two samplings already wait";
  for (int i = 0; i < 2; ++i) {
    auto sampled = slice->WaitSample();
    ASSERT_TRUE(sampled.ok()) << sampled.status();
    EXPECT_EQ(sampled->tokens.size(), 3u);
  }
  EXPECT_EQ(slice->WaitSample().status().code(), absl::StatusCode::kFailedPrecondition);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaAsyncSampleTest,
                         ::testing::Values("llama", "qwen3", "qwen3_moe", "gpt_oss"));

}  // namespace
}  // namespace ringserve::cuda
