// Stage failures under load: a 3-stage CPU ring serving 16 concurrent streams has a random
// stage killed (SIGKILL) three times and started again on its port, as systemd would. Every
// request must finish with exactly the tokens of an undisturbed run (nothing lost, nothing
// repeated on the client's stream), and nothing may hang.
#include <signal.h>

#include <atomic>
#include <random>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/ring/reference.h"
#include "tests/ring/ring_harness.h"

namespace ringserve::testing {
namespace {

namespace v1 = ::ringserve::v1;

TEST(RingChaosTest, KilledStagesLoseNoTokenUnderSixteenStreams) {
  const std::string model = FixtureModel("llama");
  auto reference = Reference::Load(model);
  ASSERT_TRUE(reference.ok()) << reference.status();
  auto ring = Ring::Start({.model_dir = model,
                           .partition = {2, 1, 1},
                           .micro_batches_in_flight = 3,
                           .max_tokens_per_micro_batch = 64,
                           .stage_step_delay_ms = 4});
  ASSERT_TRUE(ring.ok()) << ring.status();

  const unsigned seed = std::random_device{}();
  std::mt19937 rng(seed);
  constexpr int kStreams = 16;
  std::vector<v1::GenerateRequest> requests;
  std::vector<std::vector<int32_t>> expected;
  for (int i = 0; i < kStreams; ++i) {
    std::vector<int32_t> prompt(std::uniform_int_distribution<int>(3, 40)(rng));
    for (auto& t : prompt) t = std::uniform_int_distribution<int32_t>(3, 500)(rng);
    const int max_tokens = std::uniform_int_distribution<int>(40, 70)(rng);
    auto want = (*reference)->Generate(prompt, max_tokens);
    ASSERT_TRUE(want.ok()) << want.status();
    expected.push_back(*want);
    requests.push_back(IdsRequest(prompt, max_tokens));
    requests.back().set_request_id("chaos-" + std::to_string(i));
  }

  std::vector<Generation> got(kStreams);
  std::vector<std::thread> clients;
  for (int i = 0; i < kStreams; ++i) {
    clients.emplace_back([&, i] { got[i] = (*ring)->Generate(requests[i]); });
  }
  // Three kills, spread over the run; each stage comes back after a short outage.
  for (int kill_number = 0; kill_number < 3; ++kill_number) {
    absl::SleepFor(absl::Milliseconds(400));
    const int victim = std::uniform_int_distribution<int>(0, (*ring)->num_stages() - 1)(rng);
    ASSERT_EQ(kill((*ring)->stage_process(victim).pid(), SIGKILL), 0);
    absl::SleepFor(absl::Milliseconds(150));
    ASSERT_TRUE((*ring)->RestartStage(victim).ok()) << "seed " << seed;
  }
  for (auto& t : clients) t.join();

  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(got[i].status.ok())
        << "request " << i << " (seed " << seed << "): " << got[i].status.error_message() << "\n"
        << (*ring)->CoordinatorLog();
    EXPECT_EQ(got[i].tokens, expected[i]) << "request " << i << " (seed " << seed << ")";
  }
  auto stats = (*ring)->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_GE(stats->ring_restarts(), 1) << (*ring)->CoordinatorLog();
  EXPECT_EQ(stats->requests_finished(), kStreams);
}

// A stage that dies and does not come back: the running request fails with a clear error once
// the ring has been down for the coordinator's bound, instead of hanging.
TEST(RingChaosTest, StageThatStaysDownFailsRequestsAfterTheBound) {
  auto ring = Ring::Start({.model_dir = FixtureModel("llama"),
                           .partition = {1, 2, 1},
                           .stage_step_delay_ms = 10,
                           .coordinator_args = {"--ring_down_timeout", "3"}});
  ASSERT_TRUE(ring.ok()) << ring.status();
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto reader = (*ring)->stub().Generate(&context, IdsRequest({5, 6, 7}, 250));
  v1::GenerateResponse response;
  ASSERT_TRUE(reader->Read(&response));
  absl::Time start = absl::Now();
  kill((*ring)->stage_process(1).pid(), SIGKILL);
  while (reader->Read(&response)) {
  }
  grpc::Status status = reader->Finish();
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  EXPECT_THAT(status.error_message(), ::testing::HasSubstr("ring"));
}

}  // namespace
}  // namespace ringserve::testing
