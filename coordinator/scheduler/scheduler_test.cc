#include "coordinator/scheduler/scheduler.h"

#include <map>
#include <numeric>
#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringserve {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;

SchedulerOptions Options(int stages, int blocks = 256, int block_size = 4, int budget = 512) {
  SchedulerOptions options;
  options.num_stages = stages;
  options.kv_num_blocks = blocks;
  options.kv_block_size = block_size;
  options.max_tokens_per_micro_batch = budget;
  options.prefix_caching = false;  // on in the PrefixCache tests below
  return options;
}

std::vector<int32_t> Prompt(int length, int32_t first = 1) {
  std::vector<int32_t> prompt(length);
  std::iota(prompt.begin(), prompt.end(), first);
  return prompt;
}

SequenceParams MaxTokens(int max_tokens) {
  SequenceParams params;
  params.max_tokens = max_tokens;
  return params;
}

// One token per sampling chunk, each `token`.
std::vector<int32_t> Tokens(const MicroBatchPlan& plan, int32_t token) {
  return std::vector<int32_t>(plan.num_sampled(), token);
}

TEST(KvBlockManagerTest, AllocatesFreesAndRefusesWhatItDoesNotHave) {
  KvBlockManager blocks(4, 16);
  EXPECT_EQ(blocks.BlocksFor(0), 0);
  EXPECT_EQ(blocks.BlocksFor(16), 1);
  EXPECT_EQ(blocks.BlocksFor(17), 2);
  auto first = blocks.Allocate(3);
  ASSERT_TRUE(first.has_value());
  EXPECT_THAT(*first, ElementsAre(0, 1, 2));
  EXPECT_EQ(blocks.num_free(), 1);
  EXPECT_FALSE(blocks.Allocate(2).has_value());
  EXPECT_EQ(blocks.num_free(), 1);
  blocks.Free(std::vector<int32_t>{1});
  EXPECT_FALSE(blocks.IsAllocated(1));
  EXPECT_TRUE(blocks.IsAllocated(2));
  EXPECT_EQ(blocks.Allocate(2)->size(), 2u);
  EXPECT_EQ(blocks.num_used(), 4);
}

TEST(KvBlockManagerDeathTest, DoubleFreeAborts) {
  KvBlockManager blocks(2, 1);
  auto got = blocks.Allocate(1);
  blocks.Free(*got);
  EXPECT_DEATH(blocks.Free(*got), "not allocated");
}

