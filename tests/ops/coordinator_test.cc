// The real `coordinator` binary under a supervisor's eyes: a stage of its ring dies and comes
// back (systemd restarts it), and the coordinator, still up, forms the ring again, refusing new
// requests meanwhile and resuming the one it was running. And its
// /metrics counts the requests of both client APIs (gRPC through the real `ringserve_client`,
// and HTTP). And a model file it must not read (a FIFO), or a quantization it cannot serve, stops
// it at once instead of hanging it or failing its stages.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status_macros.h"
#include "coordinator/hosts/ring_config.h"
#include "coordinator/subprocess.h"
#include "fmt/format.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "proto/generate.grpc.pb.h"
#include "tests/ops/ops_util.h"

namespace ringserve::ops {
namespace {

// One `stage` process holding all 4 layers of the test model and a `coordinator` over it (a
// hosts.yaml ring, gRPC on a free port), as systemd runs them; both terminated on destruction.
class OneStageRing {
 public:
  // Starts the stage, then the coordinator, and waits (bounded) until it serves. `stage_args`
  // and `coordinator_args` are extra flags.
  absl::Status Start(const std::vector<std::string>& stage_args = {},
                     const std::vector<std::string>& coordinator_args = {}) {
    RS_ASSIGN_OR_RETURN(const std::string model_dir, MakeTestModel(dir_.path()));
    stage_args_ = stage_args;
    RS_ASSIGN_OR_RETURN(const std::string address, StartStage("127.0.0.1:0"));
    stage_port_ = address.substr(address.rfind(':') + 1);
    const std::string hosts = dir_.path() + "/hosts.yaml";
    std::ofstream(hosts) << fmt::format(
        "model: {}\napi:\n  grpc: 127.0.0.1:0\nstages:\n"
        "  - {{host: 127.0.0.1, port: {}, device: cpu, layers: 4}}\n",
        model_dir, stage_port_);
    RS_ASSIGN_OR_RETURN(const std::string serving,
                        SpawnReady({BinaryDir() + "/coordinator/coordinator", "--stages", hosts,
                                    "--connect_timeout", "5", "--ready_fd", "3"},
                                   coordinator_args, absl::Seconds(60), coordinator_));
    stub_ = v1::Generate::NewStub(grpc::CreateChannel(serving, grpc::InsecureChannelCredentials()));
    return absl::OkStatus();
  }

  // SIGKILL to the stage; waits (bounded) until it is gone.
  absl::Status KillStage() {
    if (kill(stage_->pid(), SIGKILL) != 0) return absl::InternalError("kill failed");
    return stage_->Wait(absl::Seconds(10)).status();
  }
  // Starts the stage again on its port, as systemd would, and waits until it listens.
  absl::Status RestartStage() { return StartStage("127.0.0.1:" + stage_port_).status(); }

  // Health's `serving`, or nullopt when the call fails.
  std::optional<bool> Serving() {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::HealthResponse response;
    if (!stub_->Health(&context, v1::HealthRequest(), &response).ok()) return std::nullopt;
    return response.serving();
  }
  // Polls Health until it says `want` (bounded: 30 s).
  bool WaitServing(bool want) {
    for (int i = 0; i < 300; ++i) {
      if (Serving() == want) return true;
      absl::SleepFor(absl::Milliseconds(100));
    }
    return false;
  }

  v1::Generate::Stub& stub() { return *stub_; }
  Subprocess& coordinator() { return *coordinator_; }

 private:
  absl::StatusOr<std::string> StartStage(const std::string& listen) {
    return SpawnReady({BinaryDir() + "/stage/stage", "--listen", listen, "--ready_fd", "3"},
                      stage_args_, absl::Seconds(30), stage_);
  }

  // Starts `argv` + `extra` as `process` (replacing what it held) and returns its ready line.
  static absl::StatusOr<std::string> SpawnReady(std::vector<std::string> argv,
                                                const std::vector<std::string>& extra,
                                                absl::Duration timeout,
                                                std::optional<Subprocess>& process) {
    argv.insert(argv.end(), extra.begin(), extra.end());
    RS_ASSIGN_OR_RETURN(
        Subprocess spawned,
        Subprocess::Spawn(
            {.argv = std::move(argv), .ready_fd = true, .stdout_path = "", .stderr_path = ""}));
    process.emplace(std::move(spawned));
    return process->ReadReadyLine(timeout);
  }

