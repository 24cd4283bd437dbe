// The engine loop against an in-process ring (FakeRingLink): outputs, stage failures with and
// without recovery, cancellation, preemption and statistics. No processes, no network.
#include "coordinator/ring_engine.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>

#include "coordinator/testing/fake_ring_link.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ringserve {
namespace {

constexpr int kVocab = 97;

// Collects every request's events; waits (bounded) for them to finish.
class Collector {
 public:
  Engine::EventCallback For(const std::string& id) {
    return [this, id](const GenerateEvent& event) {
      std::lock_guard<std::mutex> lock(mu_);
      Result& r = results_[id];
      r.tokens.insert(r.tokens.end(), event.token_ids.begin(), event.token_ids.end());
      if (event.finished) {
        ++r.finished_events;
        r.reason = event.finish_reason;
        r.error = event.error;
      }
      cv_.notify_all();
    };
  }
  struct Result {
    std::vector<int32_t> tokens;
    int finished_events = 0;
    FinishReason reason = FinishReason::kNone;
    absl::Status error;
  };
  bool WaitAll(const std::vector<std::string>& ids) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10), [&] {
      for (const auto& id : ids) {
        if (results_[id].finished_events == 0) return false;
      }
      return true;
    });
  }
  Result Get(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    return results_[id];
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Result> results_;
};

// What an undisturbed ring generates for `prompt` (greedy over the fake model).
std::vector<int32_t> Expected(const std::vector<int32_t>& prompt, int max_tokens) {
  std::vector<int32_t> out;
  int32_t token = prompt.back();
  int32_t position = static_cast<int32_t>(prompt.size()) - 1;
  for (int i = 0; i < max_tokens; ++i) {
    token = FakeNextToken(token, position++, kVocab);
    out.push_back(token);
  }
  return out;
}

std::vector<int32_t> Prompt(int i) {
  std::vector<int32_t> prompt;
  for (int j = 0; j < 3 + i % 7; ++j) prompt.push_back((i * 13 + j * 5 + 1) % kVocab);
  return prompt;
}

struct Harness {
  std::atomic<int> formed{0};  // rings formed so far
  std::atomic<int> closed{0};  // rings the engine has closed
  std::atomic<int> attempts{0};
  std::atomic<int> failing_attempts{0};       // re-form attempts (>= 1) that fail first
  std::vector<FakeRingOptions> ring_options;  // per formed ring; the last repeats

  RingEngineOptions Options(int kv_blocks = 64, bool recover = true) {
    RingEngineOptions options;
    options.model_id = "fake";
    options.model.vocab_size = kVocab;
    options.model.num_layers = 4;
    options.model.max_position_embeddings = 4096;
    options.scheduler.num_stages = 2;
    options.scheduler.kv_block_size = 4;
    options.scheduler.max_tokens_per_micro_batch = 32;
    options.scheduler.plan_ahead = true;  // as the coordinator runs by default
    options.recover = recover;
    options.reform_backoff = absl::Milliseconds(1);
    options.stages = {{"fake:0", 0, 2}, {"fake:1", 2, 4}};
    options.form_ring = [this, kv_blocks](int attempt) -> absl::StatusOr<FormedRing> {
      attempts++;
      if (attempt > 0 && attempt <= failing_attempts) {
        return absl::UnavailableError("stage 1 is still down");
      }
      FakeRingOptions ring = ring_options[std::min<size_t>(formed++, ring_options.size() - 1)];
      ring.on_close = [this] { closed++; };
      return FormedRing{.link = std::make_unique<FakeRingLink>(ring), .kv_num_blocks = kv_blocks};
    };
    return options;
  }
};

// Polls `done` until it holds (bounded: 10 s).
bool WaitFor(const std::function<bool()>& done) {
  for (int i = 0; i < 2000; ++i) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return done();
}

// Opens a fault gate when it goes out of scope (declare it after the engine), so that a test
// that stops early does not leave the engine's loop waiting on it.
struct OpenAtExit {
  std::shared_ptr<absl::Notification> gate;
  ~OpenAtExit() {
    if (!gate->HasBeenNotified()) gate->Notify();
  }
};

