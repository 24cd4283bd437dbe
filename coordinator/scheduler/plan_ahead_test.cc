// The scheduler with plan_ahead: follow-ups planned while their base runs, placeholders for
// the tokens not known yet, finished sequences' extra tokens discarded, and the same tokens as
// without plan-ahead over a ring driven here (tokens a function of sequence and token index).
#include <deque>
#include <map>
#include <numeric>
#include <random>

#include "coordinator/scheduler/scheduler.h"
#include "gtest/gtest.h"

namespace ringserve {
namespace {

SchedulerOptions Options(int micro_batches, bool plan_ahead, int blocks = 256) {
  SchedulerOptions options;
  options.num_stages = micro_batches;
  options.kv_num_blocks = blocks;
  options.kv_block_size = 4;
  options.max_tokens_per_micro_batch = 64;
  options.eos_token_ids = {2};
  options.plan_ahead = plan_ahead;
  return options;
}

std::vector<int32_t> Prompt(int length, int32_t first) {
  std::vector<int32_t> prompt(length);
  std::iota(prompt.begin(), prompt.end(), first);
  return prompt;
}

SequenceParams MaxTokens(int max_tokens) {
  SequenceParams params;
  params.max_tokens = max_tokens;
  return params;
}

TEST(PlanAheadTest, PlansTheNextDecodeWhileTheCurrentStepRuns) {
  Scheduler scheduler(Options(1, true));
  ASSERT_TRUE(scheduler.AddRequest(7, Prompt(5, 10), MaxTokens(4)).ok());
  std::optional<MicroBatchPlan> prefill = scheduler.NextMicroBatch();
  ASSERT_TRUE(prefill.has_value());
  EXPECT_EQ(prefill->tokens_from, 0u);
  std::optional<MicroBatchPlan> ahead = scheduler.NextMicroBatch();
  ASSERT_TRUE(ahead.has_value());
  ASSERT_EQ(ahead->batch.chunks.size(), 1u);
  EXPECT_TRUE(ahead->entries[0].ahead);
  EXPECT_EQ(ahead->entries[0].token_index, 1);
  EXPECT_EQ(ahead->batch.chunks[0].start_position, 5);
  EXPECT_EQ(ahead->batch.token_ids, std::vector<int32_t>{0});  // the placeholder
  EXPECT_EQ(ahead->tokens_from, prefill->id);
  EXPECT_EQ(ahead->back_edge_through, prefill->id);
  EXPECT_FALSE(scheduler.NextMicroBatch().has_value());  // one chain of two
  ASSERT_TRUE(scheduler.CheckInvariants().ok()) << scheduler.CheckInvariants();

  absl::StatusOr<MicroBatchResult> first = scheduler.OnMicroBatchDone(prefill->id, {{40}});
  ASSERT_TRUE(first.ok());
  ASSERT_EQ(first->tokens.size(), 1u);
  EXPECT_EQ(first->tokens[0].token_index, 0);
  std::optional<MicroBatchPlan> next = scheduler.NextMicroBatch();
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->tokens_from, ahead->id);
  EXPECT_EQ(next->entries[0].token_index, 2);
  EXPECT_EQ(next->batch.chunks[0].start_position, 6);
  ASSERT_TRUE(scheduler.CheckInvariants().ok()) << scheduler.CheckInvariants();
  ASSERT_TRUE(scheduler.OnMicroBatchDone(ahead->id, {{41}}).ok());
  std::optional<MicroBatchPlan> last = scheduler.NextMicroBatch();
  ASSERT_TRUE(last.has_value());
  EXPECT_TRUE(last->entries[0].ahead);
  EXPECT_EQ(last->entries[0].token_index, 3);
  ASSERT_TRUE(scheduler.OnMicroBatchDone(next->id, {{42}}).ok());
  // Token 3 is the last by max_tokens: nothing is planned ahead of it.
  EXPECT_FALSE(scheduler.NextMicroBatch().has_value());
  absl::StatusOr<MicroBatchResult> done = scheduler.OnMicroBatchDone(last->id, {{43}});
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->tokens[0].finish_reason, FinishReason::kLength);
  EXPECT_EQ(scheduler.Stats().ahead_decodes, 3);
  EXPECT_EQ(scheduler.Stats().ahead_discarded, 0);
  EXPECT_FALSE(scheduler.HasWork());
}

