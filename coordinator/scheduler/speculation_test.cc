// The scheduler with speculative decoding: verification chunks, rollback of rejected drafts
// (positions, KV blocks, prefix-cache hashes), stop conditions inside accepted drafts,
// preemption, and the adaptive k.
#include <numeric>

#include "coordinator/scheduler/scheduler.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringserve {
namespace {

using ::testing::ElementsAre;

SchedulerOptions SpeculatingOptions(int max_drafts = 3, int blocks = 64) {
  SchedulerOptions options;
  options.num_stages = 1;
  options.kv_num_blocks = blocks;
  options.kv_block_size = 4;
  options.prefix_caching = false;
  options.speculation.max_drafts = max_drafts;
  // The speculating path from the first plan on: with the payoff measured, a ring starts with
  // plain decoding (speculation_payoff_test.cc tests that).
  options.speculation.payoff.enabled = false;
  return options;
}

std::vector<int32_t> Prompt(int length, int32_t first = 100) {
  std::vector<int32_t> prompt(length);
  std::iota(prompt.begin(), prompt.end(), first);
  return prompt;
}

SequenceParams MaxTokens(int max_tokens) {
  SequenceParams params;
  params.max_tokens = max_tokens;
  return params;
}

std::vector<int32_t> Emitted(const MicroBatchResult& result) {
  std::vector<int32_t> tokens;
  for (const TokenUpdate& update : result.tokens) tokens.push_back(update.token);
  return tokens;
}

TEST(SpeculationSchedulerTest, VerifiesDraftsAndRollsBackTheRejectedOnes) {
  Scheduler scheduler(SpeculatingOptions());
  ASSERT_TRUE(scheduler.AddRequest(1, Prompt(5), MaxTokens(50)).ok());

  // The prompt: the last stage is told the whole context and asked for drafts.
  auto prefill = scheduler.NextMicroBatch();
  ASSERT_TRUE(prefill.has_value());
  const ChunkSpeculationWire& told = prefill->entries[0].speculation;
  EXPECT_TRUE(told.active);
  EXPECT_EQ(told.context_start, 0);
  EXPECT_EQ(told.context_ids, Prompt(5));
  EXPECT_EQ(told.propose, 3);  // the optimistic start takes every draft allowed
  std::vector<SpeculativeTokens> spec = {{.accepted = {}, .drafts = {11, 12, 13}}};
  auto first = scheduler.OnMicroBatchDone(prefill->id, std::vector<int32_t>{10}, spec);
  ASSERT_TRUE(first.ok());
  EXPECT_THAT(Emitted(*first), ElementsAre(10));

  // The verification chunk: [10, 11, 12, 13] at positions 5..8, every row's logits.
  auto verify = scheduler.NextMicroBatch();
  ASSERT_TRUE(verify.has_value());
  const SequenceChunk& chunk = verify->batch.chunks[0];
  EXPECT_EQ(chunk.start_position, 5);
  EXPECT_EQ(chunk.num_tokens, 4);
  EXPECT_EQ(chunk.logits, LogitsMode::kAllTokens);
  EXPECT_THAT(verify->batch.token_ids, ElementsAre(10, 11, 12, 13));
  EXPECT_THAT(verify->entries[0].speculation.draft_ids, ElementsAre(11, 12, 13));
  EXPECT_EQ(verify->entries[0].speculation.context_start, 5);
  EXPECT_THAT(verify->entries[0].speculation.context_ids, ElementsAre(10));
  EXPECT_EQ(chunk.block_table.size(), 3u);  // 9 positions
  ASSERT_TRUE(scheduler.CheckInvariants().ok()) << scheduler.CheckInvariants();

  // One draft accepted, then 20: positions 7 and 8 (13's and 12's) are given back.
  spec = {{.accepted = {11}, .drafts = {21, 22}}};
  auto second = scheduler.OnMicroBatchDone(verify->id, std::vector<int32_t>{20}, spec);
  ASSERT_TRUE(second.ok());
  EXPECT_THAT(Emitted(*second), ElementsAre(11, 20));
  EXPECT_EQ(second->tokens[1].token_index, 2);
  EXPECT_EQ(scheduler.Stats().kv_blocks_used, 2);  // 7 verified positions
  ASSERT_TRUE(scheduler.CheckInvariants().ok()) << scheduler.CheckInvariants();

  auto again = scheduler.NextMicroBatch();
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->batch.chunks[0].start_position, 7);
  EXPECT_THAT(again->batch.token_ids, ElementsAre(20, 21, 22));
  EXPECT_EQ(again->entries[0].speculation.context_start, 6);
  EXPECT_THAT(again->entries[0].speculation.context_ids, ElementsAre(11, 20));
  EXPECT_EQ(again->entries[0].token_index, 3);
  EXPECT_THAT(scheduler.GeneratedTokens(1), ElementsAre(10, 11, 20));

