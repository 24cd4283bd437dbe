// The scheduler on a simulated ring (ring_simulator.h states the cost model).
#include <algorithm>
#include <numeric>
#include <random>

#include "coordinator/scheduler/ring_simulator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringserve {
namespace {

SchedulerOptions Options(int stages, DecodePacking packing = DecodePacking::kSpread) {
  SchedulerOptions options;
  options.num_stages = stages;
  options.kv_block_size = 16;
  options.kv_num_blocks = 4096;
  options.decode_packing = packing;
  return options;
}

RingSimOptions Costs(int stages, double batch_cost, double token_cost, double hop = 0.0) {
  RingSimOptions options;
  options.num_stages = stages;
  options.batch_cost = batch_cost;
  options.token_cost = token_cost;
  options.hop_latency = hop;
  return options;
}

std::vector<SimRequest> Requests(int count, int prompt_len, int max_tokens, uint64_t first_id = 1,
                                 double arrival = 0.0) {
  std::vector<SimRequest> requests;
  for (int i = 0; i < count; ++i) {
    SimRequest request;
    request.arrival_time = arrival;
    request.seq_id = first_id + i;
    request.prompt.resize(prompt_len);
    std::iota(request.prompt.begin(), request.prompt.end(), 10 * i + 1);
    request.params.max_tokens = max_tokens;
    requests.push_back(std::move(request));
  }
  return requests;
}

void ExpectClean(const SimResult& result) {
  EXPECT_THAT(result.violations, ::testing::IsEmpty());
  EXPECT_EQ(result.kv_blocks_used_at_end, 0);
}

// The decode steady state: from when every request has `min_tokens` tokens until the first
// request finishes.
struct Window {
  double from = 0;
  double to = 0;
};

Window SteadyWindow(const SimResult& result, size_t min_tokens = 2) {
  Window window{0, 1e300};
  for (const auto& [id, request] : result.requests) {
    if (request.token_times.size() >= min_tokens) {
      window.from = std::max(window.from, request.token_times[min_tokens - 1]);
    }
    window.to = std::min(window.to, request.finish_time);
  }
  return window;
}

double Throughput(const SimResult& result) {
  Window window = SteadyWindow(result);
  return static_cast<double>(result.TokensBetween(window.from, window.to)) /
         (window.to - window.from);
}

TEST(RingSimTest, SpreadGivesEveryStageWorkEveryStep) {
  for (int stages : {2, 3, 4}) {
    for (int streams : {stages, 2 * stages, 2 * stages + 1}) {
      SCOPED_TRACE(::testing::Message() << stages << " stages, " << streams << " streams");
      Scheduler scheduler(Options(stages));
      SimResult result =
          SimulateRing(scheduler, Costs(stages, 1.0, 0.01), Requests(streams, 8, 60));
      ExpectClean(result);
      Window window = SteadyWindow(result);
      ASSERT_GT(window.to - window.from, 20.0);
      for (int stage = 0; stage < stages; ++stage) {
        double busy = result.BusyTime(stage, window.from, window.to) / (window.to - window.from);
        EXPECT_GT(busy, 0.97) << "stage " << stage;
      }
      // Balanced: decode micro-batches differ by at most one sequence... except the remainder.
      for (const SimPlanRecord& plan : result.plans) {
        if (plan.issue_time < window.from || plan.issue_time >= window.to) continue;
        EXPECT_LE(plan.num_decodes, (streams + stages - 1) / stages);
        EXPECT_GE(plan.num_decodes, 1);
      }
    }
  }
}

TEST(RingSimTest, PackedLeavesAllButOneStageIdle) {
  constexpr int kStages = 4;
  Scheduler scheduler(Options(kStages, DecodePacking::kPacked));
  SimResult result = SimulateRing(scheduler, Costs(kStages, 1.0, 0.01), Requests(8, 8, 60));
  ExpectClean(result);
  Window window = SteadyWindow(result);
  for (int stage = 0; stage < kStages; ++stage) {
    double busy = result.BusyTime(stage, window.from, window.to) / (window.to - window.from);
    EXPECT_NEAR(busy, 1.0 / kStages, 0.03) << "stage " << stage;
  }
}

// With M = S micro-batches, N decodes, per-stage cost a + b * tokens and no hop latency:
//   spread: every stage runs S micro-batches of N / S decodes per round -> N / (S a + b N)
//   packed: one micro-batch of N decodes goes round the S stages      -> N / (S (a + b N))
//   ratio = S (a + b N) / (S a + b N): S when the per-token cost dominates, 1 when the
//   per-micro-batch cost does (memory-bound decode reads the weights once either way).
TEST(RingSimTest, SpreadOverPackedThroughputFollowsTheCostModel) {
  constexpr int kStages = 4;
  constexpr int kStreams = 8;
  struct Regime {
    double batch_cost;
    double token_cost;
  };
  for (Regime regime : {Regime{1.0, 0.0}, Regime{1.0, 0.25}, Regime{0.05, 1.0}}) {
    const double a = regime.batch_cost;
    const double b = regime.token_cost;
    SCOPED_TRACE(::testing::Message() << "a=" << a << " b=" << b);
    Scheduler spread(Options(kStages, DecodePacking::kSpread));
    Scheduler packed(Options(kStages, DecodePacking::kPacked));
    SimResult spread_result =
        SimulateRing(spread, Costs(kStages, a, b), Requests(kStreams, 8, 200));
    SimResult packed_result =
        SimulateRing(packed, Costs(kStages, a, b), Requests(kStreams, 8, 200));
    ExpectClean(spread_result);
    ExpectClean(packed_result);
    const double spread_expected = kStreams / (kStages * a + b * kStreams);
    const double packed_expected = kStreams / (kStages * (a + b * kStreams));
    EXPECT_NEAR(Throughput(spread_result) / spread_expected, 1.0, 0.03);
    EXPECT_NEAR(Throughput(packed_result) / packed_expected, 1.0, 0.03);
    const double ratio = Throughput(spread_result) / Throughput(packed_result);
    EXPECT_NEAR(ratio / (spread_expected / packed_expected), 1.0, 0.05) << "ratio " << ratio;
  }
  // The regime where spreading pays most: ratio close to S.
  Scheduler spread(Options(kStages, DecodePacking::kSpread));
  Scheduler packed(Options(kStages, DecodePacking::kPacked));
  double ratio =
      Throughput(SimulateRing(spread, Costs(kStages, 0.05, 1.0), Requests(kStreams, 8, 200))) /
      Throughput(SimulateRing(packed, Costs(kStages, 0.05, 1.0), Requests(kStreams, 8, 200)));
  EXPECT_GT(ratio, 0.9 * kStages);
}

// Returns the largest gap between consecutive tokens of requests 1..streams while request
// `long_id` is prefilling.
double MaxDecodeGapDuringPrefill(const SimResult& result, int streams, uint64_t long_id,
                                 double long_arrival) {
  const double prefill_end = result.requests.at(long_id).token_times.at(0);
  double max_gap = 0;
  for (uint64_t id = 1; id <= static_cast<uint64_t>(streams); ++id) {
    const auto& times = result.requests.at(id).token_times;
    for (size_t i = 1; i < times.size(); ++i) {
      if (times[i] < long_arrival || times[i - 1] > prefill_end) continue;
      max_gap = std::max(max_gap, times[i] - times[i - 1]);
    }
  }
  return max_gap;
}

TEST(RingSimTest, ChunkedPrefillKeepsDecodesFlowing) {
  constexpr int kStages = 2;
  constexpr int kStreams = 4;
  constexpr int kBudget = 256;
  constexpr double kA = 1.0;
  constexpr double kB = 0.01;
  constexpr double kLongArrival = 20.0;
  auto run = [&](int budget) {
    SchedulerOptions options = Options(kStages);
    options.max_tokens_per_micro_batch = budget;
    Scheduler scheduler(options);
    std::vector<SimRequest> requests = Requests(kStreams, 4, 400);
    std::vector<SimRequest> long_prompt = Requests(1, 4000, 4, 100, kLongArrival);
    requests.push_back(long_prompt[0]);
    return SimulateRing(scheduler, Costs(kStages, kA, kB), requests);
  };
  SimResult chunked = run(kBudget);
  ExpectClean(chunked);
  ASSERT_EQ(chunked.requests.at(100).tokens.size(), 4u);
  // Every micro-batch that carried a piece of the long prompt also carried decodes.
  int prefill_plans = 0;
  for (const SimPlanRecord& plan : chunked.plans) {
    if (plan.num_prefill_tokens > 100) {
      ++prefill_plans;
      EXPECT_GE(plan.num_decodes, 1) << "plan " << plan.plan_id;
    }
  }
  EXPECT_GE(prefill_plans, 4000 / kBudget);
  // A decode waits at most for the micro-batches ahead of it, each at most one chunk.
  const double bound = (2 + kStages) * (kA + kB * kBudget);
  const double gap = MaxDecodeGapDuringPrefill(chunked, kStreams, 100, kLongArrival);
  EXPECT_LT(gap, bound);
  // Without chunking the whole prompt rides in one micro-batch and stalls every stream.
  SimResult unchunked = run(8192);
  ExpectClean(unchunked);
  EXPECT_GT(MaxDecodeGapDuringPrefill(unchunked, kStreams, 100, kLongArrival), 2 * bound);
}

std::vector<int32_t> ExpectedTokens(const RingSimOptions& sim, uint64_t id, int count) {
  std::vector<int32_t> tokens;
  for (int i = 0; i < count; ++i) tokens.push_back(sim.sample(id, i));
  return tokens;
}

TEST(RingSimTest, KvExhaustionPreemptsAndRecovers) {
  SchedulerOptions options = Options(3);
  options.kv_block_size = 4;
  options.kv_num_blocks = 24;  // 96 positions for 12 requests of up to 49
  Scheduler scheduler(options);
  std::vector<SimRequest> requests;
  for (int i = 0; i < 12; ++i) {
    auto one = Requests(1, 10 + i, 30, i + 1, i * 0.5);
    requests.push_back(one[0]);
  }
  RingSimOptions sim = Costs(3, 1.0, 0.01);
  SimResult result = SimulateRing(scheduler, sim, requests);
  ExpectClean(result);
  EXPECT_GT(result.preemptions, 0);
  for (const SimRequest& request : requests) {
    const SimRequestResult& out = result.requests.at(request.seq_id);
    EXPECT_EQ(out.finish_reason, FinishReason::kLength) << request.seq_id;
    EXPECT_EQ(out.tokens, ExpectedTokens(sim, request.seq_id, 30)) << request.seq_id;
  }
}

TEST(RingSimTest, CancellationFreesBlocksAndOthersFinish) {
  Scheduler scheduler(Options(2));
  std::vector<SimRequest> requests = Requests(6, 20, 40);
  requests[1].cancel_time = 0.5;   // during its prefill
  requests[3].cancel_time = 10.3;  // while decoding, likely in flight
  requests[5].cancel_time = 25.0;
  RingSimOptions sim = Costs(2, 1.0, 0.01);
  SimResult result = SimulateRing(scheduler, sim, requests);
  ExpectClean(result);
  for (const SimRequest& request : requests) {
    const SimRequestResult& out = result.requests.at(request.seq_id);
    if (request.cancel_time >= 0) {
      EXPECT_EQ(out.finish_reason, FinishReason::kCancelled);
      EXPECT_LT(out.tokens.size(), 40u);
    } else {
      EXPECT_EQ(out.tokens, ExpectedTokens(sim, request.seq_id, 40));
    }
  }
}

// Random rings, policies, caches and requests (half of them sharing prompt prefixes, prefix
// caching on in most runs), with cancellations and preemption.
TEST(RingSimTest, RandomStressKeepsInvariantsAndFinishesEveryRequest) {
  constexpr int32_t kEos = 0;
  int64_t prefix_hits = 0;
  for (uint32_t seed = 1; seed <= 40; ++seed) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    std::mt19937 rng(seed);
    auto uniform = [&](int low, int high) {
      return std::uniform_int_distribution<int>(low, high)(rng);
    };
    SchedulerOptions options;
    options.num_stages = uniform(1, 4);
    options.max_micro_batches_in_flight = options.num_stages + uniform(0, options.num_stages);
    options.decode_packing = uniform(0, 1) ? DecodePacking::kSpread : DecodePacking::kPacked;
    options.kv_block_size = std::vector<int>{1, 2, 4, 16}[uniform(0, 3)];
    options.kv_num_blocks = uniform(64, 512) / options.kv_block_size + 2;
    options.max_tokens_per_micro_batch = uniform(4, 256);
    options.max_running_sequences = uniform(2, 64);
    options.eos_token_ids = {kEos};
    options.prefix_caching = uniform(0, 3) != 0;
    const int capacity = options.kv_num_blocks * options.kv_block_size;

    RingSimOptions sim = Costs(options.num_stages, 1.0, 0.01 * uniform(0, 5), 0.1 * uniform(0, 3));
    sim.sample = [](uint64_t seq_id, int32_t index) {
      uint64_t h =
          (seq_id * 0x9e3779b97f4a7c15ull) ^ (static_cast<uint64_t>(index) * 0xbf58476d1ce4e5b9ull);
      h ^= h >> 29;
      return h % 17 == 0 ? kEos : static_cast<int32_t>(1 + h % 1000);
    };
    std::vector<SimRequest> requests;
    const int count = uniform(20, 40);
    for (int i = 0; i < count; ++i) {
      SimRequest request;
      request.seq_id = 1000 + i;
      request.arrival_time = uniform(0, 200);
      request.prompt.resize(std::min(uniform(1, 120), capacity));
      for (int32_t& token : request.prompt) token = uniform(1, 1000);
      // Half the requests share a prefix with an earlier one (a system prompt, a chat turn).
      if (i > 0 && uniform(0, 1) == 1) {
        const std::vector<int32_t>& earlier = requests[uniform(0, i - 1)].prompt;
        const size_t shared = std::min(earlier.size(), request.prompt.size());
        std::copy(earlier.begin(), earlier.begin() + uniform(0, static_cast<int>(shared)),
                  request.prompt.begin());
      }
      request.params.max_tokens = uniform(1, 40);
      request.params.ignore_eos = uniform(0, 9) == 0;
      if (uniform(0, 4) == 0) request.cancel_time = request.arrival_time + uniform(0, 100);
      requests.push_back(std::move(request));
    }
    Scheduler scheduler(options);
    SimResult result = SimulateRing(scheduler, sim, requests);
    ExpectClean(result);
    if (!result.violations.empty()) break;
    prefix_hits += scheduler.Stats().prefix_hit_tokens;
    for (const SimRequest& request : requests) {
      const SimRequestResult& out = result.requests.at(request.seq_id);
      const int limit = std::min<int>(request.params.max_tokens,
                                      capacity - static_cast<int>(request.prompt.size()) + 1);
      // What the request must produce if it runs to its end.
      std::vector<int32_t> expected;
      FinishReason reason = FinishReason::kLength;
      for (int i = 0; i < limit; ++i) {
        expected.push_back(sim.sample(request.seq_id, i));
        if (expected.back() == kEos && !request.params.ignore_eos) {
          reason = FinishReason::kStop;
          break;
        }
      }
      if (out.finish_reason == FinishReason::kCancelled) {
        ASSERT_GE(request.cancel_time, 0) << request.seq_id;
        ASSERT_LE(out.tokens.size(), expected.size());
        EXPECT_TRUE(std::equal(out.tokens.begin(), out.tokens.end(), expected.begin()));
      } else {
        EXPECT_EQ(out.finish_reason, reason) << request.seq_id;
        EXPECT_EQ(out.tokens, expected) << request.seq_id;
      }
    }
  }
  EXPECT_GT(prefix_hits, 0);  // the shared prefixes were found in the cache
}

}  // namespace
}  // namespace ringserve
