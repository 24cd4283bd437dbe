#include "stage/last_stage_outputs.h"

#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringserve {
namespace {

using ::testing::HasSubstr;

constexpr int kVocab = 4;

double LogSoftmaxAt(const std::vector<float>& row, int token) {
  double max = row[0];
  for (float v : row) max = std::max<double>(max, v);
  double sum = 0;
  for (float v : row) sum += std::exp(v - max);
  return row[token] - max - std::log(sum);
}

// A decode chunk, a prompt-logprob chunk that ends its prompt (3 rows, samples its last), a
// chunk without logits, and a prompt-logprob chunk in the middle of a prompt (2 rows, scores
// both). Encoded and decoded as the coordinator and the last stage do.
DecodedPlan MixedPlan() {
  MicroBatch batch;
  batch.chunks.push_back({.seq_id = 1,
                          .start_position = 5,
                          .num_tokens = 1,
                          .block_table = {0},
                          .logits = LogitsMode::kLastToken});
  batch.chunks.push_back({.seq_id = 2,
                          .start_position = 4,
                          .num_tokens = 3,
                          .block_table = {1},
                          .logits = LogitsMode::kAllTokens});
  batch.chunks.push_back({.seq_id = 3,
                          .start_position = 0,
                          .num_tokens = 2,
                          .block_table = {2},
                          .logits = LogitsMode::kNone});
  batch.chunks.push_back({.seq_id = 4,
                          .start_position = 0,
                          .num_tokens = 2,
                          .block_table = {3},
                          .logits = LogitsMode::kAllTokens});
  std::vector<ChunkSamplingWire> wire(4);
  wire[1].score_token_ids = {3, 0};
  wire[3].samples = false;
  wire[3].score_token_ids = {2, 1};
  v1::StepPlan plan = EncodeStepPlan(8, batch, wire, false, true);
  absl::StatusOr<DecodedPlan> decoded = DecodeStepPlan(plan, false, true, 16);
  EXPECT_TRUE(decoded.ok()) << decoded.status();
  return decoded.ok() ? *decoded : DecodedPlan{};
}

TEST(LastStageOutputsTest, SamplesLastRowsAndScoresEveryPromptRow) {
  DecodedPlan plan = MixedPlan();
  ASSERT_EQ(plan.outputs.size(), 4u);
  ASSERT_EQ(plan.sampling.size(), 2u);  // greedy: temperature 0
  // Rows: seq 1 (1), seq 2 (3), seq 4 (2).
  const std::vector<std::vector<float>> rows = {
      {0.1f, 2.0f, 0.3f, -1.0f},                              // seq 1 -> 1
      {1.0f, 0.5f, -0.5f, 2.5f}, {3.0f, 1.0f, 0.0f, 0.0f},    // seq 2 scored
      {0.0f, 0.0f, 0.0f, 4.0f},                               // seq 2 -> 3
      {0.2f, -0.2f, 1.5f, 0.0f}, {-3.0f, 0.7f, 0.1f, 0.1f}};  // seq 4 scored
  std::vector<float> logits;
  for (const auto& r : rows) logits.insert(logits.end(), r.begin(), r.end());

  absl::StatusOr<LastStageOutputs> out = SampleAndScore(logits, kVocab, plan);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->tokens.size(), 2u);
  EXPECT_EQ(out->tokens[0].seq_id(), 1u);
  EXPECT_EQ(out->tokens[0].token_id(), 1);
  EXPECT_NEAR(out->tokens[0].logprob(), LogSoftmaxAt(rows[0], 1), 1e-5);
  EXPECT_EQ(out->tokens[1].seq_id(), 2u);
  EXPECT_EQ(out->tokens[1].token_id(), 3);
  EXPECT_NEAR(out->tokens[1].logprob(), LogSoftmaxAt(rows[3], 3), 1e-5);

  ASSERT_EQ(out->prompt_logprobs.size(), 2u);
  const v1::PromptLogprobs& a = out->prompt_logprobs[0];
  EXPECT_EQ(a.seq_id(), 2u);
  EXPECT_EQ(a.start_position(), 4);
  ASSERT_EQ(a.logprobs_size(), 2);
  EXPECT_NEAR(a.logprobs(0), LogSoftmaxAt(rows[1], 3), 1e-5);
  EXPECT_NEAR(a.logprobs(1), LogSoftmaxAt(rows[2], 0), 1e-5);
  const v1::PromptLogprobs& b = out->prompt_logprobs[1];
  EXPECT_EQ(b.seq_id(), 4u);
  ASSERT_EQ(b.logprobs_size(), 2);
  EXPECT_NEAR(b.logprobs(0), LogSoftmaxAt(rows[4], 2), 1e-5);
  EXPECT_NEAR(b.logprobs(1), LogSoftmaxAt(rows[5], 1), 1e-5);
}

