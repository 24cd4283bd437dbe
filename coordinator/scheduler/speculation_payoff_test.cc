// Speculation backs off when it does not pay, judged by measured throughput: the payoff's own
// decisions, and the scheduler driven by a fake clock whose cost model makes verification pay
// for one sequence and not for eight (whatever the acceptance rate says).
#include "coordinator/scheduler/speculation_payoff.h"

#include <numeric>
#include <vector>

#include "coordinator/scheduler/scheduler.h"
#include "gtest/gtest.h"

namespace ringserve {
namespace {

using Mode = SpeculationPayoff::Mode;

TEST(SpeculationPayoffTest, MeasuresBothModesThenRunsTheFasterAndProbesAgain) {
  SpeculationPayoffOptions options{.samples = 4, .reprobe_after = 20};
  SpeculationPayoff payoff;
  EXPECT_EQ(payoff.ModeFor(options, 8), Mode::kSpeculate);  // first measure speculation
  for (int i = 0; i < 4; ++i) payoff.OnMeasured(options, 8, Mode::kSpeculate, true, 1.0, 10);
  EXPECT_EQ(payoff.ModeFor(options, 8), Mode::kPlain);          // then plain decoding
  payoff.OnMeasured(options, 8, Mode::kPlain, false, 0.01, 8);  // a switch: not counted
  for (int i = 0; i < 4; ++i) payoff.OnMeasured(options, 8, Mode::kPlain, true, 0.5, 8);
  EXPECT_EQ(payoff.ModeFor(options, 8), Mode::kPlain);      // 16 tokens/s against 10
  EXPECT_EQ(payoff.ModeFor(options, 9), Mode::kPlain);      // the same bucket (8-15)
  EXPECT_EQ(payoff.ModeFor(options, 1), Mode::kSpeculate);  // another bucket: not measured
  EXPECT_DOUBLE_EQ(payoff.Rate(SpeculationPayoff::Bucket(8), Mode::kSpeculate), 10.0);
  // After reprobe_after micro-batches the slower mode is measured again, and wins now.
  for (int i = 0; i < 18; ++i) payoff.OnMeasured(options, 8, Mode::kPlain, true, 0.5, 8);
  EXPECT_EQ(payoff.ModeFor(options, 8), Mode::kPlain);
  payoff.OnMeasured(options, 8, Mode::kPlain, true, 0.5, 8);
  EXPECT_EQ(payoff.ModeFor(options, 8), Mode::kSpeculate);
  for (int i = 0; i < 10; ++i) payoff.OnMeasured(options, 8, Mode::kSpeculate, true, 0.1, 10);
  EXPECT_EQ(payoff.ModeFor(options, 8), Mode::kSpeculate);
  EXPECT_FALSE(SpeculationPayoffOptions{.enabled = false}.enabled);
  EXPECT_EQ(payoff.ModeFor({.enabled = false}, 8), Mode::kSpeculate);
}

// Where speculation keeps losing, each probe that confirms plain decoding doubles the interval
// to the next (up to max_reprobe_after); a probe that finds speculation faster resets it.
TEST(SpeculationPayoffTest, ConfirmingProbesGrowTheirIntervalOverturningOnesResetIt) {
  const SpeculationPayoffOptions options{
      .samples = 2, .reprobe_after = 10, .max_reprobe_after = 40, .decay = 0.5};
  SpeculationPayoff payoff;
  double speculate_rate = 5, plain_rate = 10;  // tokens per second of each mode
  Mode last = Mode::kSpeculate;
  // Runs `n` micro-batches as the payoff says (each 1 s); returns the lengths of the runs of
  // `counted` that ended within them.
  auto run = [&](int n, Mode counted) {
    std::vector<int> runs;
    int length = 0;
    for (int i = 0; i < n; ++i) {
      const Mode mode = payoff.ModeFor(options, 8);
      if (mode != counted && length > 0) {
        runs.push_back(length);
        length = 0;
      }
      if (mode == counted) ++length;
      const double rate = mode == Mode::kSpeculate ? speculate_rate : plain_rate;
      payoff.OnMeasured(options, 8, mode, /*warm=*/mode == last, 1.0, static_cast<int>(rate));
      last = mode;
    }
    return runs;
  };
  // Plain decoding: 2 samples and the first interval of 10 (12), then after each confirming
  // probe (2 speculating samples, the switch's micro-batch unmeasured) 20, 40 and the cap, 40.
  EXPECT_EQ(run(160, Mode::kPlain), (std::vector<int>{12, 20, 40, 40}));
  // Speculation pays now: the next probe overturns the decision and the interval restarts at
  // reprobe_after: speculating runs of 12 (the probe and 10), then 20 after a confirming probe.
  speculate_rate = 20;
  EXPECT_EQ(run(60, Mode::kSpeculate), (std::vector<int>{12, 20}));
  EXPECT_EQ(payoff.ModeFor(options, 8), Mode::kSpeculate);
}

TEST(SpeculationPayoffTest, BucketsAreLogarithmic) {
  EXPECT_EQ(SpeculationPayoff::Bucket(0), 0);
  EXPECT_EQ(SpeculationPayoff::Bucket(1), 0);
  EXPECT_EQ(SpeculationPayoff::Bucket(2), 1);
  EXPECT_EQ(SpeculationPayoff::Bucket(3), 1);
  EXPECT_EQ(SpeculationPayoff::Bucket(4), 2);
  EXPECT_EQ(SpeculationPayoff::Bucket(8), 3);
  EXPECT_EQ(SpeculationPayoff::Bucket(15), 3);
}

struct DriveResult {
  int late_plans = 0;              // decode plans in the second half
  int late_speculating_plans = 0;  // of those, with a chunk that drafts or verifies
  int late_plain_chunks_told = 0;  // chunks of plain late plans that still carry speculation
  int ahead_decodes = 0;
  double tokens_per_time = 0;
};

// `streams` closed-loop clients of 64 tokens each on a 1-stage ring, greedy; the last stage
// accepts each draft with probability `accept_tenths` / 10 (default 0.6; a fixed pseudo-random
// draw per sequence and token), up to the first rejection; a plan takes max(1, tokens / 4) time
// units (a target step that is memory-bound up to 4 tokens and compute-bound above: with one
// sequence verification pays, with eight it costs more than it saves, at any k). After each
// result the coordinator spends `host_gap` before it plans again (its processing and the round
// trip: hidden behind the stage's work when a decode is planned ahead, not otherwise).
DriveResult Drive(int streams, bool plan_ahead, bool payoff, int max_drafts = 4,
                  double host_gap = 0, int accept_tenths = 6) {
  double now = 0;
  SchedulerOptions options;
  options.num_stages = 1;
  options.kv_num_blocks = 1024;
  options.kv_block_size = 16;
  options.plan_ahead = plan_ahead;
  options.speculation.max_drafts = max_drafts;
  options.speculation.payoff.enabled = payoff;
  options.speculation.clock = [&now] { return now; };
  Scheduler scheduler(options);
  uint64_t next_id = 1;
  auto add = [&] {
    std::vector<int32_t> prompt(8);
    std::iota(prompt.begin(), prompt.end(), 100);
    SequenceParams params;
    params.max_tokens = 64;
    params.ignore_eos = true;
    EXPECT_TRUE(scheduler.AddRequest(next_id++, prompt, params).ok());
  };
  for (int i = 0; i < streams; ++i) add();
  DriveResult run;
  const int plans = 1200;
  int tokens = 0;
  double late_start = 0;
  int late_tokens = 0;
  // In flight: plans with their done time (a FIFO ring of one stage).
  std::vector<std::pair<MicroBatchPlan, double>> in_flight;
  double stage_free = 0;
  for (int p = 0; p < plans;) {
    while (std::optional<MicroBatchPlan> plan = scheduler.NextMicroBatch()) {
      const double start = std::max(now, stage_free);
      stage_free = start + std::max(1.0, 0.25 * static_cast<double>(plan->num_tokens()));
      in_flight.emplace_back(std::move(*plan), stage_free);
    }
    if (in_flight.empty()) {
      ADD_FAILURE() << "nothing in flight";
      break;
    }
    auto [plan, done] = std::move(in_flight.front());
    in_flight.erase(in_flight.begin());
    now = done;
    std::vector<int32_t> sampled;
    std::vector<SpeculativeTokens> spec;
    bool speculated = false;
    for (const PlannedChunk& entry : plan.entries) {
      if (!entry.samples) continue;
      const auto& drafts = entry.speculation.draft_ids;
      SpeculativeTokens result;
      size_t accepted = 0;
      auto draw = [&](uint64_t index) {
        uint64_t h = entry.seq_id * 0x9E3779B97F4A7C15ull ^ index * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
        h *= 0x94D049BB133111EBull;
        return (h >> 33) % 10;
      };
      while (accepted < drafts.size() &&
             draw(entry.token_index + accepted) < static_cast<uint64_t>(accept_tenths)) {
        ++accepted;
      }
      result.accepted.assign(drafts.begin(), drafts.begin() + static_cast<int64_t>(accepted));
      result.drafts.assign(entry.speculation.propose, 7);
      speculated |= !drafts.empty() || entry.speculation.propose > 0;
      sampled.push_back(7);
      spec.push_back(result);
    }
    if (++p > plans / 2 && plan.num_decodes() == static_cast<int>(plan.entries.size())) {
      ++run.late_plans;
      if (speculated) {
        ++run.late_speculating_plans;
      } else {
        for (const PlannedChunk& entry : plan.entries) {
          run.late_plain_chunks_told += entry.speculation.active ? 1 : 0;
        }
      }
    }
    if (p == plans / 2) late_start = now;
    auto result = scheduler.OnMicroBatchDone(plan.id, sampled, spec);
    EXPECT_TRUE(result.ok()) << result.status();
    if (!result.ok()) break;
    EXPECT_TRUE(scheduler.CheckInvariants().ok()) << scheduler.CheckInvariants();
    for (const TokenUpdate& update : result->tokens) {
      ++tokens;
      if (p > plans / 2) ++late_tokens;
      if (update.finish_reason != FinishReason::kNone) add();
    }
    now += host_gap;
  }
  run.ahead_decodes = static_cast<int>(scheduler.Stats().ahead_decodes);
  run.tokens_per_time = late_tokens / (now - late_start);
  return run;
}

TEST(SpeculationPayoffTest, EightStreamsStopSpeculatingWhenItCostsMoreThanItSaves) {
  const DriveResult without = Drive(8, false, false);
  EXPECT_GT(without.late_speculating_plans, without.late_plans / 2);  // what it did before
  const DriveResult run = Drive(8, false, true);
  ASSERT_GT(run.late_plans, 100);
  // Speculation runs only in the probes of the slower mode.
  EXPECT_LT(run.late_speculating_plans, run.late_plans / 10);
  EXPECT_EQ(run.late_plain_chunks_told, 0);  // plain chunks take the stage's plain path
  EXPECT_GT(run.tokens_per_time, without.tokens_per_time * 1.1)
      << without.late_speculating_plans << " of " << without.late_plans;
  const DriveResult plain = Drive(8, false, true, 0);
  EXPECT_GT(run.tokens_per_time, plain.tokens_per_time * 0.95);
}

TEST(SpeculationPayoffTest, OneStreamKeepsSpeculatingWhenItPays) {
  const DriveResult without = Drive(1, false, false);
  const DriveResult run = Drive(1, false, true);
  ASSERT_GT(run.late_plans, 100);
  // (The rest are the probes of plain decoding and stretches where the per-sequence policy
  // drafts nothing.)
  EXPECT_GT(run.late_speculating_plans, run.late_plans / 2);
  EXPECT_GT(run.tokens_per_time, without.tokens_per_time * 0.95);
  const DriveResult plain = Drive(1, false, true, 0);
  EXPECT_GT(run.tokens_per_time, plain.tokens_per_time * 1.1);
}

// The coordinator's time between a result and the next plan is a cost of speculating (its
// sequences wait for each result) that plain decoding planned ahead hides: measured from the
// issue alone, a verification at 30% acceptance (1.43 tokens for 1.25 units, plus the gap of 0.5)
// would look faster than plain decoding (1 token a unit) and be kept, though it costs 1.75.
TEST(SpeculationPayoffTest, TheHostGapBeforeAPlanCountsAgainstItsMode) {
  const DriveResult run = Drive(1, true, true, 4, /*host_gap=*/0.5, /*accept_tenths=*/3);
  const DriveResult plain = Drive(1, true, true, 0, 0.5, 3);
  ASSERT_GT(run.late_plans, 100);
  EXPECT_LT(run.late_speculating_plans, run.late_plans / 5);
  EXPECT_GT(run.tokens_per_time, plain.tokens_per_time * 0.95);
}

TEST(SpeculationPayoffTest, PlainDecodingIsPlannedAheadOnceSpeculationBacksOff) {
  const DriveResult run = Drive(8, true, true);
  ASSERT_GT(run.late_plans, 100);
  EXPECT_LT(run.late_speculating_plans, run.late_plans / 10);
  EXPECT_GT(run.ahead_decodes, 1000);
}

}  // namespace
}  // namespace ringserve