GenerateRequest Request(const std::string& id, std::vector<int32_t> prompt, int max_tokens) {
  GenerateRequest request;
  request.request_id = id;
  request.prompt_ids = std::move(prompt);
  request.sampling.max_tokens = max_tokens;
  request.sampling.ignore_eos = true;
  return request;
}

TEST(RingEngineTest, GeneratesWhatTheRingSamplesForManyRequests) {
  Harness h;
  h.ring_options = {{.num_stages = 2, .vocab_size = kVocab}};
  auto engine = RingEngine::Start(h.Options());
  ASSERT_TRUE(engine.ok()) << engine.status();
  Collector c;
  std::vector<std::string> ids;
  for (int i = 0; i < 12; ++i) {
    ids.push_back("r" + std::to_string(i));
    ASSERT_TRUE((*engine)->Submit(Request(ids.back(), Prompt(i), 9), c.For(ids.back())).ok());
  }
  ASSERT_TRUE(c.WaitAll(ids));
  for (int i = 0; i < 12; ++i) {
    Collector::Result r = c.Get(ids[i]);
    EXPECT_EQ(r.reason, FinishReason::kLength) << ids[i];
    EXPECT_EQ(r.finished_events, 1);
    EXPECT_EQ(r.tokens, Expected(Prompt(i), 9)) << ids[i];
  }
  RingStats stats = (*engine)->Stats();
  EXPECT_EQ(stats.requests.requests_finished, 12);
  EXPECT_EQ(stats.requests.generated_tokens, 12 * 9);
  EXPECT_EQ(stats.requests.ring_restarts, 0);
  ASSERT_EQ(stats.stages.size(), 2u);
  EXPECT_GT(stats.stages[1].steps, 0);
}

TEST(RingEngineTest, StageErrorWithoutRecoveryFailsEveryRequestAndStops) {
  Harness h;
  auto gate = std::make_shared<absl::Notification>();
  // The stage error waits until all three requests are in: one submitted after it is refused.
  h.ring_options = {{.num_stages = 3,
                     .vocab_size = kVocab,
                     .fail_after_micro_batches = 4,
                     .fail_as_stage_error = true,
                     .fault_gate = gate}};
  auto engine = RingEngine::Start(h.Options(64, /*recover=*/false));
  ASSERT_TRUE(engine.ok()) << engine.status();
  OpenAtExit open_at_exit{gate};
  Collector c;
  std::vector<std::string> ids = {"a", "b", "c"};
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE((*engine)->Submit(Request(ids[i], Prompt(i), 50), c.For(ids[i])).ok());
  }
  gate->Notify();
  ASSERT_TRUE(c.WaitAll(ids));
  for (const auto& id : ids) {
    Collector::Result r = c.Get(id);
    EXPECT_EQ(r.reason, FinishReason::kError);
    EXPECT_THAT(std::string(r.error.message()), testing::HasSubstr("injected stage error"));
  }
  EXPECT_TRUE((*engine)->stopped());
  EXPECT_FALSE((*engine)->healthy());
  EXPECT_EQ((*engine)->Submit(Request("late", Prompt(1), 4), c.For("late")).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_TRUE(WaitFor([&] { return h.closed == 1; }));
}

