// Speculation backs off when it does not pay, judged by measured throughput: the payoff's own
// decisions, and the scheduler driven by a fake clock whose cost model makes verification pay
// for one sequence and not for eight (whatever the acceptance rate says).
#include "coordinator/scheduler/speculation_payoff.h"

#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#include "coordinator/scheduler/scheduler.h"
#include "gtest/gtest.h"

namespace ringserve {
namespace {

using Mode = SpeculationPayoff::Mode;

TEST(SpeculationPayoffTest, MeasuresPlainFirstThenProbesSpeculationAndRunsTheFaster) {
  SpeculationPayoffOptions options{.samples = 4, .reprobe_after = 20};
  SpeculationPayoff payoff;
  EXPECT_EQ(payoff.ModeFor(options, 8), Mode::kPlain);  // first measure plain decoding
  for (int i = 0; i < 4; ++i) payoff.OnMeasured(options, 8, Mode::kPlain, true, 0.5, 8);
  EXPECT_EQ(payoff.ModeFor(options, 8), Mode::kSpeculate);          // then probe speculation
  payoff.OnMeasured(options, 8, Mode::kSpeculate, false, 0.01, 8);  // a switch: not counted
  for (int i = 0; i < 4; ++i) payoff.OnMeasured(options, 8, Mode::kSpeculate, true, 1.0, 10);
  EXPECT_EQ(payoff.Decision(3), Mode::kPlain);          // 16 tokens/s against 10
  EXPECT_EQ(payoff.ModeFor(options, 8), Mode::kPlain);  //
  EXPECT_EQ(payoff.ModeFor(options, 9), Mode::kPlain);  // the same bucket (8-15)
  EXPECT_EQ(payoff.Decision(0), std::nullopt);          // another bucket: not measured
  EXPECT_DOUBLE_EQ(payoff.Rate(SpeculationPayoff::Bucket(8), Mode::kSpeculate), 10.0);
  // After reprobe_after micro-batches the slower mode is measured again, and wins now.
  payoff.OnMeasured(options, 8, Mode::kPlain, false, 0.5, 8);
  for (int i = 0; i < 19; ++i) payoff.OnMeasured(options, 8, Mode::kPlain, true, 0.5, 8);
  EXPECT_EQ(payoff.ModeFor(options, 8), Mode::kPlain);
  payoff.OnMeasured(options, 8, Mode::kPlain, true, 0.5, 8);
  EXPECT_EQ(payoff.ModeFor(options, 8), Mode::kSpeculate);
  payoff.OnMeasured(options, 8, Mode::kSpeculate, false, 0.01, 8);
  for (int i = 0; i < 4; ++i) payoff.OnMeasured(options, 8, Mode::kSpeculate, true, 0.1, 10);
  EXPECT_EQ(payoff.Decision(3), Mode::kSpeculate);
  EXPECT_EQ(payoff.ModeFor(options, 8), Mode::kSpeculate);
  EXPECT_FALSE(SpeculationPayoffOptions{.enabled = false}.enabled);
  EXPECT_EQ(payoff.ModeFor({.enabled = false}, 1), Mode::kSpeculate);
}

// A probe's micro-batch that took ten times what its tokens took in the other mode (a
// verification shape's graph captured mid-probe) is a one-time cost: it is not measured, so the
// probe decides on the mode's real rate; a probe of nothing but such micro-batches is given up.
TEST(SpeculationPayoffTest, OneTimeCostsInAProbeAreNotItsRate) {
  const SpeculationPayoffOptions options{.samples = 4, .reprobe_after = 4000, .max_outliers = 3};
  SpeculationPayoff payoff;
  for (int i = 0; i < 4; ++i) payoff.OnMeasured(options, 1, Mode::kPlain, true, 1.0, 10);
  ASSERT_EQ(payoff.ModeFor(options, 1), Mode::kSpeculate);  // the first probe
  payoff.OnMeasured(options, 1, Mode::kSpeculate, false, 0.01, 2);
  // Three of its micro-batches capture graphs (100 s each, in this clock); four run at 20 tok/s.
  for (double took : {100.0, 1.0, 100.0, 100.0, 1.0, 1.0, 1.0}) {
    payoff.OnMeasured(options, 1, Mode::kSpeculate, true, took, 20);
  }
  EXPECT_EQ(payoff.Decision(0), Mode::kSpeculate);
  EXPECT_DOUBLE_EQ(payoff.Rate(0, Mode::kSpeculate), 20.0);
  // At 8 sequences a probe that meets only such micro-batches ends (as if it had confirmed).
  for (int i = 0; i < 4; ++i) payoff.OnMeasured(options, 8, Mode::kPlain, true, 1.0, 80);
  ASSERT_EQ(payoff.ModeFor(options, 8), Mode::kSpeculate);
  payoff.OnMeasured(options, 8, Mode::kSpeculate, false, 0.01, 8);
  for (int i = 0; i < 4; ++i) payoff.OnMeasured(options, 8, Mode::kSpeculate, true, 100.0, 80);
  EXPECT_EQ(payoff.ModeFor(options, 8), Mode::kPlain);
}

// Where speculation keeps losing, each probe that confirms plain decoding doubles the interval
// to the next (up to max_reprobe_after); a probe that finds speculation faster resets it.
TEST(SpeculationPayoffTest, ConfirmingProbesGrowTheirIntervalOverturningOnesResetIt) {
  const SpeculationPayoffOptions options{
      .samples = 2, .reprobe_after = 10, .max_reprobe_after = 40, .decay = 0.5};
  SpeculationPayoff payoff;
  double speculate_rate = 5, plain_rate = 10;  // tokens per second of each mode
  Mode last = Mode::kPlain;
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
  // Plain decoding: its 2 samples, then (after each probe of 3: a switch and 2 samples) the
  // switch back and the first interval of 10 (11), then 20, 40 and the cap, 40.
  EXPECT_EQ(run(160, Mode::kPlain), (std::vector<int>{2, 11, 21, 41, 41}));
  // Speculation pays now: the next probe overturns the decision and the interval restarts at
  // reprobe_after: speculating runs of 13 (the probe and 10), then 21 after a confirming probe.
  speculate_rate = 20;
  EXPECT_EQ(run(60, Mode::kSpeculate), (std::vector<int>{13, 21}));
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

// The payoff driven as the scheduler drives it: each micro-batch runs in the mode ModeFor
// gives, warm when the one before ran in the same mode. A plain micro-batch takes 1 ms and
// emits a token per sequence; a speculating one emits twice that in the time that makes
// speculation `speedup(bucket)` times as fast.
class PayoffLoop {
 public:
  PayoffLoop(SpeculationPayoffOptions options, std::function<double(int bucket)> speedup)
      : options_(options), speedup_(std::move(speedup)) {}

  Mode Step(int decoding) {
    const Mode mode = payoff_.ModeFor(options_, decoding);
    const int bucket = SpeculationPayoff::Bucket(decoding);
    const bool speculating = mode == Mode::kSpeculate;
    const double took_s = 1e-3 * (speculating ? 2.0 / speedup_(bucket) : 1.0);
    payoff_.OnMeasured(options_, decoding, mode, mode == last_, took_s,
                       decoding * (speculating ? 2 : 1));
    if (mode != last_) ++switches_[bucket];
    if (speculating) ++speculating_[bucket];
    last_ = mode;
    return mode;
  }
  // Steps until `bucket` holds a decision of its own (at most 10,000 micro-batches).
  void Decide(int decoding) {
    for (int i = 0; i < 10000 && !payoff_.Decision(SpeculationPayoff::Bucket(decoding)); ++i) {
      Step(decoding);
    }
    ASSERT_TRUE(payoff_.Decision(SpeculationPayoff::Bucket(decoding))) << decoding;
  }
  // Speculating micro-batches and mode switches (into or out of speculation) at buckets >= b.
  int SpeculatingFrom(int b) const { return Sum(speculating_, b); }
  int SwitchesFrom(int b) const { return Sum(switches_, b); }
  void ResetCounts() {
    speculating_.clear();
    switches_.clear();
  }
  const SpeculationPayoff& payoff() const { return payoff_; }
  Mode ModeFor(int decoding) const { return payoff_.ModeFor(options_, decoding); }

 private:
  static int Sum(const std::map<int, int>& counts, int from) {
    int sum = 0;
    for (const auto& [bucket, count] : counts) sum += bucket >= from ? count : 0;
    return sum;
  }
  SpeculationPayoffOptions options_;
  std::function<double(int)> speedup_;
  SpeculationPayoff payoff_;
  Mode last_ = Mode::kPlain;
  std::map<int, int> speculating_;
  std::map<int, int> switches_;
};

// Speculation's payoff falls as the load grows: plain decoding decided at a bucket carries to
// the buckets above it (and the one just below), speculation to the buckets below it; such a
// bucket runs the borrowed mode and probes the other only after reprobe_after micro-batches.
TEST(SpeculationPayoffTest, ABucketWithoutADecisionBorrowsWhatMonotonicityImplies) {
  const SpeculationPayoffOptions options{.samples = 4, .reprobe_after = 100};
  PayoffLoop loses(options, [](int) { return 0.9; });
  loses.Decide(4);  // bucket 2: plain decoding
  EXPECT_EQ(loses.payoff().Decision(2), Mode::kPlain);
  EXPECT_EQ(loses.ModeFor(2), Mode::kPlain);   // bucket 1: twice the load is plain
  EXPECT_EQ(loses.ModeFor(16), Mode::kPlain);  // bucket 4: above plain
  loses.ResetCounts();
  // A switch, its samples, then reprobe_after micro-batches (counted from its last sample).
  for (int i = 0; i < 1 + 4 + 99; ++i) EXPECT_EQ(loses.Step(8), Mode::kPlain) << i;
  EXPECT_EQ(loses.ModeFor(8), Mode::kSpeculate);  // its first probe
  // Bucket 0 borrows nothing (plain decided two buckets up): plain first, then a probe at once.
  for (int i = 0; i < 4; ++i) EXPECT_EQ(loses.Step(1), Mode::kPlain) << i;
  EXPECT_EQ(loses.ModeFor(1), Mode::kSpeculate);

  PayoffLoop pays(options, [](int) { return 1.5; });
  pays.Decide(4);  // bucket 2: speculation
  EXPECT_EQ(pays.payoff().Decision(2), Mode::kSpeculate);
  EXPECT_EQ(pays.ModeFor(1), Mode::kSpeculate);  // below: speculation from the start
  EXPECT_EQ(pays.ModeFor(3), Mode::kSpeculate);
  EXPECT_EQ(pays.ModeFor(8), Mode::kPlain);  // above: nothing borrowed, plain first
  for (int i = 0; i < 4 + 99; ++i) EXPECT_EQ(pays.Step(1), Mode::kSpeculate) << i;
  EXPECT_EQ(pays.ModeFor(1), Mode::kPlain);  // its first probe of plain decoding

  // Measurements that contradict monotonicity lend nothing: bucket 2 measures on its own.
  PayoffLoop mixed(options, [](int bucket) { return bucket == 3 ? 1.5 : 0.9; });
  mixed.Decide(2);
  mixed.Decide(8);
  ASSERT_EQ(mixed.payoff().Decision(1), Mode::kPlain);
  ASSERT_EQ(mixed.payoff().Decision(3), Mode::kSpeculate);
  for (int i = 0; i < 1 + 4; ++i) EXPECT_EQ(mixed.Step(4), Mode::kPlain) << i;
  EXPECT_EQ(mixed.ModeFor(4), Mode::kSpeculate);  // probed at once, not reprobe_after later
}

// At 8 sequences a probe of a speculation that loses clearly stops after min_samples measured
// micro-batches; at one sequence it runs its full samples (one sequence's acceptance is too
// noisy to judge by four), and so does a probe of a loss smaller than clear_loss.
TEST(SpeculationPayoffTest, AProbeOfAClearLossEndsEarlyAtLoadButNotAtOneSequence) {
  const SpeculationPayoffOptions options;  // samples 16, min_samples 4, clear_loss 0.25
  struct Case {
    int decoding;
    double speedup;
    int speculating;  // micro-batches of the first probe (a switch and the measured ones)
  };
  for (const Case& c :
       {Case{8, 0.5, 1 + 4}, Case{1, 0.5, 1 + 16}, Case{8, 0.9, 1 + 16}, Case{2, 0.5, 1 + 8}}) {
    PayoffLoop loop(options, [&](int) { return c.speedup; });
    loop.Decide(c.decoding);
    EXPECT_EQ(loop.payoff().Decision(SpeculationPayoff::Bucket(c.decoding)), Mode::kPlain);
    EXPECT_EQ(loop.SpeculatingFrom(0), c.speculating) << c.decoding << " " << c.speedup;
  }
}

// A bucket visited one micro-batch at a time between those of a bucket running plain decoding
// can never measure speculation (each visit starts with a switch): its probe is given up after
// max_probe_switches visits, and the next waits reprobe_after micro-batches (before, it
// speculated on every visit for good).
TEST(SpeculationPayoffTest, AProbeInVisitsTooShortToMeasureIsGivenUp) {
  const SpeculationPayoffOptions options{.reprobe_after = 4000};
  PayoffLoop loop(options, [](int) { return 0.9; });
  loop.Decide(8);  // bucket 3: plain decoding
  loop.ResetCounts();
  // Bucket 1 borrows nothing from bucket 3: plain first, then its probe of speculation.
  for (int i = 0; i < 3000; ++i) {
    loop.Step(2);
    loop.Step(8);
  }
  EXPECT_EQ(loop.payoff().Decision(1), std::nullopt);
  EXPECT_EQ(loop.SpeculatingFrom(0), options.max_probe_switches);
  EXPECT_EQ(loop.ModeFor(2), Mode::kPlain);
}

// When a probe overturns a decision, the buckets that monotonicity says should follow probe at
// their next measured micro-batch instead of reprobe_after later: speculation winning at
// bucket 3 makes buckets 1 and 2, deciding plain decoding, probe; bucket 4 does not.
TEST(SpeculationPayoffTest, AnOverturnMakesTheBucketsThatShouldFollowProbe) {
  const SpeculationPayoffOptions options{.samples = 4, .reprobe_after = 1000};
  double speedup = 0.5;
  PayoffLoop loop(options, [&](int) { return speedup; });
  for (int decoding : {2, 4, 16, 8}) loop.Decide(decoding);
  for (int b : {1, 2, 3, 4}) ASSERT_EQ(loop.payoff().Decision(b), Mode::kPlain) << b;
  speedup = 1.5;
  // Its re-probes (the old measurements weigh in, so it may take more than one).
  for (int i = 0; i < 100000 && loop.payoff().Decision(3) == Mode::kPlain; ++i) loop.Step(8);
  ASSERT_EQ(loop.payoff().Decision(3), Mode::kSpeculate);
  // (The rates may say so before the probe has its samples: it ends within them.)
  for (int i = 0; i < options.samples; ++i) EXPECT_EQ(loop.Step(8), Mode::kSpeculate);
  EXPECT_EQ(loop.Step(2), Mode::kPlain);  // a switch: not measured
  EXPECT_EQ(loop.Step(2), Mode::kPlain);
  EXPECT_EQ(loop.ModeFor(2), Mode::kSpeculate);
  EXPECT_EQ(loop.Step(4), Mode::kPlain);
  EXPECT_EQ(loop.ModeFor(4), Mode::kSpeculate);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(loop.Step(16), Mode::kPlain) << i;
}

// A closed loop of 8 streams: sequences end and their successors start, so the decoding count
// dips from 8 to 7 (bucket 3 to 2) for 1-3 micro-batches every 5-20. Plain decoding is 10%
// faster at 4 sequences and more, speculation 20% faster at one. Before, bucket 2 measured
// speculation first, in visits that each began with a switch (66 and 69 speculating
// micro-batches, 36 and 42 mode switches at buckets 2-3 in the two runs' 10,000 micro-batches);
// now bucket 2 borrows bucket 3's decision, and only bucket 3 probes: its first measurement and
// one re-probe (37 and 36 speculating micro-batches, 11 and 8 switches).
TEST(SpeculationPayoffTest, ACloseLoopBetweenSevenAndEightSpeculatesOnlyInRareProbes) {
  const SpeculationPayoffOptions options;
  const auto speedup = [](int bucket) { return bucket == 0 ? 1.2 : 1 / 1.1; };
  for (const bool one_stream_first : {true, false}) {
    const uint32_t seed = one_stream_first ? 7 : 11;
    SCOPED_TRACE(::testing::Message()
                 << "seed " << seed << ", one stream first " << one_stream_first);
    PayoffLoop loop(options, speedup);
    if (one_stream_first) loop.Decide(1);
    std::mt19937 random(seed);
    for (int n = 0; n < 10000;) {
      for (int i = 5 + static_cast<int>(random() % 16); i > 0 && n < 10000; --i, ++n) loop.Step(8);
      for (int i = 1 + static_cast<int>(random() % 3); i > 0 && n < 10000; --i, ++n) loop.Step(7);
    }
    // Two probes of samples measured micro-batches, each with a few switch micro-batches.
    EXPECT_LE(loop.SpeculatingFrom(2), 2 * (options.samples + options.max_probe_switches));
    EXPECT_LE(loop.SwitchesFrom(2), 4 * options.max_probe_switches);
    EXPECT_EQ(loop.payoff().Decision(3), Mode::kPlain);
    // One stream again (or for the first time): speculation, after at most a first probe.
    int speculating = 0;
    for (int i = 0; i < 500; ++i) speculating += loop.Step(1) == Mode::kSpeculate ? 1 : 0;
    EXPECT_GE(speculating, 500 - options.samples);
    EXPECT_EQ(loop.payoff().Decision(0), Mode::kSpeculate);
  }
  // Strictly alternating counts: bucket 2 and 3 probe together (each micro-batch warm), and no
  // probe is left unfinished: two rounds of two probes in 10,000 micro-batches.
  PayoffLoop loop(options, speedup);
  for (int n = 0; n < 10000; ++n) loop.Step(7 + n % 2);
  EXPECT_LE(loop.SpeculatingFrom(2), 4 * (options.samples + 1));
  EXPECT_EQ(loop.ModeFor(7), Mode::kPlain);
  EXPECT_EQ(loop.ModeFor(8), Mode::kPlain);
}

struct DriveResult {
  int late_plans = 0;              // decode plans in the second half
  int late_speculating_plans = 0;  // of those, with a chunk that drafts or verifies
  int late_plain_chunks_told = 0;  // chunks of plain late plans that still carry speculation
  int ahead_decodes = 0;
  double tokens_per_time = 0;
  int late_all_plans = 0;              // every plan in the second half (prefills too) ...
  int late_all_speculating_plans = 0;  // ... of those, with a chunk that drafts or verifies
  int late_switches = 0;               // ... in the order planned, changes of that
};

// `streams` closed-loop clients of 64 tokens each on a 1-stage ring, greedy; the last stage
// accepts each draft with probability `accept_tenths` / 10 (default 0.6; a fixed pseudo-random
// draw per sequence and token), up to the first rejection; a plan takes 1 time unit up to
// `flat_tokens` tokens and 1/4 unit for each token beyond (by default a target step that is
// memory-bound up to 4 tokens and compute-bound above: with one sequence verification pays, with
// eight it costs more than it saves, at any k; with 64, a small target whose step costs about
// the same for 8 tokens or 40, where verifying pays at 8 sequences too). After each
// result the coordinator spends `host_gap` before it plans again (its processing and the round
// trip: hidden behind the stage's work when a decode is planned ahead, not otherwise).
struct DriveOptions {
  int streams = 8;
  bool plan_ahead = false;
  bool payoff = true;
  int max_drafts = 4;
  double host_gap = 0;
  int accept_tenths = 6;
  // Streams for the first quarter of the plans (0: `streams` throughout), as
  // bench/spec/device_run.sh runs 1 stream and then 8 on the same ring: the `streams` start
  // together when the last of the first ones ends (and, with one prompt and length, stay in
  // step: they end together and their successors are admitted together).
  int first_streams = 0;
  // Every stream writes the same text (greedy streams of one prompt), so drafts are accepted
  // alike: the streams stay in step through speculation too.
  bool same_text = false;
  int flat_tokens = 4;  // a plan's cost is flat up to this many tokens (see above)
};

DriveResult Drive(const DriveOptions& drive) {
  double now = 0;
  SchedulerOptions options;
  options.num_stages = 1;
  options.kv_num_blocks = 1024;
  options.kv_block_size = 16;
  options.plan_ahead = drive.plan_ahead;
  options.speculation.max_drafts = drive.max_drafts;
  options.speculation.payoff.enabled = drive.payoff;
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
  const int plans = 1200;
  int streams = drive.first_streams > 0 ? drive.first_streams : drive.streams;
  int active = streams;
  for (int i = 0; i < streams; ++i) add();
  DriveResult run;
  int tokens = 0;
  double late_start = 0;
  int late_tokens = 0;
  // In flight: plans with their done time (a FIFO ring of one stage).
  std::vector<std::pair<MicroBatchPlan, double>> in_flight;
  double stage_free = 0;
  int planned = 0;
  bool last_speculated = false;
  for (int p = 0; p < plans;) {
    while (std::optional<MicroBatchPlan> plan = scheduler.NextMicroBatch()) {
      bool speculates = false;
      for (const PlannedChunk& entry : plan->entries) {
        speculates |= !entry.speculation.draft_ids.empty() || entry.speculation.propose > 0;
      }
      if (++planned > plans / 2) {
        ++run.late_all_plans;
        run.late_all_speculating_plans += speculates ? 1 : 0;
        run.late_switches += speculates != last_speculated ? 1 : 0;
      }
      last_speculated = speculates;
      const double start = std::max(now, stage_free);
      const int over = std::max(0, static_cast<int>(plan->num_tokens()) - drive.flat_tokens);
      stage_free = start + 1.0 + 0.25 * over;
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
        const uint64_t text = drive.same_text ? 1 : entry.seq_id;
        uint64_t h = text * 0x9E3779B97F4A7C15ull ^ index * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
        h *= 0x94D049BB133111EBull;
        return (h >> 33) % 10;
      };
      while (accepted < drafts.size() &&
             draw(entry.token_index + accepted) < static_cast<uint64_t>(drive.accept_tenths)) {
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
      if (update.finish_reason != FinishReason::kNone) --active;
    }
    if (p >= plans / 4 && active == 0) streams = drive.streams;
    for (; active < streams; ++active) add();
    now += drive.host_gap;
  }
  run.ahead_decodes = static_cast<int>(scheduler.Stats().ahead_decodes);
  run.tokens_per_time = late_tokens / (now - late_start);
  return run;
}

TEST(SpeculationPayoffTest, EightStreamsStopSpeculatingWhenItCostsMoreThanItSaves) {
  const DriveResult without = Drive({.streams = 8, .payoff = false});
  EXPECT_GT(without.late_speculating_plans, without.late_plans / 2);  // what it did before
  const DriveResult run = Drive({.streams = 8});
  ASSERT_GT(run.late_plans, 100);
  // Speculation runs only in the probes of the slower mode.
  EXPECT_LT(run.late_speculating_plans, run.late_plans / 10);
  EXPECT_EQ(run.late_plain_chunks_told, 0);  // plain chunks take the stage's plain path
  EXPECT_GT(run.tokens_per_time, without.tokens_per_time * 1.1)
      << without.late_speculating_plans << " of " << without.late_plans;
  const DriveResult plain = Drive({.streams = 8, .max_drafts = 0});
  EXPECT_GT(run.tokens_per_time, plain.tokens_per_time * 0.95);
}

// In the closed loop the plan that admits a successor carries 7 decoding sequences (bucket 2)
// and is never measured (it prefills): before, that bucket stayed in its first probe of
// speculation, and every such plan speculated (68 of the 600 late plans, with 136 switches;
// 53 and 87 with plan-ahead). Now bucket 2 borrows bucket 3's plain decoding (and a plan that
// prefills does not switch into speculation): none.
TEST(SpeculationPayoffTest, EightStreamsDoNotSpeculateInThePlansThatAdmitSuccessors) {
  for (const bool plan_ahead : {false, true}) {
    const DriveResult run = Drive({.streams = 8, .plan_ahead = plan_ahead});
    ASSERT_GT(run.late_all_plans, 500);
    EXPECT_LE(run.late_all_speculating_plans, 5) << plan_ahead;
    EXPECT_LE(run.late_switches, 10) << plan_ahead;
  }
}

// As bench/spec/device_run.sh measures: 1 stream first, where speculation pays and bucket 0
// decides it, then 8 streams on the same ring, in step. The plan that admits their successors
// carries no decoding sequence (bucket 0: speculate), so before, each round of requests
// switched into speculation for it (drafts proposed and never verified) and back (10 such
// plans and 20 switches in the last 600 plans; 9 and 18 with the payoff's rules alone). Such a
// plan no longer switches into speculation: none now.
TEST(SpeculationPayoffTest, EightStreamsAfterOneStreamRunPlainAsTheyStart) {
  for (const bool plan_ahead : {false, true}) {
    const DriveOptions options{
        .streams = 8, .plan_ahead = plan_ahead, .first_streams = 1, .same_text = true};
    const DriveResult run = Drive(options);
    DriveOptions plain_options = options;
    plain_options.max_drafts = 0;
    const DriveResult plain = Drive(plain_options);
    ASSERT_GT(run.late_all_plans, 500);
    EXPECT_LE(run.late_all_speculating_plans, 5) << plan_ahead;
    EXPECT_LE(run.late_switches, 10) << plan_ahead;
    EXPECT_GT(run.tokens_per_time, plain.tokens_per_time * 0.98) << plan_ahead;
  }
}

TEST(SpeculationPayoffTest, OneStreamKeepsSpeculatingWhenItPays) {
  const DriveResult without = Drive({.streams = 1, .payoff = false});
  const DriveResult run = Drive({.streams = 1});
  ASSERT_GT(run.late_plans, 100);
  // (The rest are the probes of plain decoding and stretches where the per-sequence policy
  // drafts nothing.)
  EXPECT_GT(run.late_speculating_plans, run.late_plans / 2);
  EXPECT_GT(run.tokens_per_time, without.tokens_per_time * 0.95);
  const DriveResult plain = Drive({.streams = 1, .max_drafts = 0});
  EXPECT_GT(run.tokens_per_time, plain.tokens_per_time * 1.1);
}

// The coordinator's time between a result and the next plan is a cost of speculating (its
// sequences wait for each result) that plain decoding planned ahead hides: measured from the
// issue alone, a verification at 30% acceptance (1.43 tokens for 1.25 units, plus the gap of 0.5)
// would look faster than plain decoding (1 token a unit) and be kept, though it costs 1.75.
TEST(SpeculationPayoffTest, TheHostGapBeforeAPlanCountsAgainstItsMode) {
  const DriveResult run =
      Drive({.streams = 1, .plan_ahead = true, .host_gap = 0.5, .accept_tenths = 3});
  const DriveResult plain = Drive(
      {.streams = 1, .plan_ahead = true, .max_drafts = 0, .host_gap = 0.5, .accept_tenths = 3});
  ASSERT_GT(run.late_plans, 100);
  EXPECT_LT(run.late_speculating_plans, run.late_plans / 5);
  EXPECT_GT(run.tokens_per_time, plain.tokens_per_time * 0.95);
}

TEST(SpeculationPayoffTest, PlainDecodingIsPlannedAheadOnceSpeculationBacksOff) {
  const DriveResult run = Drive({.streams = 8, .plan_ahead = true});
  ASSERT_GT(run.late_plans, 100);
  EXPECT_LT(run.late_speculating_plans, run.late_plans / 10);
  EXPECT_GT(run.ahead_decodes, 1000);
}

// Where a verification step costs about what a plain step does (a plan's cost is flat up to 64
// tokens), 8 speculating streams verify in one micro-batch with plan-ahead as without it. Before,
// a follow-up planned while a verification ran took the sequences ready at the time (it cannot
// continue the speculating ones), and the two halves alternated for good: two steps for what one
// verifies (7.4 tokens a unit forced, against 12.6 without plan-ahead and 8 plain), so the
// payoff rightly chose plain decoding.
TEST(SpeculationPayoffTest, PlanAheadKeepsSpeculatingStreamsInOneMicroBatch) {
  for (const double gap : {0.0, 0.3}) {
    SCOPED_TRACE(::testing::Message() << "host gap " << gap);
    const DriveOptions flat{.streams = 8, .plan_ahead = true, .host_gap = gap, .flat_tokens = 64};
    DriveOptions forced = flat;
    forced.payoff = false;
    DriveOptions plain = flat;
    plain.max_drafts = 0;
    DriveOptions packed = flat;
    packed.plan_ahead = false;
    packed.payoff = false;
    const DriveResult run = Drive(flat);
    const DriveResult forced_run = Drive(forced);
    const DriveResult packed_run = Drive(packed);
    const DriveResult plain_run = Drive(plain);
    EXPECT_GT(forced_run.tokens_per_time, 0.98 * packed_run.tokens_per_time);
    EXPECT_GT(forced_run.tokens_per_time, 1.15 * plain_run.tokens_per_time);
    EXPECT_GT(run.tokens_per_time, 0.95 * forced_run.tokens_per_time);
    EXPECT_GT(run.late_speculating_plans, run.late_plans * 9 / 10);
  }
}

// A probe of speculation measures only plans that verify or draft. At one stream with the
// coordinator's turn exposed (0.3 of a step), the sequence's own policy stopped drafting after
// its first rejections, and its plain decodes, planned ahead and counted as speculation, made
// the probe decide plain decoding (0.995 tokens a unit, where forced speculation made 1.27).
TEST(SpeculationPayoffTest, AProbeOfSpeculationMeasuresOnlyPlansThatDraft) {
  const DriveOptions flat{.streams = 1, .plan_ahead = true, .host_gap = 0.3, .flat_tokens = 64};
  DriveOptions forced = flat;
  forced.payoff = false;
  DriveOptions plain = flat;
  plain.max_drafts = 0;
  const DriveResult run = Drive(flat);
  const DriveResult forced_run = Drive(forced);
  const DriveResult plain_run = Drive(plain);
  EXPECT_GT(forced_run.tokens_per_time, 1.15 * plain_run.tokens_per_time);
  EXPECT_GT(run.tokens_per_time, 0.95 * forced_run.tokens_per_time);
}

}  // namespace
}  // namespace ringserve
