#include "stage/notify/notify.h"

#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "stage/notify/notify_listener.h"

extern char** environ;

namespace ringserve {
namespace {

using std::chrono::milliseconds;
constexpr milliseconds kWait(10000);

class NotifyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/rs_notify_XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    absl::StatusOr<NotifyListener> listener = NotifyListener::Create(dir_);
    ASSERT_TRUE(listener.ok()) << listener.status();
    listener_.emplace(std::move(*listener));
  }
  void TearDown() override {
    unsetenv("NOTIFY_SOCKET");
    unsetenv("WATCHDOG_USEC");
    unsetenv("WATCHDOG_PID");
    listener_.reset();
    std::filesystem::remove_all(dir_);
  }

  std::string dir_;
  std::optional<NotifyListener> listener_;
};

TEST_F(NotifyTest, NoSocketMeansNoOp) {
  unsetenv("NOTIFY_SOCKET");
  EXPECT_FALSE(NotifyEnabled());
  EXPECT_TRUE(NotifyReady().ok());
  EXPECT_TRUE(NotifyStatus("x").ok());
  EXPECT_TRUE(NotifyWatchdog().ok());
  EXPECT_TRUE(listener_->Drain().empty());
}

TEST_F(NotifyTest, SendsReadyStatusAndWatchdog) {
  setenv("NOTIFY_SOCKET", listener_->path().c_str(), 1);
  ASSERT_TRUE(NotifyStatus("loading\nlayers 1/4").ok());
  ASSERT_TRUE(NotifyReady("ready").ok());
  ASSERT_TRUE(NotifyWatchdog().ok());
  std::optional<std::string> status = listener_->Receive(kWait);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(*status, "STATUS=loading layers 1/4");
  std::optional<std::string> ready = listener_->Receive(kWait);
  ASSERT_TRUE(ready.has_value());
  EXPECT_TRUE(HasAssignment(*ready, "READY=1"));
  EXPECT_TRUE(HasAssignment(*ready, "STATUS=ready"));
  std::optional<std::string> watchdog = listener_->Receive(kWait);
  ASSERT_TRUE(watchdog.has_value());
  EXPECT_EQ(*watchdog, "WATCHDOG=1");
}

TEST_F(NotifyTest, SocketGoneIsAnError) {
  setenv("NOTIFY_SOCKET", (dir_ + "/nobody.sock").c_str(), 1);
  EXPECT_FALSE(NotifyReady().ok());
}

TEST_F(NotifyTest, WatchdogPingsOnlyWhileHealthy) {
  setenv("NOTIFY_SOCKET", listener_->path().c_str(), 1);
  setenv("WATCHDOG_USEC", "20000", 1);
  setenv("WATCHDOG_PID", std::to_string(getpid()).c_str(), 1);
  ASSERT_TRUE(WatchdogInterval().has_value());
  EXPECT_EQ(*WatchdogInterval(), std::chrono::microseconds(20000));
  {
    WatchdogPinger pinger([] { return true; });
    ASSERT_TRUE(pinger.active());
    for (int i = 0; i < 3; ++i) {
      std::optional<std::string> ping = listener_->Receive(kWait);
      ASSERT_TRUE(ping.has_value());
      EXPECT_EQ(*ping, "WATCHDOG=1");
    }
  }
  listener_->Drain();
  std::atomic<int> checks{0};
  std::atomic<bool> checked_enough{false};
  {
    WatchdogPinger pinger([&] {
      if (++checks >= 3) checked_enough = true;
      checks.notify_all();
      return false;
    });
    // Wait (bounded) until the pinger has asked three times, then stop it.
    auto deadline = std::chrono::steady_clock::now() + kWait;
    while (!checked_enough && std::chrono::steady_clock::now() < deadline) {
      int seen = checks.load();
      if (seen < 3) checks.wait(seen);
    }
  }
  EXPECT_GE(checks.load(), 3);
  EXPECT_TRUE(listener_->Drain().empty()) << "an unhealthy stage must not ping the watchdog";
}

TEST_F(NotifyTest, WatchdogOffMeansNoThread) {
  setenv("NOTIFY_SOCKET", listener_->path().c_str(), 1);
  unsetenv("WATCHDOG_USEC");
  WatchdogPinger pinger([] { return true; });
  EXPECT_FALSE(pinger.active());
}

// A child process started with NOTIFY_SOCKET says READY=1 only after its loading has finished.
TEST_F(NotifyTest, ChildSendsReadyOnlyAfterLoading) {
  const char* binary_dir = std::getenv("RINGSERVE_BINARY_DIR");
  ASSERT_NE(binary_dir, nullptr);
  std::string probe = std::string(binary_dir) + "/stage/notify/notify_probe";
  int to_child[2];
  ASSERT_EQ(pipe(to_child), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, to_child[0], STDIN_FILENO);
  posix_spawn_file_actions_addclose(&actions, to_child[1]);
  setenv("NOTIFY_SOCKET", listener_->path().c_str(), 1);
  char* argv[] = {probe.data(), nullptr};
  pid_t pid = 0;
  int rc = posix_spawn(&pid, probe.c_str(), &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  unsetenv("NOTIFY_SOCKET");
  close(to_child[0]);
  ASSERT_EQ(rc, 0) << "cannot start " << probe;

  // While loading: progress, but no READY=1.
  std::optional<std::string> first = listener_->Receive(kWait);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(*first, "STATUS=loading weights");
  EXPECT_TRUE(listener_->Drain().empty());

  ASSERT_EQ(write(to_child[1], "done\n", 5), 5);  // loading finishes
  std::optional<std::string> ready = listener_->Receive(kWait);
  ASSERT_TRUE(ready.has_value());
  EXPECT_TRUE(HasAssignment(*ready, "READY=1")) << *ready;
  EXPECT_TRUE(HasAssignment(*ready, "STATUS=ready: done")) << *ready;

  close(to_child[1]);
  std::optional<std::string> stopping = listener_->Receive(kWait);
  ASSERT_TRUE(stopping.has_value());
  EXPECT_EQ(*stopping, "STOPPING=1");
  int wstatus = 0;
  ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
  EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0);
}

}  // namespace
}  // namespace ringserve