TEST(PlanAheadTest, AStoppedSequencesExtraTokenIsDiscardedAndItsBlocksFreed) {
  Scheduler scheduler(Options(1, true));
  ASSERT_TRUE(scheduler.AddRequest(1, Prompt(4, 10), MaxTokens(50)).ok());
  ASSERT_TRUE(scheduler.AddRequest(2, Prompt(6, 30), MaxTokens(50)).ok());
  std::optional<MicroBatchPlan> prefill = scheduler.NextMicroBatch();
  std::optional<MicroBatchPlan> ahead = scheduler.NextMicroBatch();
  ASSERT_TRUE(prefill && ahead);
  ASSERT_EQ(ahead->batch.chunks.size(), 2u);
  // Sequence 1 samples EOS: finished; sequence 2 goes on.
  absl::StatusOr<MicroBatchResult> first = scheduler.OnMicroBatchDone(prefill->id, {{2, 50}});
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->tokens[0].finish_reason, FinishReason::kStop);
  std::optional<MicroBatchPlan> next = scheduler.NextMicroBatch();
  ASSERT_TRUE(next.has_value());
  ASSERT_EQ(next->batch.chunks.size(), 1u);  // sequence 1 dropped from the next plan
  EXPECT_EQ(next->batch.chunks[0].seq_id, 2u);
  absl::StatusOr<MicroBatchResult> second = scheduler.OnMicroBatchDone(ahead->id, {{60, 51}});
  ASSERT_TRUE(second.ok());
  ASSERT_EQ(second->tokens.size(), 1u);  // sequence 1's extra token is not reported
  EXPECT_EQ(second->tokens[0].seq_id, 2u);
  EXPECT_EQ(scheduler.Stats().ahead_discarded, 1);
  ASSERT_TRUE(scheduler.CheckInvariants().ok()) << scheduler.CheckInvariants();
  scheduler.Cancel(2);
  ASSERT_TRUE(scheduler.OnMicroBatchDone(next->id, {{61}}).ok());
  EXPECT_EQ(scheduler.Stats().kv_blocks_used, 0);
  EXPECT_FALSE(scheduler.HasWork());
}

TEST(PlanAheadTest, RefusesAFollowUpsTokensBeforeItsBases) {
  Scheduler scheduler(Options(1, true));
  ASSERT_TRUE(scheduler.AddRequest(1, Prompt(4, 10), MaxTokens(50)).ok());
  std::optional<MicroBatchPlan> prefill = scheduler.NextMicroBatch();
  std::optional<MicroBatchPlan> ahead = scheduler.NextMicroBatch();
  ASSERT_TRUE(prefill && ahead);
  EXPECT_FALSE(scheduler.OnMicroBatchDone(ahead->id, {{5}}).ok());
  EXPECT_TRUE(scheduler.OnMicroBatchDone(prefill->id, {{5}}).ok());
}

// A ring driven here: plans run in order, each takes `depth` plans to come back; stage 0 fills
// a placeholder with the token its base sampled for the sequence; the "model" samples a
// function of (sequence, token index), EOS now and then.
struct Outcome {
  std::map<uint64_t, std::vector<int32_t>> tokens;
  int64_t ahead_decodes = 0;
  int64_t preemptions = 0;
};

