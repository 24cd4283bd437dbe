// The real `coordinator` binary under a supervisor's eyes: once a stage of its ring dies, the
// ring cannot serve again, so the coordinator exits non-zero (status 3) for systemd
// (Restart=on-failure) to restart it and configure the ring again. And its /metrics counts the
// requests of both client APIs (gRPC through the real `ringserve_client`, and HTTP).
#include <signal.h>

#include <fstream>

#include "coordinator/hosts/ring_config.h"
#include "coordinator/subprocess.h"
#include "fmt/format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "tests/ops/ops_util.h"

namespace ringserve::ops {
namespace {

TEST(CoordinatorTest, ExitsNonZeroWhenAStageDies) {
  TempDir dir;
  absl::StatusOr<std::string> model_dir = MakeTestModel(dir.path());
  ASSERT_TRUE(model_dir.ok()) << model_dir.status();
  absl::StatusOr<Subprocess> stage = Subprocess::Spawn(
      {.argv = {BinaryDir() + "/stage/stage", "--listen", "127.0.0.1:0", "--ready_fd", "3"},
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
                                  "--connect_timeout", "30", "--ready_fd", "3"},
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

TEST(CoordinatorTest, MetricsCountGrpcRequests) {
  TempDir dir;
  absl::StatusOr<std::string> model_dir = MakeTestModel(dir.path());
  ASSERT_TRUE(model_dir.ok()) << model_dir.status();
  absl::StatusOr<int> http_port = PickFreeLocalPort();
  ASSERT_TRUE(http_port.ok()) << http_port.status();
  absl::StatusOr<Subprocess> coordinator =
      Subprocess::Spawn({.argv = {BinaryDir() + "/coordinator/coordinator", "--model", *model_dir,
                                  "--num_stages", "2", "--listen", "127.0.0.1:0", "--http_listen",
                                  fmt::format("127.0.0.1:{}", *http_port), "--ready_fd", "3"},
                         .ready_fd = true,
                         .stdout_path = "",
                         .stderr_path = ""});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  absl::StatusOr<std::string> grpc_address = coordinator->ReadReadyLine(absl::Seconds(60));
  ASSERT_TRUE(grpc_address.ok()) << grpc_address.status();

  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<ProgramResult> client =
        RunProgram({BinaryDir() + "/coordinator/ringserve_client", "--target", *grpc_address,
                    "--prompt_ids", "5,6,7", "--max_tokens", "3"},
                   absl::Seconds(30));
    ASSERT_TRUE(client.ok()) << client.status();
    ASSERT_EQ(client->exit_code, 0) << client->output;
  }
  httplib::Client http("127.0.0.1", *http_port);
  httplib::Result metrics = http.Get("/metrics");
  ASSERT_TRUE(metrics) << "GET /metrics failed";
  EXPECT_THAT(metrics->body, ::testing::HasSubstr(
                                 "ringserve_requests_total{api=\"grpc\",outcome=\"length\"} 2\n"));
  EXPECT_THAT(metrics->body,
              ::testing::HasSubstr("ringserve_time_to_first_token_seconds_count 2\n"));
  coordinator->Terminate(absl::Seconds(10));
}

}  // namespace
}  // namespace ringserve::ops