  const SchedulerStats stats = scheduler.Stats();
  EXPECT_EQ(stats.verification_chunks, 1);
  EXPECT_EQ(stats.drafts_verified, 3);
  EXPECT_EQ(stats.drafts_accepted, 1);
  EXPECT_EQ(stats.tokens_from_verification, 2);
}

TEST(SpeculationSchedulerTest, AStopTokenInsideTheAcceptedDraftsEndsTheRequestThere) {
  SchedulerOptions options = SpeculatingOptions();
  options.eos_token_ids = {7};
  Scheduler scheduler(options);
  ASSERT_TRUE(scheduler.AddRequest(1, Prompt(3), MaxTokens(50)).ok());
  auto prefill = scheduler.NextMicroBatch();
  std::vector<SpeculativeTokens> spec = {{.accepted = {}, .drafts = {5, 7, 9}}};
  ASSERT_TRUE(scheduler.OnMicroBatchDone(prefill->id, std::vector<int32_t>{4}, spec).ok());
  auto verify = scheduler.NextMicroBatch();
  spec = {{.accepted = {5, 7, 9}, .drafts = {}}};
  auto done = scheduler.OnMicroBatchDone(verify->id, std::vector<int32_t>{8}, spec);
  ASSERT_TRUE(done.ok());
  EXPECT_THAT(Emitted(*done), ElementsAre(5, 7));
  EXPECT_EQ(done->tokens.back().finish_reason, FinishReason::kStop);
  EXPECT_FALSE(scheduler.HasWork());
  EXPECT_EQ(scheduler.Stats().kv_blocks_used, 0);
  ASSERT_TRUE(scheduler.AddRequest(2, Prompt(3), MaxTokens(2)).ok());
  auto next = scheduler.NextMicroBatch();
  ASSERT_TRUE(next.has_value());
  // The finished sequence's draft state is released with the next plan.
  EXPECT_THAT(next->released_speculation, ElementsAre(1));
  // max_tokens 2: one draft at most (the sampled token and one accepted draft).
  EXPECT_EQ(next->entries[0].speculation.propose, 1);
}

TEST(SpeculationSchedulerTest, VerificationStaysWithinMaxTokens) {
  Scheduler scheduler(SpeculatingOptions(4));
  ASSERT_TRUE(scheduler.AddRequest(1, Prompt(3), MaxTokens(3)).ok());
  auto prefill = scheduler.NextMicroBatch();
  EXPECT_EQ(prefill->entries[0].speculation.propose, 2);
  // More drafts than asked for: only what max_tokens leaves room for is verified.
  std::vector<SpeculativeTokens> spec = {{.accepted = {}, .drafts = {5, 6, 7, 8}}};
  ASSERT_TRUE(scheduler.OnMicroBatchDone(prefill->id, std::vector<int32_t>{4}, spec).ok());
  auto verify = scheduler.NextMicroBatch();
  ASSERT_TRUE(verify.has_value());
  // [4, 5]: 4 is generated already, so 2 more tokens at most (one draft and the last token).
  EXPECT_EQ(verify->batch.chunks[0].num_tokens, 2);
  spec = {{.accepted = {5}, .drafts = {}}};
  auto done = scheduler.OnMicroBatchDone(verify->id, std::vector<int32_t>{9}, spec);
  ASSERT_TRUE(done.ok());
  EXPECT_THAT(Emitted(*done), ElementsAre(5, 9));
  EXPECT_EQ(done->tokens.back().finish_reason, FinishReason::kLength);
  EXPECT_FALSE(scheduler.HasWork());
}

TEST(SpeculationSchedulerTest, MoreAcceptedDraftsThanVerifiedIsRefused) {
  Scheduler scheduler(SpeculatingOptions());
  ASSERT_TRUE(scheduler.AddRequest(1, Prompt(3), MaxTokens(50)).ok());
  auto prefill = scheduler.NextMicroBatch();
  std::vector<SpeculativeTokens> spec = {{.accepted = {5}, .drafts = {}}};
  EXPECT_FALSE(scheduler.OnMicroBatchDone(prefill->id, std::vector<int32_t>{4}, spec).ok());
  EXPECT_TRUE(scheduler.OnMicroBatchDone(prefill->id, std::vector<int32_t>{4}).ok());
}