TEST(LastStageOutputsTest, RefusesLogitsThatDoNotMatchThePlan) {
  DecodedPlan plan = MixedPlan();
  std::vector<float> logits(5 * kVocab, 0.0f);  // 6 rows expected
  absl::StatusOr<LastStageOutputs> out = SampleAndScore(logits, kVocab, plan);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(out.status().message(), HasSubstr("expected 6 rows"));
}

TEST(LastStageOutputsTest, DecodeRefusesScoreIdsThatDoNotFitTheChunk) {
  MicroBatch batch;
  batch.chunks.push_back({.seq_id = 2,
                          .start_position = 0,
                          .num_tokens = 3,
                          .block_table = {1},
                          .logits = LogitsMode::kAllTokens});
  std::vector<ChunkSamplingWire> wire(1);
  wire[0].score_token_ids = {1, 2, 3};  // samples, so only 2 rows are scored
  v1::StepPlan plan = EncodeStepPlan(9, batch, wire, false, true);
  absl::StatusOr<DecodedPlan> decoded = DecodeStepPlan(plan, false, true, 16);
  EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(decoded.status().message(), HasSubstr("3 score token ids for 3 tokens"));
}

}  // namespace
}  // namespace ringserve

namespace ringserve {
namespace {

// A decode chunk asking for its top 3 alternatives while stop id 2 is suppressed, and a plain
// decode chunk: the plan codec carries both, the first needs the host path, and the outputs
// report the top list of the raw row while never sampling the suppressed id.
TEST(LastStageOutputsTest, TopLogprobsAndSuppressedIds) {
  MicroBatch batch;
  for (uint64_t seq : {1, 2}) {
    batch.chunks.push_back({.seq_id = seq,
                            .start_position = 3,
                            .num_tokens = 1,
                            .block_table = {static_cast<int32_t>(seq)},
                            .logits = LogitsMode::kLastToken});
  }
  std::vector<ChunkSamplingWire> wire(2);
  wire[0].top_logprobs = 3;
  wire[0].suppress_token_ids = {2};
  absl::StatusOr<DecodedPlan> plan =
      DecodeStepPlan(EncodeStepPlan(9, batch, wire, false, true), false, true, 16);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->sampling.size(), 2u);
  EXPECT_EQ(plan->sampling[0].top_logprobs, 3);
  EXPECT_EQ(plan->sampling[0].suppress_token_ids, std::vector<int32_t>{2});
  EXPECT_TRUE(NeedsHostLogits(*plan));
  DecodedPlan plain = *plan;
  for (RowSampling& row : plain.sampling) {
    row.top_logprobs = 0;
    row.suppress_token_ids.clear();
  }
  EXPECT_FALSE(NeedsHostLogits(plain));

  // Greedy rows; token 2 is the argmax of both.
  const std::vector<float> row = {0.5f, 1.0f, 3.0f, 1.0f};
  std::vector<float> logits = row;
  logits.insert(logits.end(), row.begin(), row.end());
  absl::StatusOr<LastStageOutputs> out = SampleAndScore(logits, kVocab, *plan);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->tokens.size(), 2u);
  const v1::SampledToken& held = out->tokens[0];
  EXPECT_EQ(held.token_id(), 1) << "2 is suppressed; 1 and 3 tie, the lower id wins";
  EXPECT_NEAR(held.logprob(), LogSoftmaxAt(row, 1), 1e-6) << "the raw row's logprob";
  ASSERT_EQ(held.top_token_ids_size(), 3);
  EXPECT_EQ(held.top_token_ids(0), 2) << "alternatives come from the raw row";
  EXPECT_EQ(held.top_token_ids(1), 1);
  EXPECT_EQ(held.top_token_ids(2), 3);
  for (int k = 0; k < 3; ++k) {
    EXPECT_NEAR(held.top_logprobs(k), LogSoftmaxAt(row, held.top_token_ids(k)), 1e-6);
  }
  EXPECT_EQ(out->tokens[1].token_id(), 2);
  EXPECT_EQ(out->tokens[1].top_token_ids_size(), 0);
  // Out of range top_logprobs is refused by the decoder.
  wire[0].top_logprobs = 21;
  EXPECT_FALSE(DecodeStepPlan(EncodeStepPlan(9, batch, wire, false, true), false, true, 16).ok());
}

}  // namespace
}  // namespace ringserve
