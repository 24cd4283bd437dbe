// The real `coordinator` binary under a supervisor's eyes: a stage of its ring dies and comes
// back (systemd restarts it), and the coordinator, still up, forms the ring again. And its
// /metrics counts the requests of both client APIs (gRPC through the real `ringserve_client`,
// and HTTP). And a model file it must not read (a FIFO) stops it at once instead of hanging it.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <optional>

#include "coordinator/hosts/ring_config.h"
#include "coordinator/subprocess.h"
#include "fmt/format.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "proto/generate.grpc.pb.h"
#include "tests/ops/ops_util.h"

namespace ringserve::ops {
namespace {

// A hosts.yaml ring whose only stage dies: the coordinator stays up (answering Health with
// "not serving"), and once the stage is back on its port (as systemd would restart it) it
// forms the ring again and serves.
TEST(CoordinatorTest, StaysUpAndFormsTheRingAgainWhenItsStageReturns) {
  TempDir dir;
  absl::StatusOr<std::string> model_dir = MakeTestModel(dir.path());
  ASSERT_TRUE(model_dir.ok()) << model_dir.status();
  auto spawn_stage = [](const std::string& listen) {
    return Subprocess::Spawn(
        {.argv = {BinaryDir() + "/stage/stage", "--listen", listen, "--ready_fd", "3"},
         .ready_fd = true,
         .stdout_path = "",
         .stderr_path = ""});
  };
  absl::StatusOr<Subprocess> stage = spawn_stage("127.0.0.1:0");
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
                                  "--connect_timeout", "5", "--ready_fd", "3"},
                         .ready_fd = true,
                         .stdout_path = "",
                         .stderr_path = ""});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  absl::StatusOr<std::string> serving = coordinator->ReadReadyLine(absl::Seconds(60));
  ASSERT_TRUE(serving.ok()) << serving.status();
  auto stub =
      v1::Generate::NewStub(grpc::CreateChannel(*serving, grpc::InsecureChannelCredentials()));
  auto health = [&]() -> std::optional<bool> {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::HealthResponse response;
    if (!stub->Health(&context, v1::HealthRequest(), &response).ok()) return std::nullopt;
    return response.serving();
  };
  auto wait_health = [&](bool want) {
    for (int i = 0; i < 300; ++i) {
      if (health() == want) return true;
      absl::SleepFor(absl::Milliseconds(100));
    }
    return false;
  };
  ASSERT_TRUE(wait_health(true));

  kill(stage->pid(), SIGKILL);
  ASSERT_TRUE(stage->Wait(absl::Seconds(10)).ok());
  EXPECT_TRUE(wait_health(false)) << "the coordinator did not notice its stage died";
  absl::StatusOr<int> early = coordinator->Wait(absl::Seconds(1));
  EXPECT_FALSE(early.ok()) << "the coordinator exited with its stage: " << *early;

  absl::StatusOr<Subprocess> restarted = spawn_stage("127.0.0.1:" + port);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  ASSERT_TRUE(restarted->ReadReadyLine(absl::Seconds(30)).ok());
  EXPECT_TRUE(wait_health(true)) << "the ring was not formed again";
  coordinator->Terminate();
  restarted->Terminate();
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

// A model directory whose config.json is a FIFO stops the coordinator at once, naming the file:
// it used to block in open() for a writer forever (deaf to SIGTERM as well).
TEST(CoordinatorTest, ExitsNamingAFifoConfigInsteadOfHanging) {
  TempDir dir;
  absl::StatusOr<std::string> model_dir = MakeTestModel(dir.path());
  ASSERT_TRUE(model_dir.ok()) << model_dir.status();
  const std::string config = *model_dir + "/config.json";
  ASSERT_EQ(::unlink(config.c_str()), 0);
  ASSERT_EQ(::mkfifo(config.c_str(), 0600), 0);
  absl::StatusOr<ProgramResult> coordinator =
      RunProgram({BinaryDir() + "/coordinator/coordinator", "--model", *model_dir, "--num_stages",
                  "1", "--listen", "127.0.0.1:0"},
                 absl::Seconds(60));
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  EXPECT_NE(coordinator->exit_code, 0) << coordinator->output;
  EXPECT_THAT(coordinator->output, ::testing::HasSubstr(config + ": not a regular file (a FIFO)"));
}

}  // namespace
}  // namespace ringserve::ops
