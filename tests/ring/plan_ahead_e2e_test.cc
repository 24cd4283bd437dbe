// Plans sent ahead (coordinator --plan_ahead, coordinator/plan_ahead.h) through real CPU rings
// of 1 to 4 stage processes on the trained demo model: greedy and seeded sampled requests get
// the same tokens and text with and without plan-ahead, while other requests in the same
// batches stop early by a stop string, by max_tokens and by cancellation.
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/ring/ring_harness.h"

namespace ringserve::testing {
namespace {

namespace v1 = ringserve::v1;

v1::GenerateRequest TextRequest(const std::string& text, int max_tokens, int seed = -1) {
  v1::GenerateRequest request;
  request.set_text(text);
  request.mutable_sampling()->set_max_tokens(max_tokens);
  if (seed >= 0) {
    request.mutable_sampling()->set_temperature(0.8f);
    request.mutable_sampling()->set_top_p(0.9f);
    request.mutable_sampling()->set_seed(seed);
  }
  return request;
}

struct RingRun {
  std::vector<Generation> full;  // requests that run to their end, in order
  Generation cancelled;          // cancelled after its third message
  int64_t ahead_decodes = 0;
  int64_t ahead_discarded = 0;
  int64_t preemptions = 0;
};

// Reads `request` until its third message, then cancels it.
Generation GenerateAndCancel(Ring& ring, const v1::GenerateRequest& request) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto reader = ring.stub().Generate(&context, request);
  Generation out;
  v1::GenerateResponse response;
  while (out.events < 3 && reader->Read(&response)) {
    out.events++;
    out.tokens.insert(out.tokens.end(), response.token_ids().begin(), response.token_ids().end());
  }
  context.TryCancel();
  while (reader->Read(&response)) {
  }
  out.status = reader->Finish();
  return out;
}

RingRun RunRing(const std::vector<int>& partition, bool plan_ahead,
                const std::vector<v1::GenerateRequest>& requests,
                const std::optional<v1::GenerateRequest>& to_cancel, int kv_blocks = 0) {
  RingRun run;
  auto ring =
      Ring::Start({.model_dir = SourceDir() + "/models/ringserve-tiny",
                   .partition = partition,
                   .kv_blocks = kv_blocks,
                   .coordinator_args = {plan_ahead ? "--plan_ahead=true" : "--plan_ahead=false"}});
  EXPECT_TRUE(ring.ok()) << ring.status();
  if (!ring.ok()) return run;
  run.full.resize(requests.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < requests.size(); ++i) {
    threads.emplace_back([&, i] { run.full[i] = (*ring)->Generate(requests[i]); });
  }
  if (to_cancel) {
    threads.emplace_back([&] { run.cancelled = GenerateAndCancel(**ring, *to_cancel); });
  }
  for (auto& t : threads) t.join();
  auto stats = (*ring)->SettledStats();
  EXPECT_TRUE(stats.ok()) << stats.status();
  if (stats.ok()) {
    run.ahead_decodes = stats->ahead_decodes();
    run.ahead_discarded = stats->ahead_discarded();
    run.preemptions = stats->preemptions();
    EXPECT_EQ(stats->running(), 0);
  }
  return run;
}

TEST(PlanAheadE2ETest, SameOutputsWithAndWithoutPlanAheadAcrossPartitions) {
  std::vector<v1::GenerateRequest> requests = {
      TextRequest("And God said unto Moses,", 40),                 // greedy
      TextRequest("In the beginning", 40, /*seed=*/7),             // seeded sampling
      TextRequest("The LORD is my shepherd;", 3),                  // stops early: max_tokens
      TextRequest("And it came to pass,", 36, /*seed=*/11),        // seeded, a stop string below
      TextRequest("ABSURDITY, n. A statement or belief", 30, 3)};  // seeded
  const v1::GenerateRequest to_cancel = TextRequest("And God said unto Moses,", 200);

  // The reference: one stage, plans made once each step's tokens are back.
  RingRun reference = RunRing({8}, false, requests, to_cancel);
  ASSERT_EQ(reference.full.size(), requests.size());
  for (const Generation& g : reference.full) ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(reference.ahead_decodes, 0);
  // Request 3 stops at a stop string taken from the middle of its own text.
  const std::string text = reference.full[3].text;  // a copy: `reference` is run again
  ASSERT_GT(text.size(), 20u) << text;
  const std::string stop = text.substr(text.size() / 2, 4);
  requests[3].mutable_sampling()->add_stop(stop);
  reference = RunRing({8}, false, requests, to_cancel);
  ASSERT_EQ(reference.full[3].finish_reason, v1::FINISH_REASON_STOP);
  EXPECT_EQ(reference.full[3].text, text.substr(0, text.find(stop)));
  EXPECT_EQ(reference.full[2].tokens.size(), 3u);

  for (const auto& [partition, plan_ahead] :
       std::vector<std::pair<std::vector<int>, bool>>{{{8}, true},
                                                      {{4, 4}, true},
                                                      {{3, 3, 2}, true},
                                                      {{2, 2, 2, 2}, true},
                                                      {{2, 2, 2, 2}, false}}) {
    SCOPED_TRACE(::testing::Message()
                 << partition.size() << " stage(s), plan-ahead " << (plan_ahead ? "on" : "off"));
    RingRun run = RunRing(partition, plan_ahead, requests, to_cancel);
    ASSERT_EQ(run.full.size(), requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      ASSERT_TRUE(run.full[i].status.ok()) << i << ": " << run.full[i].status.error_message();
      EXPECT_EQ(run.full[i].tokens, reference.full[i].tokens) << "request " << i;
      EXPECT_EQ(run.full[i].text, reference.full[i].text) << "request " << i;
      EXPECT_EQ(run.full[i].finish_reason, reference.full[i].finish_reason) << "request " << i;
    }
    // The cancelled request got a prefix of its greedy text (the same prompt as request 0).
    EXPECT_EQ(run.cancelled.status.error_code(), grpc::StatusCode::CANCELLED);
    ASSERT_LE(run.cancelled.tokens.size(), reference.full[0].tokens.size());
    EXPECT_TRUE(std::equal(run.cancelled.tokens.begin(), run.cancelled.tokens.end(),
                           reference.full[0].tokens.begin()));
    if (plan_ahead) {
      EXPECT_GT(run.ahead_decodes, 0);
      // One stage plans every decoding sequence ahead each step, so request 3, which the
      // coordinator stops at its stop string, has one token discarded (max_tokens is known in
      // advance and wastes none).
      if (partition.size() == 1) {
        EXPECT_GE(run.ahead_discarded, 1);
      }
    } else {
      EXPECT_EQ(run.ahead_decodes, 0);
    }
  }
}

// A KV cache too small for every request at once: sequences are preempted (by recompute) while
// decodes of theirs are planned ahead, and still get the tokens they get without plan-ahead.
TEST(PlanAheadE2ETest, PreemptionUnderAFullCacheKeepsOutputsExact) {
  std::vector<v1::GenerateRequest> requests;
  const char* prompts[] = {"And God said", "In the beginning",    "The LORD is",
                           "Blessed are",  "And it came to pass", "ABSURDITY, n."};
  for (int i = 0; i < 6; ++i) {
    requests.push_back(TextRequest(prompts[i], 90, i % 2 == 0 ? -1 : 20 + i));
    requests.back().mutable_sampling()->set_ignore_eos(true);
  }
  // 12 blocks of 16 positions: room for two of the six requests' ~100 positions at a time.
  RingRun sync = RunRing({4, 4}, false, requests, std::nullopt, /*kv_blocks=*/12);
  RingRun ahead = RunRing({4, 4}, true, requests, std::nullopt, /*kv_blocks=*/12);
  ASSERT_EQ(sync.full.size(), requests.size());
  ASSERT_EQ(ahead.full.size(), requests.size());
  EXPECT_GT(ahead.preemptions, 0);
  EXPECT_GT(ahead.ahead_decodes, 0);
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(sync.full[i].status.ok()) << sync.full[i].status.error_message();
    ASSERT_TRUE(ahead.full[i].status.ok()) << ahead.full[i].status.error_message();
    EXPECT_EQ(sync.full[i].tokens.size(), 90u);
    EXPECT_EQ(ahead.full[i].tokens, sync.full[i].tokens) << "request " << i;
  }
}

}  // namespace
}  // namespace ringserve::testing