TEST(RingEngineTest, RingFailureResumesEveryRequestWithTheUndisturbedTokens) {
  for (bool stage_error : {false, true}) {
    Harness h;
    auto gate = std::make_shared<absl::Notification>();
    // The first ring fails after 7 micro-batches, the second after 5 more; the third holds. The
    // first failure waits until all six requests are in: one submitted while the ring is down
    // is refused (NewRequestsAreRefusedAtOnceWhileTheRingIsDownAndRunningOnesResume).
    h.ring_options = {{.num_stages = 2,
                       .vocab_size = kVocab,
                       .fail_after_micro_batches = 7,
                       .fail_as_stage_error = stage_error,
                       .fault_gate = gate},
                      {.num_stages = 2, .vocab_size = kVocab, .fail_after_micro_batches = 5},
                      {.num_stages = 2, .vocab_size = kVocab}};
    h.failing_attempts = 2;  // the first two re-forms find a stage still down
    auto engine = RingEngine::Start(h.Options());
    ASSERT_TRUE(engine.ok()) << engine.status();
    OpenAtExit open_at_exit{gate};
    Collector c;
    std::vector<std::string> ids;
    for (int i = 0; i < 6; ++i) {
      ids.push_back("r" + std::to_string(i));
      ASSERT_TRUE((*engine)->Submit(Request(ids.back(), Prompt(i), 20), c.For(ids.back())).ok());
    }
    gate->Notify();
    ASSERT_TRUE(c.WaitAll(ids)) << "stage_error " << stage_error;
    for (int i = 0; i < 6; ++i) {
      Collector::Result r = c.Get(ids[i]);
      EXPECT_EQ(r.reason, FinishReason::kLength) << ids[i] << ": " << r.error;
      EXPECT_EQ(r.tokens, Expected(Prompt(i), 20)) << ids[i];
    }
    RingStats stats = (*engine)->Stats();
    EXPECT_EQ(stats.requests.ring_restarts, 2);
    EXPECT_GT(stats.requests.resumed_requests, 0);
    EXPECT_EQ(stats.requests.requests_failed, 0);
    EXPECT_EQ(h.formed.load(), 3);
    EXPECT_EQ(h.attempts.load(), 5);  // start, fail, fail, ok (ring 2), then ring 3 at once
    EXPECT_TRUE(WaitFor([&] { return h.closed == 2; }));  // the two failed rings
    EXPECT_TRUE((*engine)->healthy());
  }
}

TEST(RingEngineTest, NewRequestsAreRefusedAtOnceWhileTheRingIsDownAndRunningOnesResume) {
  Harness h;
  h.ring_options = {{.num_stages = 2, .vocab_size = kVocab, .fail_after_micro_batches = 0},
                    {.num_stages = 2, .vocab_size = kVocab}};
  h.failing_attempts = 1 << 30;  // stays down until the test lets it up
  auto engine = RingEngine::Start(h.Options());
  ASSERT_TRUE(engine.ok()) << engine.status();
  Collector c;
  ASSERT_TRUE((*engine)->Submit(Request("a", Prompt(0), 5), c.For("a")).ok());  // fails the ring
  ASSERT_TRUE(WaitFor([&] { return !(*engine)->healthy(); }));
  EXPECT_THAT((*engine)->health_message(), testing::HasSubstr("recovering"));
  absl::Status refused = (*engine)->Submit(Request("b", Prompt(1), 5), c.For("b"));
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_THAT(refused.message(), testing::HasSubstr("request b: the ring is down and re-forming"));
  EXPECT_THAT(refused.message(), testing::HasSubstr("retry later"));
  EXPECT_EQ((*engine)->Stats().requests.rejected, 1);
  // A later choice of a running request joins it and waits.
  GenerateRequest choice = Request("a#1", Prompt(2), 5);
  choice.later_choice = true;
  ASSERT_TRUE((*engine)->Submit(std::move(choice), c.For("a#1")).ok());
  h.failing_attempts = 0;  // the stage is back
  ASSERT_TRUE(c.WaitAll({"a", "a#1"}));
  EXPECT_EQ(c.Get("a").tokens, Expected(Prompt(0), 5));
  EXPECT_EQ(c.Get("a#1").tokens, Expected(Prompt(2), 5));
  EXPECT_EQ(c.Get("b").finished_events, 0);  // refused: no callback
  ASSERT_TRUE((*engine)->healthy());
  ASSERT_TRUE((*engine)->Submit(Request("b", Prompt(1), 5), c.For("b")).ok());  // the retry
  ASSERT_TRUE(c.WaitAll({"b"}));
  EXPECT_EQ(c.Get("b").tokens, Expected(Prompt(1), 5));
}