Outcome Drive(bool plan_ahead, int micro_batches, int blocks, uint32_t seed) {
  Scheduler scheduler(Options(micro_batches, plan_ahead, blocks));
  std::mt19937 rng(seed);
  std::map<uint64_t, std::vector<int32_t>> history;  // prompt + tokens, as the ring knows them
  Outcome outcome;
  for (uint64_t id = 1; id <= 24; ++id) {
    std::vector<int32_t> prompt = Prompt(3 + static_cast<int>(rng() % 20), 100 * id);
    history[id] = prompt;
    EXPECT_TRUE(scheduler.AddRequest(id, prompt, MaxTokens(1 + rng() % 30)).ok());
  }
  auto sample = [](uint64_t seq, int32_t index) {
    return (seq * 31 + index * 17) % 23 == 0 ? 2 : static_cast<int32_t>(1000 + seq * 100 + index);
  };
  std::deque<MicroBatchPlan> in_flight;
  std::map<uint64_t, std::map<uint64_t, int32_t>> sampled;  // plan -> seq -> token
  uint64_t last_base = 0;
  for (int step = 0; step < 10000 && scheduler.HasWork(); ++step) {
    while (std::optional<MicroBatchPlan> plan = scheduler.NextMicroBatch()) {
      // Follow-ups go out in the order their bases finish: stage 0 runs plans in order.
      if (plan->tokens_from != 0) {
        EXPECT_GT(plan->tokens_from, last_base) << "plan " << plan->id;
        last_base = plan->tokens_from;
      }
      in_flight.push_back(std::move(*plan));
    }
    EXPECT_TRUE(scheduler.CheckInvariants().ok()) << scheduler.CheckInvariants();
    if (in_flight.empty()) break;
    MicroBatchPlan plan = std::move(in_flight.front());
    in_flight.pop_front();
    std::vector<int32_t> tokens;
    int64_t offset = 0;
    for (size_t c = 0; c < plan.batch.chunks.size(); ++c) {
      const SequenceChunk& chunk = plan.batch.chunks[c];
      const PlannedChunk& entry = plan.entries[c];
      std::vector<int32_t>& known = history[chunk.seq_id];
      for (int32_t i = 0; i < chunk.num_tokens; ++i) {
        int32_t id = plan.batch.token_ids[offset + i];
        if (entry.ahead) id = sampled[plan.tokens_from].at(chunk.seq_id);  // the back edge
        const size_t position = static_cast<size_t>(chunk.start_position + i);
        if (position < known.size()) {
          EXPECT_EQ(id, known[position]) << "seq " << chunk.seq_id << " position " << position;
        } else {
          EXPECT_EQ(position, known.size());
          known.push_back(id);
        }
      }
      offset += chunk.num_tokens;
      if (entry.samples) {
        tokens.push_back(sample(chunk.seq_id, entry.token_index));
        sampled[plan.id][chunk.seq_id] = tokens.back();
      }
    }
    absl::StatusOr<MicroBatchResult> done = scheduler.OnMicroBatchDone(plan.id, tokens);
    EXPECT_TRUE(done.ok()) << done.status();
    if (!done.ok()) break;
    for (const TokenUpdate& update : done->tokens) {
      EXPECT_EQ(update.token, sample(update.seq_id, update.token_index));
      outcome.tokens[update.seq_id].push_back(update.token);
    }
  }
  EXPECT_FALSE(scheduler.HasWork());
  EXPECT_EQ(scheduler.Stats().kv_blocks_used, 0);
  outcome.ahead_decodes = scheduler.Stats().ahead_decodes;
  outcome.preemptions = scheduler.Stats().preemptions;
  return outcome;
}

TEST(PlanAheadTest, SameTokensAsSynchronousPlansOverChainsAndUnderPreemption) {
  for (int micro_batches : {1, 2, 4}) {
    for (int blocks : {256, 24}) {
      SCOPED_TRACE(testing::Message()
                   << micro_batches << " micro-batches, " << blocks << " blocks");
      Outcome sync = Drive(false, micro_batches, blocks, 5);
      Outcome ahead = Drive(true, micro_batches, blocks, 5);
      EXPECT_EQ(sync.tokens, ahead.tokens);
      EXPECT_EQ(sync.tokens.size(), 24u);
      EXPECT_EQ(sync.ahead_decodes, 0);
      EXPECT_GT(ahead.ahead_decodes, 0);
      if (blocks == 24) {
        EXPECT_GT(ahead.preemptions + sync.preemptions, 0);
      }
    }
  }
}

}  // namespace
}  // namespace ringserve
