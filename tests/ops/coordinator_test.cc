// The real `coordinator` binary under a supervisor's eyes: once a stage of its ring dies, the
// ring cannot serve again, so the coordinator exits non-zero (status 3) for systemd
// (Restart=on-failure) to restart it and configure the ring again.
#include <signal.h>

#include <fstream>

#include "coordinator/subprocess.h"
#include "fmt/format.h"
#include "gtest/gtest.h"
#include "tests/ops/ops_util.h"

namespace ringserve::ops {
namespace {

TEST(CoordinatorTest, ExitsNonZeroWhenAStageDies) {
  TempDir dir;
  absl::StatusOr<std::string> model_dir = MakeTestModel(dir.path());
  ASSERT_TRUE(model_dir.ok()) << model_dir.status();
  absl::StatusOr<Subprocess> stage = Subprocess::Spawn(
      {.argv = {BinaryDir() + "/stage/stage", "--listen", "127.0.0.1:0", "--ready-fd", "3"},
       .ready_fd = true,
       .stdout_path = "",
       .stderr_path = ""});
  ASSERT_TRUE(stage.ok()) << stage.status();
  absl::StatusOr<std::string> address = stage->ReadReadyLine(absl::Seconds(30));
  ASSERT_TRUE(address.ok()) << address.status();
  const std::string port = address->substr(address->rfind(':') + 1);

  const std::string hosts = dir.path() + "/hosts.yaml";
  std::ofstream(hosts) << fmt::format(
      "model: {}\napi:\n  grpc: 127.0.0.1:0\nstages:\n"
      "  - {{host: 127.0.0.1, port: {}, device: cpu, layers: 4}}\n",
      *model_dir, port);
  absl::StatusOr<Subprocess> coordinator =
      Subprocess::Spawn({.argv = {BinaryDir() + "/coordinator/coordinator", "--stages", hosts,
                                  "--connect-timeout", "30", "--ready-fd", "3"},
                         .ready_fd = true,
                         .stdout_path = "",
                         .stderr_path = ""});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  absl::StatusOr<std::string> serving = coordinator->ReadReadyLine(absl::Seconds(60));
  ASSERT_TRUE(serving.ok()) << serving.status();

  // Serving and healthy: it stays up.
  absl::StatusOr<int> early = coordinator->Wait(absl::Seconds(2));
  EXPECT_FALSE(early.ok()) << "the coordinator exited while its ring was healthy: " << *early;

  kill(stage->pid(), SIGKILL);
  ASSERT_TRUE(stage->Wait(absl::Seconds(10)).ok());
  absl::StatusOr<int> exit_code = coordinator->Wait(absl::Seconds(20));
  ASSERT_TRUE(exit_code.ok()) << "the coordinator kept running with a dead stage: "
                              << exit_code.status();
  EXPECT_EQ(*exit_code, 3);
}

}  // namespace
}  // namespace ringserve::ops
