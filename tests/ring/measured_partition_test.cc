// `--partition auto` from measured cost on a real tiny MoE model with dense and MoE layers
// (tests/fixtures/models/qwen3_moe: layers 0 and 2 MoE, layer 1 dense by mlp_only_layers): the
// real stage binary's layer probe on the CPU, the proposal from it, and a ring of real stage
// processes on the proposed split that gives transformers' greedy tokens. And where the probe's
// files live: never at a predictable name in the shared temp directory.
#include "coordinator/measured_partition.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/testing/temp_dir.h"
#include "fmt/format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/ring/ring_harness.h"

namespace ringserve::testing {
namespace {

using ::testing::HasSubstr;

MeasuredPartitionOptions ProbeOptions(const std::string& model, int stages) {
  return {.stage_binary = BinaryDir() + "/stage/stage",
          .model_dir = model,
          .device = "cpu",
          .num_stages = stages,
          .probe_rows = 4,
          .probe_context = 32,
          .timeout = absl::Seconds(60)};
}

TEST(MeasuredPartitionTest, ProbesEveryLayerOfAMoeModelAndServesTheProposedSplit) {
  const std::string model = FixtureModel("qwen3_moe");
  auto measured = ProposeMeasuredPartition(ProbeOptions(model, 2));
  ASSERT_TRUE(measured.ok()) << measured.status();
  const LayerCostProfile& profile = measured->profile;
  EXPECT_EQ(profile.device, "cpu");
  EXPECT_EQ(profile.rows, 4);
  EXPECT_GT(profile.memory_bytes, 0);
  EXPECT_GT(profile.kv_bytes_per_token_and_layer, 0);
  ASSERT_EQ(profile.layers.size(), 3u);
  for (const LayerCost& layer : profile.layers) EXPECT_GT(layer.step_us, 0);
  // fp32 on the CPU: the MoE layer 2 (8 experts of 3 x 32 x 12, router) plus the lm_head
  // weighs more than the dense layer 1 (3 x 32 x 48).
  EXPECT_GT(profile.layers[2].bytes, profile.layers[1].bytes);
  ASSERT_EQ(measured->counts.size(), 2u);
  EXPECT_EQ(measured->counts[0] + measured->counts[1], 3);
  EXPECT_THAT(measured->why, HasSubstr("minimizing the slowest stage's measured decode step"));
  EXPECT_THAT(measured->why, HasSubstr("stage 1: layers ["));

  std::ifstream in(model + "/golden.json");
  const nlohmann::json golden = nlohmann::json::parse(in);
  const auto& prompt = golden["prompts"][0];
  const auto want = prompt["greedy_token_ids"].get<std::vector<int32_t>>();
  auto ring = Ring::Start({.model_dir = model, .partition = measured->counts});
  ASSERT_TRUE(ring.ok()) << ring.status();
  Generation got = (*ring)->Generate(
      IdsRequest(prompt["token_ids"].get<std::vector<int32_t>>(), static_cast<int>(want.size())));
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.tokens, want);
}

// A stage's share of memory smaller than any split needs: a clear error, not a ring that fails.
TEST(MeasuredPartitionTest, ModelThatFitsNoSplitIsRefused) {
  LayerCostProfile profile{.device = "cpu", .rows = 1, .context = 8};
  profile.layers = {{.step_us = 5, .bytes = 1000}, {.step_us = 5, .bytes = 1000}};
  profile.memory_bytes = 1500;
  profile.kv_bytes_per_token_and_layer = 0;
  MeasuredPartitionOptions options = ProbeOptions("unused", 2);
  options.memory_fraction = 1.0;
  auto refused = ProposeFromProfile(profile, 2, 256, {}, options);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("fits 2 stage(s)"));
  profile.memory_bytes = 2000;
  auto fits = ProposeFromProfile(profile, 2, 256, {}, options);
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_EQ(fits->counts, (std::vector<int>{1, 1}));
  EXPECT_FALSE(ProposeFromProfile(profile, 3, 256, {}, options).ok());  // 2 layers measured
}

