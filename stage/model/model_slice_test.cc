// The ModelSlice sequence (Prepare, Run, Sample / LogitsToHost) on the CPU slice: what the step
// executor and the benchmarks rely on besides the numbers (golden tests check those).
#include "stage/model/model_slice.h"

#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "stage/sampling/sampler.h"

namespace ringserve {
namespace {

using ::testing::HasSubstr;

constexpr char kModel[] = "tests/fixtures/models/qwen2";  // 3 layers, hidden 64, vocab 448
constexpr int kHidden = 64;
constexpr int kVocab = 448;

std::unique_ptr<ModelSlice> Load(LayerRange layers) {
  auto slice = ModelSlice::LoadCpu(
      {.model_dir = kModel, .layers = layers, .kv_block_size = 4, .kv_num_blocks = 16});
  EXPECT_TRUE(slice.ok()) << slice.status();
  return slice.ok() ? *std::move(slice) : nullptr;
}

MicroBatch Batch() {
  MicroBatch batch;
  batch.chunks.push_back({.seq_id = 1,
                          .start_position = 0,
                          .num_tokens = 4,
                          .block_table = {0},
                          .logits = LogitsMode::kLastToken});
  batch.chunks.push_back({.seq_id = 2,
                          .start_position = 0,
                          .num_tokens = 2,
                          .block_table = {1},
                          .logits = LogitsMode::kLastToken});
  batch.token_ids = {7, 300, 21, 4, 99, 100};
  return batch;
}

TEST(ModelSliceTest, HostBufferCarriesTheBatchBetweenSlices) {
  std::unique_ptr<ModelSlice> head = Load({0, 2});
  std::unique_ptr<ModelSlice> tail = Load({2, 3});
  std::unique_ptr<ModelSlice> whole = Load({0, 3});
  ASSERT_TRUE(head && tail && whole);
  EXPECT_EQ(head->activations().memory(), MemorySpace::kHost);
  EXPECT_EQ(head->activations().device(), -1);
  const MicroBatch batch = Batch();

  ASSERT_TRUE(head->Prepare(batch).ok());
  EXPECT_EQ(head->activations().tokens(), 6);
  EXPECT_EQ(head->activations().bytes(), 6 * kHidden * 4);
  ASSERT_TRUE(head->Run(batch).ok());
  std::vector<float> hidden(6 * kHidden);
  ASSERT_TRUE(head->activations().CopyToHost(hidden).ok());

  ASSERT_TRUE(tail->Prepare(batch).ok());
  EXPECT_EQ(tail->activations().CopyFromHost(std::span<const float>(hidden).subspan(1)).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(tail->activations().CopyFromHost(hidden).ok());
  ASSERT_TRUE(tail->Run(batch).ok());
  const std::vector<RowSampling> rows = {{.config = {}},
                                         {.config = {.temperature = 0.7f, .seed = 9}}};
  absl::StatusOr<SampledRows> sampled = tail->Sample(batch, rows);
  ASSERT_TRUE(sampled.ok()) << sampled.status();

  // The same as the whole model's logits through the host sampler.
  absl::StatusOr<std::vector<float>> logits = whole->Forward(batch, {});
  ASSERT_TRUE(logits.ok()) << logits.status();
  ASSERT_EQ(logits->size(), 2u * kVocab);
  absl::StatusOr<std::vector<int32_t>> want = SampleTokens(*logits, kVocab, rows);
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(sampled->tokens, *want);
  ASSERT_EQ(sampled->logprobs.size(), 2u);
  for (size_t r = 0; r < 2; ++r) {
    EXPECT_EQ(
        sampled->logprobs[r],
        TokenLogprob(std::span<const float>(*logits).subspan(r * kVocab, kVocab), (*want)[r]));
  }
  absl::StatusOr<std::vector<float>> tail_logits = tail->LogitsToHost();
  ASSERT_TRUE(tail_logits.ok());
  EXPECT_EQ(*tail_logits, *logits);
}

TEST(ModelSliceTest, SampleNeedsARunOfTheLastSliceAndOneRowPerChunk) {
  std::unique_ptr<ModelSlice> head = Load({0, 2});
  std::unique_ptr<ModelSlice> whole = Load({0, 3});
  ASSERT_TRUE(head && whole);
  const MicroBatch batch = Batch();
  const std::vector<RowSampling> rows(2);
  ASSERT_TRUE(whole->Prepare(batch).ok());
  EXPECT_EQ(whole->Sample(batch, rows).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(whole->LogitsToHost().status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(whole->Run(batch).ok());
  absl::StatusOr<SampledRows> one_row = whole->Sample(batch, std::span(rows).first(1));
  EXPECT_EQ(one_row.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(one_row.status().message()), HasSubstr("1 sampling rows"));
  EXPECT_TRUE(whole->Sample(batch, rows).ok());

  ASSERT_TRUE(head->Prepare(batch).ok());
  ASSERT_TRUE(head->Run(batch).ok());
  EXPECT_EQ(head->Sample(batch, rows).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(head->LogitsToHost().status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace ringserve
