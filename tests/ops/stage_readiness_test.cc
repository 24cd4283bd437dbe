// The readiness protocol of a real `stage` process under a service manager: started with
// NOTIFY_SOCKET pointing at a datagram socket this test owns, it reports progress but not
// READY=1 while it waits to be configured, and sends READY=1 only after the coordinator has
// configured it and its weights are loaded. An idle stage pings the watchdog.
#include <stdlib.h>

#include <chrono>

#include "coordinator/grpc_ring_engine.h"
#include "coordinator/subprocess.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "stage/notify/notify_listener.h"
#include "tests/ops/ops_ring.h"

namespace ringserve::ops {
namespace {

using std::chrono::milliseconds;

TEST(StageReadinessTest, ReadyOnlyAfterWeightsAreLoaded) {
  TempDir dir;
  absl::StatusOr<NotifyListener> listener = NotifyListener::Create(dir.path());
  ASSERT_TRUE(listener.ok()) << listener.status();
  absl::StatusOr<std::string> model_dir = MakeTestModel(dir.path());
  ASSERT_TRUE(model_dir.ok()) << model_dir.status();

  // The stage inherits NOTIFY_SOCKET, as systemd would set it.
  setenv("NOTIFY_SOCKET", listener->path().c_str(), 1);
  absl::StatusOr<Subprocess> stage = Subprocess::Spawn(
      {.argv = {BinaryDir() + "/stage/stage", "--listen", "127.0.0.1:0", "--ready-fd", "3"},
       .ready_fd = true,
       .stdout_path = "",
       .stderr_path = ""});
  unsetenv("NOTIFY_SOCKET");
  ASSERT_TRUE(stage.ok()) << stage.status();
  absl::StatusOr<std::string> address = stage->ReadReadyLine(absl::Seconds(30));
  ASSERT_TRUE(address.ok()) << address.status();

  // Listening and waiting to be configured: status updates, but not ready.
  std::optional<std::string> waiting = listener->Receive(milliseconds(10000));
  ASSERT_TRUE(waiting.has_value()) << "the stage sent no STATUS while waiting";
  std::vector<std::string> before = listener->Drain();
  before.insert(before.begin(), *waiting);
  for (const std::string& message : before) {
    EXPECT_FALSE(HasAssignment(message, "READY=1")) << "READY=1 before loading: " << message;
  }

  // Configure it (one-stage ring): Start returns once the stage has loaded its layers.
  size_t colon = address->rfind(':');
  RingConfig config;
  config.model_dir = *model_dir;
  config.num_layers = 4;
  config.grpc_listen = "127.0.0.1:0";
  config.stages.push_back({.host = address->substr(0, colon),
                           .control_port = std::stoi(address->substr(colon + 1)),
                           .device = {},
                           .first_layer = 0,
                           .last_layer = 4});
  ASSERT_TRUE(ValidateRingConfig(config).ok()) << ValidateRingConfig(config);
  absl::StatusOr<std::unique_ptr<RingEngine>> engine = StartGrpcRingEngine(
      {.bring_up = {.ring = config, .connect_timeout = absl::Seconds(30)}});
  ASSERT_TRUE(engine.ok()) << engine.status();

  std::vector<std::string> after;
  bool ready = false;
  while (!ready) {
    std::optional<std::string> message = listener->Receive(milliseconds(10000));
    ASSERT_TRUE(message.has_value()) << "no READY=1 after configuration";
    after.push_back(*message);
    ready = HasAssignment(*message, "READY=1");
  }
  // The READY message says what was loaded.
  EXPECT_THAT(after.back(), ::testing::HasSubstr("layers [0, 4) loaded"));

  (*engine)->Shutdown(/*stop_stages=*/true);
  engine->reset();
  absl::StatusOr<int> exit_code = stage->Wait(absl::Seconds(10));
  ASSERT_TRUE(exit_code.ok()) << exit_code.status();
  EXPECT_EQ(*exit_code, 0);
  bool stopping = false;
  for (const std::string& message : listener->Drain()) {
    stopping = stopping || HasAssignment(message, "STOPPING=1");
  }
  EXPECT_TRUE(stopping) << "the stage did not say STOPPING=1 on its way out";
}

// Under `WatchdogSec=` an idle stage (never configured) must keep pinging the watchdog, or
// systemd would restart it; the pings stop before it says STOPPING=1.
TEST(StageReadinessTest, IdleStagePingsTheWatchdogUntilStopping) {
  TempDir dir;
  absl::StatusOr<NotifyListener> listener = NotifyListener::Create(dir.path());
  ASSERT_TRUE(listener.ok()) << listener.status();

  // WATCHDOG_PID unset: the interval applies to the child (systemd sets it to the main pid).
  setenv("NOTIFY_SOCKET", listener->path().c_str(), 1);
  setenv("WATCHDOG_USEC", "200000", 1);
  unsetenv("WATCHDOG_PID");
  absl::StatusOr<Subprocess> stage = Subprocess::Spawn(
      {.argv = {BinaryDir() + "/stage/stage", "--listen", "127.0.0.1:0", "--ready-fd", "3"},
       .ready_fd = true,
       .stdout_path = "",
       .stderr_path = ""});
  unsetenv("NOTIFY_SOCKET");
  unsetenv("WATCHDOG_USEC");
  ASSERT_TRUE(stage.ok()) << stage.status();
  ASSERT_TRUE(stage->ReadReadyLine(absl::Seconds(30)).ok());

  int pings = 0;
  while (pings < 3) {
    std::optional<std::string> message = listener->Receive(milliseconds(10000));
    ASSERT_TRUE(message.has_value()) << "an idle stage stopped pinging the watchdog";
    EXPECT_FALSE(HasAssignment(*message, "READY=1")) << *message;
    if (HasAssignment(*message, "WATCHDOG=1")) ++pings;
  }

  EXPECT_EQ(stage->Terminate(absl::Seconds(10)), 0);
  bool stopping = false;
  for (const std::string& message : listener->Drain()) {
    if (HasAssignment(message, "STOPPING=1")) stopping = true;
    EXPECT_FALSE(stopping && HasAssignment(message, "WATCHDOG=1"))
        << "a watchdog ping after STOPPING=1";
  }
  EXPECT_TRUE(stopping) << "the stage did not say STOPPING=1 on its way out";
}

}  // namespace
}  // namespace ringserve::ops
