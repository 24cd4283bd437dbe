// StepExecutor on a one-stage ring with plans sent ahead: a step's sampling left in flight, the
// next step fed its ahead tokens "on the device", outcomes in submission order and equal to
// running every plan to the end with the host's back edge.
//
// The device is played by AsyncCpuSlice (async_cpu_slice_testing.h), a fake around the real CPU
// slice (the GPU path is tested in stage/cuda and by the GPU ring tests).
#include <memory>
#include <string>
#include <vector>

#include "common/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ring/plan_codec.h"
#include "stage/async_cpu_slice_testing.h"
#include "stage/step_executor.h"
#include "stage/step_executor_testing.h"

namespace ringserve {
namespace {

using ::ringserve::testing::AsyncCpuSlice;
using ::testing::HasSubstr;

using ::ringserve::testing::LoadStepExecutorSlice;
using ::ringserve::testing::TwoPromptSampling;

std::unique_ptr<ModelSlice> LoadWhole() { return LoadStepExecutorSlice({0, 3}); }

// Sequences 1 (greedy) and 2 (temperature 0.9, seeded): a prefill, then decodes planned ahead.
MicroBatch Prefill() { return ringserve::testing::TwoPromptPrefill(); }

// Micro-batch `id` >= 2: one decode per sequence (step = id - 2 after the prefill), each a
// placeholder for the token micro-batch id - 1 sampled, as the coordinator plans ahead.
v1::StepPlan AheadDecode(uint64_t id, int top_logprobs = 0) {
  const int step = static_cast<int>(id) - 2;
  MicroBatch batch;
  batch.chunks.push_back({.seq_id = 1,
                          .start_position = 5 + step,
                          .num_tokens = 1,
                          .block_table = {0, 1, 2},
                          .logits = LogitsMode::kLastToken});
  batch.chunks.push_back({.seq_id = 2,
                          .start_position = 3 + step,
                          .num_tokens = 1,
                          .block_table = {3, 4, 5},
                          .logits = LogitsMode::kLastToken});
  batch.token_ids = {0, 0};
  v1::StepPlan plan =
      EncodeStepPlan(id, batch, TwoPromptSampling(1 + step, top_logprobs), true, true);
  plan.set_send_tokens_back(true);
  plan.set_back_edge_through(id - 1);
  plan.set_tokens_from(id - 1);
  plan.add_ahead_chunks(0);
  plan.add_ahead_chunks(1);
  plan.set_back_edge_keep_from(id);
  return plan;
}

std::vector<v1::StepPlan> Plans() {
  std::vector<v1::StepPlan> plans;
  plans.push_back(EncodeStepPlan(1, Prefill(), TwoPromptSampling(0), true, true));
  plans.back().set_send_tokens_back(true);
  plans.push_back(AheadDecode(2));
  plans.push_back(AheadDecode(3));
  plans.push_back(AheadDecode(4, /*top_logprobs=*/2));  // sampled on the host: not deferred
  plans.push_back(AheadDecode(5));
  plans.push_back(AheadDecode(6));
  return plans;
}

std::unique_ptr<StepExecutor> OneStage(std::unique_ptr<ModelSlice> slice) {
  auto executor = StepExecutor::Create({.stage_index = 0}, std::move(slice), StageChannels{});
  EXPECT_TRUE(executor.ok()) << executor.status();
  if (!executor.ok()) return nullptr;
  (*executor)->AttachTokenBackEdge(TokenBackEdge::InProcess());
  return *std::move(executor);
}

// Every plan run to the end, the ahead tokens filled on the host from the back edge.
std::vector<StepOutcome> Reference() {
  std::unique_ptr<StepExecutor> executor = OneStage(LoadWhole());
  std::vector<StepOutcome> outcomes;
  for (const v1::StepPlan& plan : Plans()) {
    auto outcome = executor->Run(plan);
    EXPECT_TRUE(outcome.ok()) << outcome.status();
    if (outcome.ok()) outcomes.push_back(*std::move(outcome));
  }
  EXPECT_EQ(executor->fed_steps(), 0);
  return outcomes;
}

void ExpectSameTokens(const StepOutcome& got, const StepOutcome& want, int step) {
  ASSERT_EQ(got.tokens.size(), want.tokens.size()) << "step " << step;
  for (size_t i = 0; i < got.tokens.size(); ++i) {
    EXPECT_EQ(got.tokens[i].seq_id(), want.tokens[i].seq_id()) << "step " << step;
    EXPECT_EQ(got.tokens[i].token_id(), want.tokens[i].token_id()) << "step " << step;
    EXPECT_FLOAT_EQ(got.tokens[i].logprob(), want.tokens[i].logprob()) << "step " << step;
  }
  EXPECT_EQ(got.num_tokens, want.num_tokens) << "step " << step;
}

TEST(StepExecutorAheadTest, FeedsTheNextStepWhileTheSamplingIsInFlight) {
  const std::vector<StepOutcome> want = Reference();
  ASSERT_EQ(want.size(), 6u);
  auto owned = std::make_unique<AsyncCpuSlice>(LoadWhole());
  AsyncCpuSlice* slice = owned.get();
  std::unique_ptr<StepExecutor> executor = OneStage(std::move(owned));
  std::vector<StepOutcome> got;
  auto finish = [&] {
    auto outcome = executor->FinishOldest();
    ASSERT_TRUE(outcome.ok()) << outcome.status();
    got.push_back(*std::move(outcome));
  };
  // As the stage's worker does: submit the next plan before the previous step's result.
  for (const v1::StepPlan& plan : Plans()) {
    ASSERT_TRUE(executor->Submit(plan).ok());
    while (executor->steps_in_flight() > 1) finish();
  }
  while (executor->steps_in_flight() > 0) finish();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) ExpectSameTokens(got[i], want[i], static_cast<int>(i));
  // Plans 2, 3, 4 (from a sampling in flight) and 6 were fed on the device; plan 5's base (4)
  // sampled on the host, so 5 took its tokens from the back edge. 4 sampled synchronously.
  EXPECT_EQ(executor->fed_steps(), 4);
  EXPECT_EQ(slice->fed_tokens, 8);
  EXPECT_EQ(slice->async_samplings, 5);
  EXPECT_EQ(got[3].tokens.size(), 2u);
}

TEST(StepExecutorAheadTest, ReportsWhetherTheOldestStepFinishesAndRefusesRunMeanwhile) {
  auto owned = std::make_unique<AsyncCpuSlice>(LoadWhole());
  AsyncCpuSlice* slice = owned.get();
  std::unique_ptr<StepExecutor> executor = OneStage(std::move(owned));
  const std::vector<v1::StepPlan> plans = Plans();
  ASSERT_TRUE(executor->Submit(plans[0]).ok());
  EXPECT_EQ(executor->steps_in_flight(), 1);
  EXPECT_EQ(executor->oldest_micro_batch_id(), 1u);
  slice->ready = false;
  EXPECT_FALSE(executor->OldestFinishes());
  slice->ready = true;
  EXPECT_TRUE(executor->OldestFinishes());
  auto refused = executor->Run(plans[1]);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  auto outcome = executor->FinishOldest();
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(outcome->tokens.size(), 2u);
  EXPECT_FALSE(executor->OldestFinishes());  // nothing in flight
  EXPECT_EQ(executor->FinishOldest().status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(StepExecutorAheadTest, AFeedForAnUnsampledSequenceFailsAndLeavesNoStep) {
  auto owned = std::make_unique<AsyncCpuSlice>(LoadWhole());
  std::unique_ptr<StepExecutor> executor = OneStage(std::move(owned));
  const std::vector<v1::StepPlan> plans = Plans();
  ASSERT_TRUE(executor->Submit(plans[0]).ok());
  v1::StepPlan stranger = plans[1];
  stranger.mutable_chunks(1)->set_seq_id(77);
  const absl::Status status = executor->Submit(stranger);
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), HasSubstr("sampled no token for sequence 77"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("stage 0, micro-batch 2"));
  EXPECT_EQ(executor->steps_in_flight(), 1);  // the prefill's outcome is still owed
  auto outcome = executor->FinishOldest();
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  EXPECT_EQ(outcome->tokens.size(), 2u);
}

}  // namespace
}  // namespace ringserve
