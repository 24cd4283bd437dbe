// `ringserve_plan_ahead_model`: decode throughput of the real Scheduler with and without
// plan-ahead (coordinator/plan_ahead.h) in a small discrete-event ring, in units of one stage's
// step. CPU only; a check of the scheduler's ordering, not a prediction of any GPU.
//
// Model: S stages, each takes 1 unit per plan, FIFO; a plan goes stage to stage at once. Without
// plan-ahead the coordinator gets a plan's tokens `reply` units after the last stage finished it
// and plans at once; with it, stage 0 starts a follow-up once its base has left the last stage
// plus `back_edge` units (the tokens' trip), and the coordinator plans from the results as
// before. Requests: `streams` at once, 128-token prompts, 200 output tokens each; the run ends
// after 150 tokens a stream. Prints tokens per unit for S = 4, M = 1 and 4 micro-batches in
// flight, 1/8/64 streams, reply 0.1 and 0.5 units (the bound is streams / S per unit for M = S,
// streams / (S + reply or back edge) for M = 1).
#include <algorithm>
#include <cstdio>
#include <map>
#include <vector>

#include "coordinator/scheduler/scheduler.h"

namespace ringserve {
namespace {

constexpr int kStages = 4;
constexpr double kBackEdge = 0.02;

double TokensPerUnit(bool plan_ahead, int streams, int micro_batches, double reply) {
  SchedulerOptions options;
  options.num_stages = kStages;
  options.max_micro_batches_in_flight = micro_batches;
  options.kv_num_blocks = 4096;
  options.kv_block_size = 16;
  options.prefix_caching = false;
  options.plan_ahead = plan_ahead;
  Scheduler scheduler(options);
  for (int i = 1; i <= streams; ++i) {
    SequenceParams params;
    params.max_tokens = 200;
    params.ignore_eos = true;
    if (!scheduler.AddRequest(i, std::vector<int32_t>(128, 5 + i), params).ok()) return 0;
  }
  std::vector<double> stage_free(kStages, 0);
  std::map<uint64_t, double> finished;                  // plan -> when it left the last stage
  std::multimap<double, MicroBatchPlan> replies;        // when the coordinator gets a plan's tokens
  std::vector<std::pair<MicroBatchPlan, double>> sent;  // in order, with when it was sent
  size_t next = 0;
  double now = 0;
  int64_t tokens = 0;
  auto plan = [&](double t) {
    while (std::optional<MicroBatchPlan> p = scheduler.NextMicroBatch()) sent.push_back({*p, t});
  };
  plan(0);
  while (tokens < static_cast<int64_t>(streams) * 150) {
    // Every stage runs plans in order; a follow-up waits for its base's tokens at stage 0.
    for (; next < sent.size(); ++next) {
      const MicroBatchPlan& p = sent[next].first;
      double t = std::max(stage_free[0], sent[next].second);
      if (p.tokens_from != 0) {
        auto base = finished.find(p.tokens_from);
        if (base == finished.end()) break;
        t = std::max(t, base->second + kBackEdge);
      }
      for (int s = 0; s < kStages; ++s) stage_free[s] = t = std::max(t, stage_free[s]) + 1.0;
      finished[p.id] = t;
      replies.insert({t + reply, p});
    }
    if (replies.empty()) return 0;  // nothing can run: a scheduler bug
    auto first = replies.begin();
    now = first->first;
    const MicroBatchPlan done = first->second;
    replies.erase(first);
    absl::StatusOr<MicroBatchResult> result =
        scheduler.OnMicroBatchDone(done.id, std::vector<int32_t>(done.num_sampled(), 7));
    if (!result.ok()) return 0;
    tokens += static_cast<int64_t>(result->tokens.size());
    plan(now);
  }
  return static_cast<double>(tokens) / now;
}

}  // namespace
}  // namespace ringserve

int main() {
  std::printf("| micro-batches | streams | reply | synchronous | plan-ahead |\n");
  std::printf("| ---: | ---: | ---: | ---: | ---: |\n");
  for (int micro_batches : {1, 4}) {
    for (int streams : {1, 8, 64}) {
      for (double reply : {0.1, 0.5}) {
        std::printf("| %d | %d | %.1f | %.3f | %.3f |\n", micro_batches, streams, reply,
                    ringserve::TokensPerUnit(false, streams, micro_batches, reply),
                    ringserve::TokensPerUnit(true, streams, micro_batches, reply));
      }
    }
  }
  return 0;
}
