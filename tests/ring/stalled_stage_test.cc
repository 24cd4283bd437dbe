// Stages that stop working without dying, on a real 2-stage CPU ring (processes on loopback):
//   - a stage that no longer reads its input while its process answers (a wedged executor, a
//     cut activation path): the coordinator's progress watchdog fails the ring within
//     --stall_timeout instead of the step timeout (two minutes), the stage is freed, and the
//     request resumes with exactly the tokens of an undisturbed run;
//   - a stage whose steps take longer than --stall_timeout but compute is not a stall;
//   - a stopped stage (SIGSTOP): requests in flight fail with an error naming the failure once
//     the ring has been down for --ring_down_timeout, and the ring serves again once the stage
//     continues.
#include <signal.h>

#include <thread>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/ring/reference.h"
#include "tests/ring/ring_harness.h"

namespace ringserve::testing {
namespace {

namespace v1 = ::ringserve::v1;
using ::testing::HasSubstr;

TEST(RingStalledStageTest, StageThatStopsReadingIsFoundByTheWatchdogAndTheRequestResumes) {
  const std::string model = FixtureModel("llama");
  auto reference = Reference::Load(model);
  ASSERT_TRUE(reference.ok()) << reference.status();
  const std::vector<int32_t> prompt = {5, 6, 7, 8};
  constexpr int kMaxTokens = 12;
  auto want = (*reference)->Generate(prompt, kMaxTokens);
  ASSERT_TRUE(want.ok()) << want.status();
  // The last stage stops reading after every 5 steps of a ring (until the ring is closed);
  // the step timeout stays at its two minutes.
  auto ring = Ring::Start({.model_dir = model,
                           .partition = {2, 2},
                           .coordinator_args = {"--stall_timeout", "3"},
                           .stage_args = {{}, {"--debug_stall_after_steps", "5"}}});
  ASSERT_TRUE(ring.ok()) << ring.status();

  const absl::Time start = absl::Now();
  Generation got = (*ring)->Generate(IdsRequest(prompt, kMaxTokens));
  const absl::Duration took = absl::Now() - start;
  ASSERT_TRUE(got.status.ok()) << got.status.error_message() << "\n" << (*ring)->CoordinatorLog();
  EXPECT_EQ(got.tokens, *want);
  // Two stalls, each found after 3 s; far below the step timeout.
  EXPECT_LT(took, absl::Seconds(45)) << (*ring)->CoordinatorLog();
  const std::string log = (*ring)->CoordinatorLog();
  EXPECT_THAT(log, HasSubstr("the ring made no progress for 3"));
  EXPECT_THAT(log, HasSubstr("receiving micro-batch"));
  auto stats = (*ring)->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_GE(stats->ring_restarts(), 2) << log;
}

TEST(RingStalledStageTest, StepsLongerThanTheStallTimeoutAreNoStall) {
  // Every step of the last stage takes 4 s (a long prefill on a slow CPU), twice the stall
  // timeout: it computes all along, so the ring never fails.
  auto ring = Ring::Start({.model_dir = FixtureModel("llama"),
                           .partition = {2, 2},
                           .coordinator_args = {"--stall_timeout", "2"},
                           .stage_args = {{}, {"--debug_step_delay_ms", "4000"}}});
  ASSERT_TRUE(ring.ok()) << ring.status();
  Generation got = (*ring)->Generate(IdsRequest({5, 6, 7}, 3));
  ASSERT_TRUE(got.status.ok()) << got.status.error_message() << "\n" << (*ring)->CoordinatorLog();
  EXPECT_EQ(got.tokens.size(), 3u);
  auto stats = (*ring)->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->ring_restarts(), 0) << (*ring)->CoordinatorLog();
}

TEST(RingStalledStageTest, StoppedStageFailsRequestsWithTheReasonAndTheRingComesBack) {
  auto ring =
      Ring::Start({.model_dir = FixtureModel("llama"),
                   .partition = {2, 2},
                   .stage_step_delay_ms = 10,
                   .coordinator_args = {"--ring_down_timeout", "2", "--connect_timeout", "2"}});
  ASSERT_TRUE(ring.ok()) << ring.status();
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  auto reader = (*ring)->stub().Generate(&context, IdsRequest({5, 6, 7}, 200));
  v1::GenerateResponse response;
  ASSERT_TRUE(reader->Read(&response));
  const pid_t stopped = (*ring)->stage_process(1).pid();
  ASSERT_EQ(kill(stopped, SIGSTOP), 0);
  const absl::Time start = absl::Now();
  while (reader->Read(&response)) {
  }
  grpc::Status status = reader->Finish();
  const absl::Duration took = absl::Now() - start;
  ASSERT_EQ(kill(stopped, SIGCONT), 0);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  // Found by the keepalive within seconds; then 2 s down and one 2 s attempt to re-form.
  EXPECT_LT(took, absl::Seconds(30)) << (*ring)->CoordinatorLog();
  EXPECT_THAT(status.error_message(), HasSubstr("the ring has been down for"));
  EXPECT_THAT(status.error_message(), HasSubstr("it failed: stage 1"));

  // Continued, the stage is taken into the ring again and the ring serves (until then a new
  // request is refused at once: the ring is down; retried as a client would, after a pause).
  Generation after;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (true) {
    after = (*ring)->Generate(IdsRequest({5, 6, 7}, 4));
    if (after.status.ok() || absl::Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  ASSERT_TRUE(after.status.ok()) << after.status.error_message() << "\n"
                                 << (*ring)->CoordinatorLog();
  EXPECT_EQ(after.tokens.size(), 4u);
}

}  // namespace
}  // namespace ringserve::testing