TEST(SchedulerTest, ValidatesOptionsAndRequests) {
  SchedulerOptions bad = Options(0);
  EXPECT_EQ(Scheduler::Validate(bad).code(), absl::StatusCode::kInvalidArgument);
  bad = Options(2, 0);
  EXPECT_EQ(Scheduler::Validate(bad).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Scheduler::Validate(Options(2)).ok());

  SchedulerOptions options = Options(1, 4, 4);  // 16 positions
  options.max_context = 12;
  Scheduler scheduler(options);
  EXPECT_EQ(scheduler.max_micro_batches_in_flight(), 1);
  EXPECT_TRUE(scheduler.AddRequest(1, Prompt(3), MaxTokens(4)).ok());
  EXPECT_EQ(scheduler.AddRequest(1, Prompt(3), MaxTokens(4)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(scheduler.AddRequest(2, {}, MaxTokens(4)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(scheduler.AddRequest(3, Prompt(3), MaxTokens(0)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(scheduler.AddRequest(4, Prompt(12), MaxTokens(1)).code(),
            absl::StatusCode::kInvalidArgument);
  Scheduler small(Options(1, 2, 4));  // 8 positions, no context limit
  EXPECT_EQ(small.AddRequest(5, Prompt(9), MaxTokens(1)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(small.AddRequest(5, Prompt(8), MaxTokens(1)).ok());
}

TEST(SchedulerTest, PrefillThenDecodesUntilMaxTokens) {
  Scheduler scheduler(Options(1, 16, 4));
  ASSERT_TRUE(scheduler.AddRequest(7, Prompt(10), MaxTokens(3)).ok());

  auto prefill = scheduler.NextMicroBatch();
  ASSERT_TRUE(prefill.has_value());
  ASSERT_EQ(prefill->batch.chunks.size(), 1u);
  const SequenceChunk& chunk = prefill->batch.chunks[0];
  EXPECT_EQ(chunk.seq_id, 7u);
  EXPECT_EQ(chunk.start_position, 0);
  EXPECT_EQ(chunk.num_tokens, 10);
  EXPECT_EQ(chunk.block_table.size(), 3u);
  EXPECT_EQ(chunk.logits, LogitsMode::kLastToken);
  EXPECT_THAT(prefill->batch.token_ids, ElementsAreArray(Prompt(10)));
  EXPECT_TRUE(prefill->entries[0].samples);
  EXPECT_FALSE(prefill->entries[0].is_decode);
  EXPECT_EQ(prefill->entries[0].token_index, 0);
  EXPECT_FALSE(scheduler.NextMicroBatch().has_value());  // M = 1 in flight

  auto first = scheduler.OnMicroBatchDone(prefill->id, std::vector<int32_t>{42});
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->tokens.size(), 1u);
  EXPECT_EQ(first->tokens[0].token, 42);
  EXPECT_EQ(first->tokens[0].token_index, 0);
  EXPECT_EQ(first->tokens[0].finish_reason, FinishReason::kNone);

  auto decode = scheduler.NextMicroBatch();
  ASSERT_TRUE(decode.has_value());
  ASSERT_EQ(decode->batch.chunks.size(), 1u);
  EXPECT_EQ(decode->batch.chunks[0].start_position, 10);
  EXPECT_EQ(decode->batch.chunks[0].num_tokens, 1);
  EXPECT_EQ(decode->batch.chunks[0].block_table.size(), 3u);
  EXPECT_THAT(decode->batch.token_ids, ElementsAre(42));
  EXPECT_TRUE(decode->entries[0].is_decode);
  EXPECT_EQ(decode->entries[0].token_index, 1);
  ASSERT_TRUE(scheduler.OnMicroBatchDone(decode->id, std::vector<int32_t>{43}).ok());

  decode = scheduler.NextMicroBatch();
  ASSERT_TRUE(decode.has_value());
  EXPECT_EQ(decode->batch.chunks[0].start_position, 11);
  auto last = scheduler.OnMicroBatchDone(decode->id, std::vector<int32_t>{44});
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(last->tokens[0].finish_reason, FinishReason::kLength);
  EXPECT_EQ(last->tokens[0].token_index, 2);
  EXPECT_FALSE(scheduler.HasWork());
  EXPECT_EQ(scheduler.Stats().kv_blocks_used, 0);
  EXPECT_EQ(scheduler.Stats().tokens_generated, 3);
}

TEST(SchedulerTest, LongPromptIsChunkedUnderTheBudgetAndPipelined) {
  Scheduler scheduler(Options(4, 64, 4, /*budget=*/16));
  ASSERT_TRUE(scheduler.AddRequest(1, Prompt(40), MaxTokens(2)).ok());
  std::vector<MicroBatchPlan> plans;
  while (auto plan = scheduler.NextMicroBatch()) plans.push_back(*plan);
  // Three chunks in flight at once (stages run them in order); only the last samples.
  ASSERT_EQ(plans.size(), 3u);
  EXPECT_EQ(plans[0].batch.chunks[0].start_position, 0);
  EXPECT_EQ(plans[0].batch.chunks[0].num_tokens, 16);
  EXPECT_EQ(plans[0].batch.chunks[0].logits, LogitsMode::kNone);
  EXPECT_EQ(plans[0].batch.chunks[0].block_table.size(), 4u);
  EXPECT_EQ(plans[1].batch.chunks[0].start_position, 16);
  EXPECT_EQ(plans[1].batch.chunks[0].block_table.size(), 8u);
  EXPECT_EQ(plans[2].batch.chunks[0].start_position, 32);
  EXPECT_EQ(plans[2].batch.chunks[0].num_tokens, 8);
  EXPECT_EQ(plans[2].batch.chunks[0].logits, LogitsMode::kLastToken);
  EXPECT_THAT(plans[2].batch.token_ids, ElementsAre(33, 34, 35, 36, 37, 38, 39, 40));
  EXPECT_TRUE(scheduler.CheckInvariants().ok()) << scheduler.CheckInvariants();
  // Nothing more until the sampled token is back: the next token depends on it.
  EXPECT_FALSE(scheduler.NextMicroBatch().has_value());
  EXPECT_EQ(scheduler.OnMicroBatchDone(plans[0].id, {})->tokens.size(), 0u);
  EXPECT_EQ(scheduler.OnMicroBatchDone(plans[1].id, {})->tokens.size(), 0u);
  EXPECT_FALSE(scheduler.NextMicroBatch().has_value());
  ASSERT_TRUE(scheduler.OnMicroBatchDone(plans[2].id, std::vector<int32_t>{5}).ok());
  auto decode = scheduler.NextMicroBatch();
  ASSERT_TRUE(decode.has_value());
  EXPECT_EQ(decode->batch.chunks[0].start_position, 40);
  EXPECT_EQ(decode->batch.chunks[0].block_table.size(), 11u);
}

TEST(SchedulerTest, OnlyTheChunkThatEndsThePromptSamples) {
  Scheduler scheduler(Options(2, 64, 4, /*budget=*/16));
  ASSERT_TRUE(scheduler.AddRequest(1, Prompt(17), MaxTokens(2)).ok());
  auto first = scheduler.NextMicroBatch();
  auto second = scheduler.NextMicroBatch();
  ASSERT_TRUE(first.has_value() && second.has_value());
  EXPECT_EQ(first->batch.chunks[0].num_tokens, 16);
  EXPECT_EQ(first->batch.chunks[0].logits, LogitsMode::kNone);
  EXPECT_EQ(first->num_sampled(), 0);
  EXPECT_EQ(second->batch.chunks[0].start_position, 16);
  EXPECT_EQ(second->batch.chunks[0].num_tokens, 1);
  EXPECT_EQ(second->batch.chunks[0].logits, LogitsMode::kLastToken);
  EXPECT_EQ(second->entries[0].token_index, 0);
}

TEST(SchedulerTest, SpreadSplitsDecodesIntoBalancedMicroBatches) {
  for (DecodePacking packing : {DecodePacking::kSpread, DecodePacking::kPacked}) {
    SchedulerOptions options = Options(4);
    options.decode_packing = packing;
    Scheduler scheduler(options);
    for (uint64_t id = 1; id <= 10; ++id) {
      ASSERT_TRUE(scheduler.AddRequest(id, Prompt(3), MaxTokens(50)).ok());
    }
    auto prefill = scheduler.NextMicroBatch();  // all ten prompts fit one micro-batch
    ASSERT_TRUE(prefill.has_value());
    EXPECT_EQ(prefill->batch.chunks.size(), 10u);
    EXPECT_FALSE(scheduler.NextMicroBatch().has_value());
    ASSERT_TRUE(scheduler.OnMicroBatchDone(prefill->id, Tokens(*prefill, 9)).ok());
    std::vector<size_t> sizes;
    std::set<uint64_t> seen;
    while (auto plan = scheduler.NextMicroBatch()) {
      sizes.push_back(plan->batch.chunks.size());
      EXPECT_EQ(plan->num_decodes(), static_cast<int>(plan->batch.chunks.size()));
      for (const auto& chunk : plan->batch.chunks) EXPECT_TRUE(seen.insert(chunk.seq_id).second);
    }
    EXPECT_EQ(seen.size(), 10u);
    if (packing == DecodePacking::kSpread) {
      EXPECT_THAT(sizes, ElementsAre(3, 3, 2, 2));  // balanced, ceil(10 / 4) at most
    } else {
      EXPECT_THAT(sizes, ElementsAre(10));
    }
  }
}

TEST(SchedulerTest, DecodesComeFirstAndPrefillFillsTheRestOfTheBudget) {
  Scheduler scheduler(Options(1, 64, 4, /*budget=*/8));
  ASSERT_TRUE(scheduler.AddRequest(1, Prompt(2), MaxTokens(20)).ok());
  auto plan = scheduler.NextMicroBatch();
  ASSERT_TRUE(scheduler.OnMicroBatchDone(plan->id, Tokens(*plan, 3)).ok());
  ASSERT_TRUE(scheduler.AddRequest(2, Prompt(30), MaxTokens(20)).ok());
  for (int step = 0; step < 5; ++step) {
    plan = scheduler.NextMicroBatch();
    ASSERT_TRUE(plan.has_value());
    ASSERT_EQ(plan->batch.chunks.size(), 2u);
    EXPECT_EQ(plan->batch.chunks[0].seq_id, 1u);  // the decode, every step
    EXPECT_TRUE(plan->entries[0].is_decode);
    EXPECT_EQ(plan->batch.chunks[1].seq_id, 2u);
    // 30 = 4 * 7 + 2; only the last piece samples.
    EXPECT_EQ(plan->batch.chunks[1].num_tokens, step < 4 ? 7 : 2);
    EXPECT_EQ(plan->batch.chunks[1].logits, step < 4 ? LogitsMode::kNone : LogitsMode::kLastToken);
    ASSERT_TRUE(scheduler.OnMicroBatchDone(plan->id, Tokens(*plan, 3)).ok());
  }
}

TEST(SchedulerTest, CancelFreesBlocksAndDiscardsTheInFlightResult) {
  Scheduler scheduler(Options(2, 64, 4));
  ASSERT_TRUE(scheduler.AddRequest(1, Prompt(8), MaxTokens(5)).ok());
  ASSERT_TRUE(scheduler.AddRequest(2, Prompt(8), MaxTokens(5)).ok());
  ASSERT_TRUE(scheduler.AddRequest(3, Prompt(8), MaxTokens(5)).ok());
  auto plan = scheduler.NextMicroBatch();
  ASSERT_EQ(plan->batch.chunks.size(), 3u);
  EXPECT_EQ(scheduler.Stats().kv_blocks_used, 6);
  EXPECT_TRUE(scheduler.Cancel(2));
  EXPECT_EQ(scheduler.Stats().kv_blocks_used, 4);
  EXPECT_FALSE(scheduler.Cancel(2));
  EXPECT_FALSE(scheduler.Cancel(99));
  // The id may come back as a new request at once; the old plan's token is not its.
  ASSERT_TRUE(scheduler.AddRequest(2, Prompt(4, 50), MaxTokens(5)).ok());
  EXPECT_TRUE(scheduler.CheckInvariants().ok()) << scheduler.CheckInvariants();
  auto result = scheduler.OnMicroBatchDone(plan->id, std::vector<int32_t>{10, 20, 30});
  ASSERT_TRUE(result.ok());
  ASSERT_EQ(result->tokens.size(), 2u);
  EXPECT_EQ(result->tokens[0].seq_id, 1u);
  EXPECT_EQ(result->tokens[1].seq_id, 3u);
  EXPECT_TRUE(scheduler.GeneratedTokens(2).empty());
  EXPECT_THAT(scheduler.GeneratedTokens(3), ElementsAre(30));
  EXPECT_TRUE(scheduler.CheckInvariants().ok()) << scheduler.CheckInvariants();
  EXPECT_TRUE(scheduler.Cancel(1));
  EXPECT_TRUE(scheduler.Finish(3));
  EXPECT_TRUE(scheduler.Cancel(2));  // waiting
  EXPECT_EQ(scheduler.Stats().kv_blocks_used, 0);
  EXPECT_FALSE(scheduler.HasWork());
}

TEST(SchedulerTest, BadResultsAreRefusedWithoutChangingState) {
  Scheduler scheduler(Options(1));
  ASSERT_TRUE(scheduler.AddRequest(1, Prompt(4), MaxTokens(2)).ok());
  auto plan = scheduler.NextMicroBatch();
  EXPECT_EQ(scheduler.OnMicroBatchDone(plan->id + 1, std::vector<int32_t>{1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(scheduler.OnMicroBatchDone(plan->id, std::vector<int32_t>{1, 2}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(scheduler.OnMicroBatchDone(plan->id, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(scheduler.num_in_flight(), 1);
  EXPECT_TRUE(scheduler.OnMicroBatchDone(plan->id, std::vector<int32_t>{1}).ok());
  EXPECT_EQ(scheduler.OnMicroBatchDone(plan->id, std::vector<int32_t>{1}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SchedulerTest, StopConditions) {
  SchedulerOptions options = Options(1, 4, 4);  // 16 KV positions
  options.eos_token_ids = {2};
  Scheduler scheduler(options);
  SequenceParams stop_ids = MaxTokens(100);
  stop_ids.stop_token_ids = {77};
  SequenceParams ignore = MaxTokens(3);
  ignore.ignore_eos = true;
  ASSERT_TRUE(scheduler.AddRequest(1, Prompt(2), MaxTokens(100)).ok());
  ASSERT_TRUE(scheduler.AddRequest(2, Prompt(2), stop_ids).ok());
  ASSERT_TRUE(scheduler.AddRequest(3, Prompt(2), ignore).ok());
  auto plan = scheduler.NextMicroBatch();
  auto result = scheduler.OnMicroBatchDone(plan->id, std::vector<int32_t>{2, 2, 2});
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->tokens[0].finish_reason, FinishReason::kStop);  // EOS
  EXPECT_EQ(result->tokens[1].finish_reason, FinishReason::kStop);  // EOS, not ignored
  EXPECT_EQ(result->tokens[2].finish_reason, FinishReason::kNone);  // ignore_eos
  ASSERT_TRUE(scheduler.AddRequest(4, Prompt(2), stop_ids).ok());
  std::map<uint64_t, FinishReason> finish;
  std::map<uint64_t, int> count;
  while (scheduler.HasWork()) {
    plan = scheduler.NextMicroBatch();
    ASSERT_TRUE(plan.has_value());
    std::vector<int32_t> tokens;
    for (const auto& entry : plan->entries) {
      if (entry.samples) tokens.push_back(entry.seq_id == 4 && entry.token_index == 1 ? 77 : 5);
    }
    result = scheduler.OnMicroBatchDone(plan->id, tokens);
    ASSERT_TRUE(result.ok());
    for (const auto& update : result->tokens) {
      ++count[update.seq_id];
      if (update.finish_reason != FinishReason::kNone) finish[update.seq_id] = update.finish_reason;
    }
  }
  EXPECT_EQ(finish[3], FinishReason::kLength);
  EXPECT_EQ(count[3], 2);  // plus the EOS above: 3 = max_tokens
  EXPECT_EQ(finish[4], FinishReason::kStop);
  EXPECT_EQ(count[4], 2);

  // max_tokens is clamped to the KV cache: 16 positions, prompt 10 -> 7 tokens.
  ASSERT_TRUE(scheduler.AddRequest(5, Prompt(10), MaxTokens(100)).ok());
  int generated = 0;
  FinishReason last = FinishReason::kNone;
  while (scheduler.HasWork()) {
    plan = scheduler.NextMicroBatch();
    ASSERT_TRUE(plan.has_value());
    result = scheduler.OnMicroBatchDone(plan->id, Tokens(*plan, 5));
    for (const auto& update : result->tokens) {
      ++generated;
      last = update.finish_reason;
    }
  }
  EXPECT_EQ(generated, 7);
  EXPECT_EQ(last, FinishReason::kLength);
}

TEST(SchedulerTest, PreemptionKeepsGeneratedTokensAndReprefillsThem) {
  // 4 blocks of 4 = 16 positions; two requests of 6 + 8 tokens need 13 positions each.
  Scheduler scheduler(Options(1, 4, 4));
  ASSERT_TRUE(scheduler.AddRequest(1, Prompt(6, 100), MaxTokens(8)).ok());
  ASSERT_TRUE(scheduler.AddRequest(2, Prompt(6, 200), MaxTokens(8)).ok());
  std::map<uint64_t, std::vector<int32_t>> out;
  bool saw_reprefill = false;
  int steps = 0;
  while (scheduler.HasWork() && ++steps < 200) {
    auto plan = scheduler.NextMicroBatch();
    ASSERT_TRUE(plan.has_value()) << "stuck at step " << steps;
    size_t offset = 0;
    std::vector<int32_t> tokens;
    for (size_t c = 0; c < plan->batch.chunks.size(); ++c) {
      const auto& chunk = plan->batch.chunks[c];
      const auto& entry = plan->entries[c];
      // Re-prefill after preemption (maybe in pieces): the prompt and the generated tokens.
      std::vector<int32_t> history = Prompt(6, chunk.seq_id == 1 ? 100 : 200);
      history.insert(history.end(), out[chunk.seq_id].begin(), out[chunk.seq_id].end());
      if (!out[chunk.seq_id].empty() && chunk.num_tokens > 1) saw_reprefill = true;
      std::vector<int32_t> fed(plan->batch.token_ids.begin() + offset,
                               plan->batch.token_ids.begin() + offset + chunk.num_tokens);
      ASSERT_LE(chunk.start_position + chunk.num_tokens, static_cast<int>(history.size()));
      EXPECT_EQ(fed,
                std::vector<int32_t>(history.begin() + chunk.start_position,
                                     history.begin() + chunk.start_position + chunk.num_tokens));
      if (entry.samples) {
        EXPECT_EQ(entry.token_index, static_cast<int>(out[chunk.seq_id].size()));
        tokens.push_back(static_cast<int32_t>(entry.seq_id * 1000 + entry.token_index));
      }
      offset += chunk.num_tokens;
    }
    auto result = scheduler.OnMicroBatchDone(plan->id, tokens);
    ASSERT_TRUE(result.ok());
    for (const auto& update : result->tokens) out[update.seq_id].push_back(update.token);
    ASSERT_TRUE(scheduler.CheckInvariants().ok()) << scheduler.CheckInvariants();
  }
  EXPECT_TRUE(saw_reprefill);
  EXPECT_GT(scheduler.Stats().preemptions, 0);
  EXPECT_THAT(out[1], ElementsAre(1000, 1001, 1002, 1003, 1004, 1005, 1006, 1007));
  EXPECT_THAT(out[2], ElementsAre(2000, 2001, 2002, 2003, 2004, 2005, 2006, 2007));
  EXPECT_EQ(scheduler.Stats().kv_blocks_used, 0);
}

TEST(SchedulerTest, FailedMicroBatchRemovesItsSequences) {
  Scheduler scheduler(Options(2));
  ASSERT_TRUE(scheduler.AddRequest(1, Prompt(4), MaxTokens(4)).ok());
  ASSERT_TRUE(scheduler.AddRequest(2, Prompt(4), MaxTokens(4)).ok());
  auto plan = scheduler.NextMicroBatch();
  EXPECT_THAT(scheduler.OnMicroBatchFailed(plan->id), ElementsAre(1, 2));
  EXPECT_TRUE(scheduler.OnMicroBatchFailed(plan->id).empty());
  EXPECT_FALSE(scheduler.HasWork());
  EXPECT_EQ(scheduler.Stats().kv_blocks_used, 0);
}

TEST(SchedulerTest, AdmissionIsFifoAndBoundedByRunningLimit) {
  SchedulerOptions options = Options(1);
  options.max_running_sequences = 2;
  Scheduler scheduler(options);
  for (uint64_t id = 1; id <= 3; ++id) {
    ASSERT_TRUE(scheduler.AddRequest(id, Prompt(2), MaxTokens(1)).ok());
  }
  auto plan = scheduler.NextMicroBatch();
  ASSERT_EQ(plan->batch.chunks.size(), 2u);
  EXPECT_EQ(plan->batch.chunks[0].seq_id, 1u);
  EXPECT_EQ(plan->batch.chunks[1].seq_id, 2u);
  EXPECT_EQ(scheduler.Stats().waiting, 1);
  ASSERT_TRUE(scheduler.OnMicroBatchDone(plan->id, Tokens(*plan, 1)).ok());
  plan = scheduler.NextMicroBatch();
  ASSERT_EQ(plan->batch.chunks.size(), 1u);
  EXPECT_EQ(plan->batch.chunks[0].seq_id, 3u);
}

// Runs every plan to completion, sampling token 7 for each sampling chunk; returns the plans.
std::vector<MicroBatchPlan> RunToEnd(Scheduler& scheduler) {
  std::vector<MicroBatchPlan> plans;
  while (scheduler.HasWork()) {
    std::optional<MicroBatchPlan> plan = scheduler.NextMicroBatch();
    if (!plan) break;
    EXPECT_TRUE(scheduler.OnMicroBatchDone(plan->id, Tokens(*plan, 7)).ok());
    EXPECT_TRUE(scheduler.CheckInvariants().ok()) << scheduler.CheckInvariants();
    plans.push_back(std::move(*plan));
  }
  return plans;
}

TEST(PrefixCacheTest, ChainHashDependsOnParentAndEveryToken) {
  std::vector<int32_t> a = {1, 2, 3, 4}, b = {1, 2, 3, 5};
  EXPECT_EQ(PrefixHash(kPrefixRoot, a), PrefixHash(kPrefixRoot, a));
  EXPECT_NE(PrefixHash(kPrefixRoot, a), PrefixHash(kPrefixRoot, b));
  EXPECT_NE(PrefixHash(kPrefixRoot, a), PrefixHash(PrefixHash(kPrefixRoot, b), a));
}

TEST(PrefixCacheTest, KvBlockManagerKeepsReleasedRegisteredBlocksUntilEvicted) {
  KvBlockManager blocks(3, 2);
  std::vector<int32_t> tokens = {5, 6};
  std::vector<int32_t> got = *blocks.Allocate(1);
  EXPECT_TRUE(blocks.Register(got[0], kPrefixRoot, tokens));
  EXPECT_FALSE(blocks.Register(got[0], kPrefixRoot, tokens));  // already registered
  blocks.Free(got);
  EXPECT_EQ(blocks.num_cached_idle(), 1);
  EXPECT_EQ(blocks.num_free(), 3);  // evictable counts as available
  std::optional<int32_t> hit = blocks.Lookup(kPrefixRoot, tokens);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(*hit, got[0]);
  EXPECT_EQ(blocks.holders(*hit), 1);
  EXPECT_FALSE(blocks.Lookup(kPrefixRoot, std::vector<int32_t>{5, 7}).has_value());
  EXPECT_FALSE(blocks.Lookup(42, tokens).has_value());  // another parent
  blocks.Free(std::vector<int32_t>{*hit});
  // Allocating everything evicts the cached block, and its entry goes with it.
  EXPECT_EQ(blocks.Allocate(3)->size(), 3u);
  EXPECT_EQ(blocks.num_cached_idle(), 0);
  EXPECT_FALSE(blocks.Lookup(kPrefixRoot, tokens).has_value());
}

TEST(PrefixCacheTest, SharedPrefixIsComputedOnceAndItsBlocksShared) {
  SchedulerOptions options = Options(1, 64, 4, 512);
  options.prefix_caching = true;
  Scheduler scheduler(options);
  std::vector<int32_t> system = Prompt(10, 100);  // two full blocks and two tokens
  std::vector<int32_t> first = system, second = system;
  first.insert(first.end(), {1, 2, 3});
  second.insert(second.end(), {9, 8});
  ASSERT_TRUE(scheduler.AddRequest(1, first, MaxTokens(3)).ok());
  std::vector<MicroBatchPlan> plans = RunToEnd(scheduler);
  ASSERT_FALSE(plans.empty());
  const std::vector<int32_t> first_blocks = plans.front().batch.chunks[0].block_table;

  ASSERT_TRUE(scheduler.AddRequest(2, second, MaxTokens(3)).ok());
  std::optional<MicroBatchPlan> plan = scheduler.NextMicroBatch();
  ASSERT_TRUE(plan.has_value());
  const SequenceChunk& chunk = plan->batch.chunks[0];
  EXPECT_EQ(chunk.start_position, 8);  // two cached blocks skipped
  EXPECT_EQ(chunk.num_tokens, 4);      // 2 system tokens + 2 of its own
  EXPECT_EQ(chunk.block_table[0], first_blocks[0]);
  EXPECT_EQ(chunk.block_table[1], first_blocks[1]);
  EXPECT_TRUE(scheduler.CheckInvariants().ok()) << scheduler.CheckInvariants();
  SchedulerStats stats = scheduler.Stats();
  EXPECT_EQ(stats.prefix_hit_tokens, 8);
  EXPECT_EQ(stats.prefix_lookup_tokens, static_cast<int64_t>(first.size() + second.size()));
}

TEST(PrefixCacheTest, APromptThatIsAllCachedStillComputesItsLastToken) {
  SchedulerOptions options = Options(1, 64, 4, 512);
  options.prefix_caching = true;
  Scheduler scheduler(options);
  ASSERT_TRUE(scheduler.AddRequest(1, Prompt(8, 50), MaxTokens(2)).ok());
  RunToEnd(scheduler);
  ASSERT_TRUE(scheduler.AddRequest(2, Prompt(8, 50), MaxTokens(2)).ok());
  std::optional<MicroBatchPlan> plan = scheduler.NextMicroBatch();
  ASSERT_TRUE(plan.has_value());
  EXPECT_EQ(plan->batch.chunks[0].start_position, 4);  // block 2 is recomputed: it ends the prompt
  EXPECT_EQ(plan->batch.chunks[0].num_tokens, 4);
  EXPECT_EQ(plan->batch.chunks[0].logits, LogitsMode::kLastToken);
}

TEST(PrefixCacheTest, CachedBlocksAreEvictedWhenTheCacheIsFullAndInvariantsHold) {
  SchedulerOptions options = Options(2, 12, 4, 16);
  options.prefix_caching = true;
  Scheduler scheduler(options);
  // Many distinct prompts, some sharing a prefix, more than the cache holds at once.
  for (int i = 0; i < 24; ++i) {
    std::vector<int32_t> prompt = Prompt(9, 1 + (i % 3) * 40);
    prompt.push_back(1000 + i);
    ASSERT_TRUE(scheduler.AddRequest(i + 1, prompt, MaxTokens(5)).ok());
  }
  RunToEnd(scheduler);
  EXPECT_FALSE(scheduler.HasWork());
  SchedulerStats stats = scheduler.Stats();
  EXPECT_EQ(stats.kv_blocks_used, 0);
  EXPECT_GT(stats.prefix_hit_tokens, 0);
  EXPECT_LE(stats.kv_blocks_cached, 12);
}

}  // namespace
}  // namespace ringserve

namespace ringserve {
namespace {

TEST(SchedulerTest, PromptLogprobChunksScoreEveryPromptPositionOnce) {
  Scheduler scheduler(Options(1, 64, 4, /*budget=*/4));
  SequenceParams params = MaxTokens(2);
  params.prompt_logprobs = true;
  ASSERT_TRUE(scheduler.AddRequest(7, Prompt(10, 100), params).ok());
  ASSERT_TRUE(scheduler.AddRequest(8, Prompt(3, 200), MaxTokens(1)).ok());

  // Chunked prefill of 7 (4 + 4 + 2 tokens): every row is scored against the next prompt
  // token; the last chunk's last row samples instead.
  std::vector<std::vector<int32_t>> scored;
  for (int step = 0; step < 3; ++step) {
    std::optional<MicroBatchPlan> plan = scheduler.NextMicroBatch();
    ASSERT_TRUE(plan.has_value());
    ASSERT_FALSE(plan->batch.chunks.empty());
    const SequenceChunk& chunk = plan->batch.chunks[0];
    const PlannedChunk& entry = plan->entries[0];
    ASSERT_EQ(chunk.seq_id, 7u);
    EXPECT_EQ(chunk.logits, LogitsMode::kAllTokens);
    EXPECT_EQ(entry.samples, step == 2);
    EXPECT_EQ(static_cast<int>(entry.score_token_ids.size()),
              chunk.num_tokens - (entry.samples ? 1 : 0));
    scored.push_back(entry.score_token_ids);
    ASSERT_TRUE(scheduler.OnMicroBatchDone(plan->id, Tokens(*plan, 5)).ok());
  }
  EXPECT_THAT(scored, ElementsAre(ElementsAre(101, 102, 103, 104), ElementsAre(105, 106, 107, 108),
                                  ElementsAre(109)));

  // The decode of 7 and the prompt of 8 (which did not ask) carry no scores.
  bool saw_decode = false, saw_other = false;
  while (std::optional<MicroBatchPlan> plan = scheduler.NextMicroBatch()) {
    for (size_t c = 0; c < plan->batch.chunks.size(); ++c) {
      EXPECT_NE(plan->batch.chunks[c].logits, LogitsMode::kAllTokens);
      EXPECT_TRUE(plan->entries[c].score_token_ids.empty());
      saw_decode |= plan->batch.chunks[c].seq_id == 7;
      saw_other |= plan->batch.chunks[c].seq_id == 8;
    }
    ASSERT_TRUE(scheduler.OnMicroBatchDone(plan->id, Tokens(*plan, 5)).ok());
  }
  EXPECT_TRUE(saw_decode);
  EXPECT_TRUE(saw_other);
}

TEST(SchedulerTest, PromptLogprobsComputeACachedPrefixAgain) {
  SchedulerOptions options = Options(1, 64, 4, 64);
  options.prefix_caching = true;
  Scheduler scheduler(options);
  ASSERT_TRUE(scheduler.AddRequest(1, Prompt(13, 50), MaxTokens(1)).ok());
  RunToEnd(scheduler);
  // The same prompt again: without prompt log-probabilities its first 12 positions come from
  // the cache; with them, every position is computed and scored.
  ASSERT_TRUE(scheduler.AddRequest(2, Prompt(13, 50), MaxTokens(1)).ok());
  SequenceParams params = MaxTokens(1);
  params.prompt_logprobs = true;
  ASSERT_TRUE(scheduler.AddRequest(3, Prompt(13, 50), params).ok());
  std::map<uint64_t, const SequenceChunk*> first_chunk;
  std::map<uint64_t, std::vector<int32_t>> scored;
  std::vector<MicroBatchPlan> plans = RunToEnd(scheduler);
  for (const MicroBatchPlan& plan : plans) {
    for (size_t c = 0; c < plan.batch.chunks.size(); ++c) {
      const SequenceChunk& chunk = plan.batch.chunks[c];
      first_chunk.emplace(chunk.seq_id, &chunk);
      const auto& ids = plan.entries[c].score_token_ids;
      scored[chunk.seq_id].insert(scored[chunk.seq_id].end(), ids.begin(), ids.end());
    }
  }
  ASSERT_EQ(first_chunk.count(2), 1u);
  ASSERT_EQ(first_chunk.count(3), 1u);
  EXPECT_EQ(first_chunk[2]->start_position, 12);
  EXPECT_EQ(first_chunk[3]->start_position, 0);
  std::vector<int32_t> expected = Prompt(12, 51);
  EXPECT_EQ(scored[3], expected);
  EXPECT_TRUE(scored[2].empty());
}

}  // namespace
}  // namespace ringserve