TEST(SpeculationSchedulerTest, PrefixCacheHashesOnlyVerifiedTokens) {
  SchedulerOptions options = SpeculatingOptions(4);
  options.prefix_caching = true;
  Scheduler scheduler(options);
  ASSERT_TRUE(scheduler.AddRequest(1, Prompt(3), MaxTokens(50)).ok());
  auto prefill = scheduler.NextMicroBatch();
  std::vector<SpeculativeTokens> spec = {{.accepted = {}, .drafts = {51, 52, 53, 54}}};
  ASSERT_TRUE(scheduler.OnMicroBatchDone(prefill->id, std::vector<int32_t>{50}, spec).ok());
  auto verify = scheduler.NextMicroBatch();  // positions 3..7: fills block 1 with drafts
  spec = {{.accepted = {}, .drafts = {}}};   // every draft rejected
  ASSERT_TRUE(scheduler.OnMicroBatchDone(verify->id, std::vector<int32_t>{60}, spec).ok());
  ASSERT_TRUE(scheduler.Finish(1));
  // A prompt equal to the verified tokens (100, 101, 102, 50) hits one cached block; one that
  // continues with the rejected drafts finds nothing beyond it.
  ASSERT_TRUE(scheduler.AddRequest(2, {100, 101, 102, 50, 51, 52, 53, 54, 1}, MaxTokens(4)).ok());
  auto next = scheduler.NextMicroBatch();
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->batch.chunks[0].start_position, 4);
  EXPECT_EQ(scheduler.Stats().prefix_hit_tokens, 4);
  // Speculating sequences tell the last stage their whole context, cached positions included.
  EXPECT_EQ(next->entries[0].speculation.context_start, 0);
  EXPECT_EQ(next->entries[0].speculation.context_ids.size(), 9u);
  ASSERT_TRUE(scheduler.CheckInvariants().ok()) << scheduler.CheckInvariants();
}

TEST(SpeculationSchedulerTest, PreemptionStartsTheDraftAfresh) {
  // 4 blocks of 4: two sequences of 8 prompt tokens fill them; the younger is preempted when
  // the older verifies drafts.
  Scheduler scheduler(SpeculatingOptions(3, 4));
  ASSERT_TRUE(scheduler.AddRequest(1, Prompt(8), MaxTokens(8)).ok());
  ASSERT_TRUE(scheduler.AddRequest(2, Prompt(8, 200), MaxTokens(8)).ok());
  auto prefill = scheduler.NextMicroBatch();
  ASSERT_EQ(prefill->entries.size(), 2u);
  std::vector<SpeculativeTokens> spec = {{.accepted = {}, .drafts = {1, 2, 3}},
                                         {.accepted = {}, .drafts = {4, 5, 6}}};
  ASSERT_TRUE(scheduler.OnMicroBatchDone(prefill->id, std::vector<int32_t>{9, 9}, spec).ok());
  auto verify = scheduler.NextMicroBatch();
  ASSERT_TRUE(verify.has_value());
  EXPECT_THAT(verify->preempted, ElementsAre(2));
  EXPECT_THAT(verify->released_speculation, ElementsAre(2));
  ASSERT_TRUE(scheduler.CheckInvariants().ok()) << scheduler.CheckInvariants();
  spec = {{.accepted = {1, 2, 3}, .drafts = {}}};
  ASSERT_TRUE(scheduler.OnMicroBatchDone(verify->id, std::vector<int32_t>{4}, spec).ok());
  EXPECT_THAT(scheduler.GeneratedTokens(1), ElementsAre(9, 1, 2, 3, 4));
  // Sequence 2 comes back later with context_start 0.
  bool resumed = false;
  for (int step = 0; step < 20 && scheduler.HasWork() && !resumed; ++step) {
    auto plan = scheduler.NextMicroBatch();
    ASSERT_TRUE(plan.has_value());
    for (const PlannedChunk& entry : plan->entries) {
      if (entry.seq_id == 2) {
        resumed = true;
        EXPECT_EQ(entry.speculation.context_start, 0);
        EXPECT_EQ(entry.token_index, 1);  // its first token is kept
      }
    }
    std::vector<SpeculativeTokens> none(plan->num_sampled());
    ASSERT_TRUE(
        scheduler.OnMicroBatchDone(plan->id, std::vector<int32_t>(plan->num_sampled(), 9), none)
            .ok());
    ASSERT_TRUE(scheduler.CheckInvariants().ok()) << scheduler.CheckInvariants();
  }
  EXPECT_TRUE(resumed);
}

TEST(SpeculationPolicyTest, KFollowsTheAcceptanceRateAndBacksOff) {
  SpeculationOptions options{.max_drafts = 6, .max_decoding_sequences = 8};
  SpeculationPolicy policy;
  const int optimistic = policy.NextDrafts(options, 1);
  EXPECT_GE(optimistic, 3);
  EXPECT_EQ(policy.NextDrafts(options, 9), 0);  // a large batch: no speculation
  for (int i = 0; i < 10; ++i) policy.OnVerified(options, 4, 4);
  EXPECT_EQ(policy.NextDrafts(options, 1), 6);
  for (int i = 0; i < 10; ++i) policy.OnVerified(options, 4, 0);
  EXPECT_EQ(policy.NextDrafts(options, 1), 0);  // it does not pay
  for (int i = 0; i < options.probe_after_tokens; ++i) policy.OnPlainToken();
  EXPECT_EQ(policy.NextDrafts(options, 1), 1);  // probe again
}

}  // namespace
}  // namespace ringserve
