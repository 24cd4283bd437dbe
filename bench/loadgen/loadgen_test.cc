// End to end: a real coordinator with 2 local CPU stages on a fixture model, driven by the real
// `ringserve_loadgen` binary over loopback gRPC; the JSON report is checked.
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "coordinator/subprocess.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "proto/generate.grpc.pb.h"

namespace ringserve::loadgen {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string SourceDir() {
  const char* dir = std::getenv("RINGSERVE_SOURCE_DIR");
  return dir != nullptr ? dir : ".";
}

class LoadgenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (std::filesystem::temp_directory_path() / "loadgen_test.XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    if (coordinator_) coordinator_->Terminate();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  // Starts the coordinator's embedded default: 2 local stages on the qwen2 fixture.
  void StartCoordinator() {
    SubprocessOptions spawn;
    spawn.argv = {RINGSERVE_COORDINATOR_BINARY,
                  "--model",
                  SourceDir() + "/tests/fixtures/models/qwen2",
                  "--num_stages",
                  "2",
                  "--stage_binary",
                  RINGSERVE_STAGE_BINARY,
                  "--listen",
                  "127.0.0.1:0",
                  "--ready_fd",
                  "3"};
    spawn.ready_fd = true;
    spawn.stderr_path = dir_ + "/coordinator.log";
    auto process = Subprocess::Spawn(spawn);
    ASSERT_TRUE(process.ok()) << process.status();
    coordinator_ = std::make_unique<Subprocess>(std::move(*process));
    auto address = coordinator_->ReadReadyLine(absl::Seconds(60));
    ASSERT_TRUE(address.ok()) << address.status() << "\n" << ReadFile(dir_ + "/coordinator.log");
    address_ = *address;
  }

  struct LoadgenRun {
    int exit_code = -1;
    std::string stdout_text;
    std::string stderr_text;
    nlohmann::json report;
  };

  // Runs ringserve_loadgen with `args` (plus --json) to its exit, bounded.
  LoadgenRun RunLoadgen(std::vector<std::string> args) {
    LoadgenRun run;
    const std::string json_path = dir_ + "/report.json";
    SubprocessOptions spawn;
    spawn.argv = {RINGSERVE_LOADGEN_BINARY, "--json", json_path};
    spawn.argv.insert(spawn.argv.end(), args.begin(), args.end());
    spawn.stdout_path = dir_ + "/loadgen.out";
    spawn.stderr_path = dir_ + "/loadgen.err";
    auto process = Subprocess::Spawn(spawn);
    EXPECT_TRUE(process.ok()) << process.status();
    if (!process.ok()) return run;
    auto code = process->Wait(absl::Seconds(60));
    EXPECT_TRUE(code.ok()) << code.status();
    run.exit_code = code.ok() ? *code : process->Terminate();
    run.stdout_text = ReadFile(dir_ + "/loadgen.out");
    run.stderr_text = ReadFile(dir_ + "/loadgen.err");
    const std::string json_text = ReadFile(json_path);
    if (!json_text.empty()) {
      run.report = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
    }
    return run;
  }

  std::string dir_;
  std::unique_ptr<Subprocess> coordinator_;
  std::string address_;
};

TEST_F(LoadgenTest, FixedRequestCountCompletesWithExactLengthsAndStageFigures) {
  StartCoordinator();
  constexpr int kRequests = 6;
  constexpr int kPromptTokens = 12;
  constexpr int kMaxTokens = 8;
  LoadgenRun run =
      RunLoadgen({"--target", address_, "--streams", "3", "--requests", std::to_string(kRequests),
                  "--prompt_tokens", std::to_string(kPromptTokens), "--max_tokens",
                  std::to_string(kMaxTokens), "--seed", "7", "--stats_interval_s", "0.05"});
  ASSERT_EQ(run.exit_code, 0) << run.stderr_text << run.stdout_text;
  const nlohmann::json& r = run.report;
  ASSERT_TRUE(r.is_object()) << "no JSON report; stdout:\n" << run.stdout_text;
  SCOPED_TRACE(r.dump(2));

  EXPECT_EQ(r["model"]["num_stages"], 2);
  EXPECT_EQ(r["model"]["architecture"], "Qwen2ForCausalLM");
  EXPECT_EQ(r["requests"]["started"], kRequests);
  EXPECT_EQ(r["requests"]["completed"], kRequests);
  EXPECT_EQ(r["requests"]["failed"], 0);
  EXPECT_EQ(r["requests"]["cut"], 0);
  EXPECT_EQ(r["requests"]["short"], 0);
  EXPECT_EQ(r["output_tokens"], kRequests * kMaxTokens);
  EXPECT_EQ(r["input_tokens"], kRequests * kPromptTokens);
  ASSERT_EQ(r["request_records"].size(), static_cast<size_t>(kRequests));
  for (const nlohmann::json& q : r["request_records"]) {
    EXPECT_EQ(q["status"], "ok");
    EXPECT_EQ(q["finish_reason"], "length");
    EXPECT_EQ(q["completion_tokens"], kMaxTokens);
    EXPECT_EQ(q["usage_completion_tokens"], kMaxTokens);
    EXPECT_EQ(q["prompt_tokens"], kPromptTokens);
    EXPECT_GT(q["ttft_ms"].get<double>(), 0);
    EXPECT_GE(q["e2e_ms"].get<double>(), q["ttft_ms"].get<double>());
  }

  EXPECT_GT(r["wall_s"].get<double>(), 0);
  EXPECT_GT(r["output_tokens_per_s"].get<double>(), 0);
  EXPECT_GT(r["requests_per_s"].get<double>(), 0);
  EXPECT_EQ(r["ttft_ms"]["count"], kRequests);
  EXPECT_GT(r["ttft_ms"]["p50"].get<double>(), 0);
  EXPECT_GE(r["ttft_ms"]["p99"].get<double>(), r["ttft_ms"]["p50"].get<double>());
  EXPECT_EQ(r["itl_ms"]["count"], kRequests * (kMaxTokens - 1));
  EXPECT_GT(r["itl_ms"]["mean"].get<double>(), 0);
  EXPECT_GT(r["itl_ms"]["p99"].get<double>(), 0);
  EXPECT_GE(r["itl_ms"]["p99"].get<double>(), r["itl_ms"]["p50"].get<double>());
  EXPECT_EQ(r["e2e_ms"]["count"], kRequests);

  // Per-stage figures from the coordinator's Stats, and its counters agree with ours.
  ASSERT_TRUE(r["stats_available"].get<bool>());
  ASSERT_EQ(r["stages"].size(), 2u);
  int next_layer = 0;
  for (const nlohmann::json& s : r["stages"]) {
    EXPECT_EQ(s["first_layer"], next_layer);
    EXPECT_GT(s["last_layer"].get<int>(), s["first_layer"].get<int>());
    next_layer = s["last_layer"];
    EXPECT_GT(s["steps"].get<int64_t>(), 0);
    EXPECT_GE(s["busy_samples"].get<int>(), 1);
    EXPECT_GT(s["busy_fraction_max"].get<double>(), 0);
    EXPECT_GT(s["busy_fraction_mean"].get<double>(), 0);
    EXPECT_GT(s["busy_fraction_run"].get<double>(), 0);
    EXPECT_LE(s["busy_fraction_run"].get<double>(), 1.0);
    EXPECT_LE(s["busy_fraction_max"].get<double>(), 1.0);
  }
  EXPECT_EQ(next_layer, r["model"]["num_layers"]);
  EXPECT_GT(r["stages"][0]["bytes_sent"].get<int64_t>(), 0);  // activations to stage 1
  EXPECT_EQ(r["server"]["requests_finished"], kRequests);
  EXPECT_EQ(r["server"]["generated_tokens"], kRequests * kMaxTokens);

  EXPECT_NE(run.stdout_text.find("time to first token"), std::string::npos) << run.stdout_text;
  EXPECT_NE(run.stdout_text.find("busy mean"), std::string::npos) << run.stdout_text;
}

// A shared prefix: every prompt starts with the same ids (from --prefix_seed), so after the
// first request the coordinator's prefix cache serves them: a second run with the same prefix
// seed (other own ids) finds its prompts' shared full blocks cached.
TEST_F(LoadgenTest, SharedPrefixIsServedFromThePrefixCache) {
  StartCoordinator();
  constexpr int kPrefix = 40;  // 2 full KV blocks of 16 positions, and part of a third
  auto run_once = [&](const std::string& seed) {
    return RunLoadgen({"--target", address_, "--streams", "1", "--requests", "2", "--prompt_tokens",
                       "6", "--shared_prefix_tokens", std::to_string(kPrefix), "--prefix_seed", "3",
                       "--seed", seed, "--max_tokens", "3"});
  };
  LoadgenRun first = run_once("1");
  ASSERT_EQ(first.exit_code, 0) << first.stderr_text << first.stdout_text;
  LoadgenRun second = run_once("2");
  ASSERT_EQ(second.exit_code, 0) << second.stderr_text << second.stdout_text;
  for (const LoadgenRun* run : {&first, &second}) {
    const nlohmann::json& r = run->report;
    ASSERT_TRUE(r.is_object()) << run->stdout_text;
    EXPECT_EQ(r["input_tokens"], 2 * (kPrefix + 6));
    EXPECT_EQ(r["server"]["prompt_tokens"], 2 * (kPrefix + 6));
    EXPECT_GT(r["server"]["prefix_lookup_tokens"].get<int64_t>(), 0) << r["server"];
  }
  // Run 1: request 0 computes the prefix, request 1 (one at a time) finds it; run 2: both do.
  const int64_t hits_first = first.report["server"]["prefix_hit_tokens"];
  const int64_t hits_second = second.report["server"]["prefix_hit_tokens"];
  EXPECT_GT(hits_first, 0) << first.report["server"];
  EXPECT_EQ(hits_second, 2 * hits_first) << second.report["server"];
  EXPECT_EQ(hits_first, 32);  // the prefix's full blocks; the third holds the own ids too
}

TEST_F(LoadgenTest, FixedDurationStopsOnTimeAndCutsRunningRequests) {
  StartCoordinator();
  // Outputs long enough that requests are still running when the duration ends.
  LoadgenRun run = RunLoadgen({"--target", address_, "--streams", "2", "--duration_s", "1.5",
                               "--prompt_tokens", "4", "--max_tokens", "200"});
  ASSERT_EQ(run.exit_code, 0) << run.stderr_text << run.stdout_text;
  const nlohmann::json& r = run.report;
  ASSERT_TRUE(r.is_object()) << run.stdout_text;
  SCOPED_TRACE(r.dump(2));
  EXPECT_EQ(r["requests"]["failed"], 0);
  EXPECT_GE(r["requests"]["started"].get<int>(), 2);
  EXPECT_EQ(r["requests"]["started"].get<int>(),
            r["requests"]["completed"].get<int>() + r["requests"]["cut"].get<int>());
  EXPECT_GT(r["output_tokens"].get<int64_t>(), 0);
  EXPECT_GE(r["wall_s"].get<double>(), 1.4);
  EXPECT_LT(r["wall_s"].get<double>(), 5.0);
}

TEST_F(LoadgenTest, NoServerIsABoundedCleanFailure) {
  // Nothing listens on port 1 of loopback.
  LoadgenRun run =
      RunLoadgen({"--target", "127.0.0.1:1", "--requests", "1", "--connect_timeout_s", "1"});
  EXPECT_EQ(run.exit_code, 1) << run.stderr_text;
  EXPECT_NE(run.stderr_text.find("cannot connect"), std::string::npos) << run.stderr_text;
}

TEST_F(LoadgenTest, ServerDyingMidRunIsCountedNotFatal) {
  StartCoordinator();
  SubprocessOptions spawn;
  spawn.argv = {RINGSERVE_LOADGEN_BINARY,
                "--json",
                dir_ + "/report.json",
                "--target",
                address_,
                "--streams",
                "2",
                "--duration_s",
                "30",
                "--prompt_tokens",
                "4",
                "--max_tokens",
                "200",
                "--max_errors",
                "3",
                "--connect_timeout_s",
                "2",
                "--quiet"};
  spawn.stderr_path = dir_ + "/loadgen.err";
  auto loadgen = Subprocess::Spawn(spawn);
  ASSERT_TRUE(loadgen.ok()) << loadgen.status();

  // Wait (bounded) until the coordinator has generated tokens for the load generator's calls.
  auto stub =
      v1::Generate::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  int64_t generated = 0;
  while (generated == 0 && absl::Now() < give_up) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    v1::StatsResponse stats;
    if (stub->Stats(&context, v1::StatsRequest(), &stats).ok()) {
      generated = stats.generated_tokens();
    }
    // Stats has no change notification; poll it.
    if (generated == 0) absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_GT(generated, 0) << "the load generator's requests never produced tokens";
  coordinator_->Terminate();
  coordinator_.reset();

  auto code = loadgen->Wait(absl::Seconds(25));  // well before the 30 s duration
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0) << ReadFile(dir_ + "/loadgen.err");
  nlohmann::json r =
      nlohmann::json::parse(ReadFile(dir_ + "/report.json"), nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(r.is_object()) << ReadFile(dir_ + "/loadgen.err");
  SCOPED_TRACE(r.dump(2));
  EXPECT_GE(r["requests"]["failed"].get<int>(), 3);
  EXPECT_TRUE(r["requests"]["stopped_early"].get<bool>());
  EXPECT_FALSE(r["errors"]["by_code"].empty());
  EXPECT_FALSE(r["errors"]["samples"].empty());
  EXPECT_LT(r["wall_s"].get<double>(), 25.0);
}

}  // namespace
}  // namespace ringserve::loadgen