// A re-formed ring that fails validation (no KV blocks) while one of its streams ends: the
// engine closes that link outside its lock. Closing takes the link's lock and waits for its
// stream readers, and a reader reporting the end holds the link's lock while its handler waits
// for the engine's: closed under the engine's lock, the two threads deadlocked.
TEST(RingEngineTest, ALinkThatFailsToInstallIsClosedOutsideTheEngineLock) {
  Harness h;
  auto deadlocks = std::make_shared<std::atomic<int>>(0);
  std::atomic<int> bad_closed{0};
  RingEngineOptions options = h.Options();
  options.form_ring = [&](int attempt) -> absl::StatusOr<FormedRing> {
    h.attempts++;
    FakeRingOptions ring{.num_stages = 2, .vocab_size = kVocab};
    if (attempt == 0) ring.fail_after_micro_batches = 3;  // the ring fails once
    if (attempt == 1) {  // the first re-formed ring: no KV blocks, and a stream ends meanwhile
      ring.stream_ends_on_close = true;
      ring.close_deadlocks = deadlocks;
      ring.on_close = [&] { bad_closed++; };
      return FormedRing{.link = std::make_unique<FakeRingLink>(ring), .kv_num_blocks = 0};
    }
    return FormedRing{.link = std::make_unique<FakeRingLink>(ring), .kv_num_blocks = 64};
  };
  auto engine = RingEngine::Start(std::move(options));
  ASSERT_TRUE(engine.ok()) << engine.status();
  Collector c;
  ASSERT_TRUE((*engine)->Submit(Request("a", Prompt(0), 12), c.For("a")).ok());
  ASSERT_TRUE(c.WaitAll({"a"}));
  EXPECT_EQ(c.Get("a").reason, FinishReason::kLength) << c.Get("a").error;
  EXPECT_EQ(c.Get("a").tokens, Expected(Prompt(0), 12));
  EXPECT_EQ(deadlocks->load(), 0) << "the link was closed under the engine's lock";
  EXPECT_EQ(bad_closed.load(), 1);
  EXPECT_EQ(h.attempts.load(), 3);  // start, the ring that did not install, the one that did
  EXPECT_TRUE((*engine)->healthy());
}

TEST(RingEngineTest, CancelFinishesOnlyThatRequest) {
  Harness h;
  h.ring_options = {{.num_stages = 2, .vocab_size = kVocab, .step_time = absl::Milliseconds(2)}};
  auto engine = RingEngine::Start(h.Options());
  ASSERT_TRUE(engine.ok()) << engine.status();
  Collector c;
  // "long" would need ~250 steps of 2 ms; "short" is done after a few.
  ASSERT_TRUE((*engine)->Submit(Request("long", Prompt(0), 4000), c.For("long")).ok());
  ASSERT_TRUE((*engine)->Submit(Request("short", Prompt(1), 6), c.For("short")).ok());
  ASSERT_TRUE(c.WaitAll({"short"}));
  (*engine)->Cancel("long");
  ASSERT_TRUE(c.WaitAll({"long"}));
  EXPECT_EQ(c.Get("long").reason, FinishReason::kCancelled);
  EXPECT_EQ(c.Get("short").tokens, Expected(Prompt(1), 6));
  EXPECT_EQ((*engine)->Stats().requests.requests_cancelled, 1);
}

TEST(RingEngineTest, PreemptionUnderAFullCacheKeepsOutputsExact) {
  Harness h;
  h.ring_options = {{.num_stages = 2, .vocab_size = kVocab}};
  auto engine = RingEngine::Start(h.Options(/*kv_blocks=*/12));  // 48 positions for 8 requests
  ASSERT_TRUE(engine.ok()) << engine.status();
  Collector c;
  std::vector<std::string> ids;
  for (int i = 0; i < 8; ++i) {
    ids.push_back("p" + std::to_string(i));
    ASSERT_TRUE((*engine)->Submit(Request(ids.back(), Prompt(i), 24), c.For(ids.back())).ok());
  }
  ASSERT_TRUE(c.WaitAll(ids));
  for (int i = 0; i < 8; ++i) EXPECT_EQ(c.Get(ids[i]).tokens, Expected(Prompt(i), 24)) << ids[i];
  EXPECT_GT((*engine)->Stats().requests.preemptions, 0);
}

TEST(RingEngineTest, RefusesBadRequestsSynchronously) {
  Harness h;
  h.ring_options = {{.num_stages = 2, .vocab_size = kVocab}};
  auto engine = RingEngine::Start(h.Options());
  ASSERT_TRUE(engine.ok()) << engine.status();
  Collector c;
  EXPECT_EQ((*engine)->Submit(Request("x", {}, 4), c.For("x")).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*engine)->Submit(Request("x", {kVocab}, 4), c.For("x")).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*engine)->Submit(Request("x", {1}, 0), c.For("x")).code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<int32_t> too_long(4096, 1);
  EXPECT_EQ((*engine)->Submit(Request("x", too_long, 4), c.For("x")).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ringserve