  TempDir dir_;
  std::vector<std::string> stage_args_;
  std::string stage_port_;
  std::optional<Subprocess> stage_;
  std::optional<Subprocess> coordinator_;  // after stage_: terminated first
  std::unique_ptr<v1::Generate::Stub> stub_;
};

// A hosts.yaml ring whose only stage dies: the coordinator stays up (answering Health with
// "not serving"), and once the stage is back on its port (as systemd would restart it) it
// forms the ring again and serves.
TEST(CoordinatorTest, StaysUpAndFormsTheRingAgainWhenItsStageReturns) {
  OneStageRing ring;
  absl::Status started = ring.Start();
  ASSERT_TRUE(started.ok()) << started;
  ASSERT_TRUE(ring.WaitServing(true));
  ASSERT_TRUE(ring.KillStage().ok());
  EXPECT_TRUE(ring.WaitServing(false)) << "the coordinator did not notice its stage died";
  absl::StatusOr<int> early = ring.coordinator().Wait(absl::Seconds(1));
  EXPECT_FALSE(early.ok()) << "the coordinator exited with its stage: " << *early;
  absl::Status restarted = ring.RestartStage();
  ASSERT_TRUE(restarted.ok()) << restarted;
  EXPECT_TRUE(ring.WaitServing(true)) << "the ring was not formed again";
}

// While its ring is down (the only stage died), the coordinator answers a new request at once,
// on both APIs, with "the ring is down and re-forming ...; retry later" (gRPC UNAVAILABLE, HTTP
// 503 with Retry-After) instead of holding it for up to --ring_down_timeout (120 s); the
// request it was running waits and resumes once the stage is back.
TEST(CoordinatorTest, RefusesNewRequestsAtOnceWhileItsRingIsDownAndResumesRunningOnes) {
  absl::StatusOr<int> http_port = PickFreeLocalPort();
  ASSERT_TRUE(http_port.ok()) << http_port.status();
  OneStageRing ring;
  absl::Status started = ring.Start(
      {"--debug_step_delay_ms", "20"},
      {"--http_listen", fmt::format("127.0.0.1:{}", *http_port), "--connect_timeout", "2"});
  ASSERT_TRUE(started.ok()) << started;
  ASSERT_TRUE(ring.WaitServing(true));
  v1::GenerateRequest request;
  for (int32_t id : {5, 6, 7}) request.mutable_token_ids()->add_ids(id);
  request.mutable_sampling()->set_max_tokens(100);  // 2 s at least: running when the stage dies
  request.mutable_sampling()->set_ignore_eos(true);
  grpc::ClientContext running_context;
  running_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  auto running = ring.stub().Generate(&running_context, request);
  v1::GenerateResponse response;
  ASSERT_TRUE(running->Read(&response));
  int running_tokens = response.token_ids_size();

  ASSERT_TRUE(ring.KillStage().ok());
  ASSERT_TRUE(ring.WaitServing(false)) << "the coordinator did not notice its stage died";
  const absl::Time start = absl::Now();
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto refused = ring.stub().Generate(&context, request);
  while (refused->Read(&response)) {
  }
  const grpc::Status status = refused->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_THAT(status.error_message(), ::testing::HasSubstr("the ring is down and re-forming"));
  EXPECT_THAT(status.error_message(), ::testing::HasSubstr("retry later"));
  httplib::Client http("127.0.0.1", *http_port);
  http.set_read_timeout(20, 0);
  const nlohmann::json body = {
      {"model", "tiny-llama-chat"}, {"prompt", "Hello"}, {"max_tokens", 4}};
  httplib::Result answer = http.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(answer) << "POST /v1/completions failed";
  EXPECT_EQ(answer->status, 503) << answer->body;
  EXPECT_EQ(answer->get_header_value("Retry-After"), "1");
  EXPECT_THAT(answer->body, ::testing::HasSubstr("the ring is down and re-forming"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "the refusals were not immediate";

  absl::Status restarted = ring.RestartStage();
  ASSERT_TRUE(restarted.ok()) << restarted;
  while (running->Read(&response)) running_tokens += response.token_ids_size();
  const grpc::Status resumed = running->Finish();
  EXPECT_TRUE(resumed.ok()) << resumed.error_message();
  EXPECT_EQ(running_tokens, 100);
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

// `coordinator --model MODEL_DIR --num_stages 1` (the embedded default) to its exit, bounded.
absl::StatusOr<ProgramResult> RunEmbeddedCoordinator(const std::string& model_dir) {
  return RunProgram({BinaryDir() + "/coordinator/coordinator", "--model", model_dir, "--num_stages",
                     "1", "--listen", "127.0.0.1:0"},
                    absl::Seconds(60));
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
  absl::StatusOr<ProgramResult> coordinator = RunEmbeddedCoordinator(*model_dir);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  EXPECT_NE(coordinator->exit_code, 0) << coordinator->output;
  EXPECT_THAT(coordinator->output, ::testing::HasSubstr(config + ": not a regular file (a FIFO)"));
}

// A checkpoint quantized in a format no stage loads stops the coordinator at start, naming the
// key and the value, before it starts a stage: it used to start them and fail at their load.
TEST(CoordinatorTest, ExitsNamingAQuantMethodNoStageLoads) {
  TempDir dir;
  absl::StatusOr<std::string> model_dir = MakeTestModel(dir.path());
  ASSERT_TRUE(model_dir.ok()) << model_dir.status();
  const std::string config = *model_dir + "/config.json";
  nlohmann::json json = nlohmann::json::parse(std::ifstream(config));
  json["quantization_config"] = {{"quant_method", "bitsandbytes"}, {"load_in_4bit", true}};
  ASSERT_EQ(::unlink(config.c_str()), 0);  // a link to the fixture's
  std::ofstream(config) << json.dump();
  absl::StatusOr<ProgramResult> coordinator = RunEmbeddedCoordinator(*model_dir);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  EXPECT_NE(coordinator->exit_code, 0) << coordinator->output;
  EXPECT_THAT(coordinator->output,
              ::testing::HasSubstr(config + ": unsupported quantization_config.quant_method "
                                            "\"bitsandbytes\""));
  EXPECT_THAT(coordinator->output, ::testing::Not(::testing::HasSubstr("local stage")));
}

}  // namespace
}  // namespace ringserve::ops