// The parameter rule and the measured one disagree when MoE layers weigh much and cost little.
TEST(MeasuredPartitionTest, SaysWhatBalancingParametersWouldHaveCost) {
  LayerCostProfile profile{.device = "cuda:0", .rows = 32, .context = 256};
  profile.memory_bytes = int64_t{1} << 40;
  profile.kv_bytes_per_token_and_layer = 1024;
  const std::vector<int64_t> params = {10, 10, 80, 80, 80, 80, 80};
  for (int64_t p : params) {
    profile.layers.push_back({.step_us = p == 10 ? 100.0 : 40.0, .bytes = p * 1000});
  }
  auto out = ProposeFromProfile(profile, 7, 4096, params, ProbeOptions("unused", 2));
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->counts, (std::vector<int>{2, 5}));
  EXPECT_THAT(out->why, HasSubstr("balancing weight parameters instead would give 4,3"));
  EXPECT_THAT(out->why, HasSubstr("the K/V of 4096 tokens"));
}

// Sets an environment variable for the scope; restores the previous value after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

std::set<std::string> Entries(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    names.insert(entry.path().filename().string());
  }
  return names;
}

// The probe's profile and log used to go to <tmp>/ringserve_layer_probe_<pid>.out/.err: a name
// anyone on the host can predict, where another user can plant a symlink to a file of ours for
// the probe to overwrite (and which the coordinator deleted, whoever owned it). Now they go to a
// fresh directory only we can enter, gone again after a failed, a timed-out and a good probe.
TEST(MeasuredPartitionTest, ProbeFilesLiveInAPrivateDirectoryRemovedOnEveryPath) {
  TempDir tmp;  // the coordinator's temp directory ($TMPDIR)
  TempDir mine;
  const std::string victim = mine.path() + "/victim";
  std::ofstream(victim) << "precious";
  const std::string planted = fmt::format("{}/ringserve_layer_probe_{}", tmp.path(), getpid());
  ASSERT_EQ(symlink(victim.c_str(), (planted + ".out").c_str()), 0);
  ASSERT_EQ(symlink(victim.c_str(), (planted + ".err").c_str()), 0);
  const std::set<std::string> before = Entries(tmp.path());
  ScopedEnv tmpdir("TMPDIR", tmp.path());

  // A probe that reports where it was told to write (and that place's mode), then fails.
  const std::string report = mine.path() + "/report";
  const std::string failing = mine.path() + "/failing_probe";
  std::ofstream(failing) << fmt::format(
      "#!/bin/sh\nwhile [ $# -gt 0 ]; do [ \"$1\" = --probe_out ] && out=\"$2\"; shift; done\n"
      "dir=$(dirname \"$out\")\necho \"$dir\" > {0}\nstat -c %a \"$dir\" >> {0}\n"
      "echo 'probe refused on purpose' >&2\nexit 3\n",
      report);
  const std::string hanging = mine.path() + "/hanging_probe";
  std::ofstream(hanging) << "#!/bin/sh\nexec sleep 60\n";
  ASSERT_EQ(chmod(failing.c_str(), 0755), 0);
  ASSERT_EQ(chmod(hanging.c_str(), 0755), 0);
  MeasuredPartitionOptions options = ProbeOptions(FixtureModel("llama"), 2);

  options.stage_binary = failing;
  auto failed = ProposeMeasuredPartition(options);
  ASSERT_FALSE(failed.ok());
  EXPECT_THAT(failed.status().message(), HasSubstr("probe refused on purpose"));
  std::ifstream in(report);
  std::string probe_dir, mode;
  std::getline(in, probe_dir);
  std::getline(in, mode);
  EXPECT_EQ(std::filesystem::path(probe_dir).parent_path(), tmp.path());
  EXPECT_EQ(mode, "700");
  EXPECT_EQ(Entries(tmp.path()), before);

  options.stage_binary = hanging;
  options.timeout = absl::Seconds(1);
  auto timed_out = ProposeMeasuredPartition(options);
  EXPECT_EQ(timed_out.status().code(), absl::StatusCode::kDeadlineExceeded) << timed_out.status();
  EXPECT_EQ(Entries(tmp.path()), before);

  options = ProbeOptions(FixtureModel("llama"), 2);
  auto measured = ProposeMeasuredPartition(options);
  ASSERT_TRUE(measured.ok()) << measured.status();
  EXPECT_EQ(measured->profile.layers.size(), 4u);
  EXPECT_EQ(Entries(tmp.path()), before);
  EXPECT_EQ(ReadFile(victim), "precious");
}

TEST(MeasuredPartitionTest, ProbeErrorsAreReported) {
  auto missing = ProposeMeasuredPartition(ProbeOptions("/nonexistent/model", 2));
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("/nonexistent/model"));
}

}  // namespace
}  // namespace ringserve::testing
