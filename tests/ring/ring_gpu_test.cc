// GPU rings end to end (label gpu): real stage and coordinator processes whose stages run the
// CUDA backend, several of them on ONE GPU, joined by the cuda_ipc channel (or tcp). A
// multi-stage ring must give exactly the tokens of one CUDA stage (the same kernels on the same
// batches; only where the layers run changes), and the fixtures' golden greedy tokens from
// transformers. Skips without a GPU.
#include <cuda_runtime.h>

#include <fstream>
#include <random>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/ring/ring_harness.h"

namespace ringserve::testing {
namespace {

namespace v1 = ringserve::v1;

bool HaveGpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

struct Golden {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<int32_t>> greedy;
};

Golden LoadGolden(const std::string& arch) {
  std::ifstream in(FixtureModel(arch) + "/golden.json");
  nlohmann::json golden = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  Golden out;
  if (golden.is_discarded()) return out;
  for (const auto& p : golden["prompts"]) {
    out.prompts.push_back(p["token_ids"].get<std::vector<int32_t>>());
    out.greedy.push_back(p["greedy_token_ids"].get<std::vector<int32_t>>());
  }
  return out;
}

// One request at a time, so every ring sees the same micro-batches.
std::vector<std::vector<int32_t>> GenerateEach(Ring& ring,
                                               const std::vector<v1::GenerateRequest>& requests) {
  std::vector<std::vector<int32_t>> out;
  for (const v1::GenerateRequest& request : requests) {
    Generation g = ring.Generate(request);
    EXPECT_TRUE(g.status.ok()) << g.status.error_message() << "\n" << ring.CoordinatorLog();
    out.push_back(g.tokens);
  }
  return out;
}

struct GpuCase {
  std::string arch;
  std::vector<int> partition;
  std::string channel;
};

std::string CaseName(const ::testing::TestParamInfo<GpuCase>& info) {
  std::string name = info.param.arch + "_" + info.param.channel;
  for (int n : info.param.partition) name += "_" + std::to_string(n);
  return name;
}

class RingGpuTest : public ::testing::TestWithParam<GpuCase> {
 protected:
  void SetUp() override {
    if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(RingGpuTest, SameGreedyTokensAsOneStageAndTransformers) {
  const GpuCase& c = GetParam();
  Golden golden = LoadGolden(c.arch);
  ASSERT_FALSE(golden.prompts.empty());
  std::vector<v1::GenerateRequest> requests;
  for (size_t i = 0; i < golden.prompts.size(); ++i) {
    requests.push_back(IdsRequest(golden.prompts[i], static_cast<int>(golden.greedy[i].size())));
  }
  int layers = 0;
  for (int n : c.partition) layers += n;

  auto one = Ring::Start({.model_dir = FixtureModel(c.arch),
                          .partition = {layers},
                          .device = "cuda:0",
                          .channel = "tcp"});
  ASSERT_TRUE(one.ok()) << one.status();
  std::vector<std::vector<int32_t>> want = GenerateEach(**one, requests);
  one->reset();

  auto ring = Ring::Start({.model_dir = FixtureModel(c.arch),
                           .partition = c.partition,
                           .device = "cuda:0",
                           .channel = c.channel});
  ASSERT_TRUE(ring.ok()) << ring.status();
  std::vector<std::vector<int32_t>> got = GenerateEach(**ring, requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(got[i], want[i]) << "prompt " << i << ": " << c.partition.size()
                               << " stages differ from one stage";
    EXPECT_EQ(got[i], golden.greedy[i]) << "prompt " << i << ": differs from transformers";
  }
  auto stats = (*ring)->SettledStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  for (const auto& stage : stats->stages()) {
    EXPECT_GT(stage.steps(), 0) << "stage " << stage.index();
    EXPECT_EQ(stage.micro_batches_in_flight(), 0);
    if (stage.index() + 1 < stats->stages_size()) {
      EXPECT_GT(stage.bytes_sent(), 0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Rings, RingGpuTest,
                         ::testing::Values(GpuCase{"llama", {1, 1, 1, 1}, "cuda_ipc"},
                                           GpuCase{"llama", {2, 2}, "tcp"},
                                           GpuCase{"qwen3", {1, 2}, "cuda_ipc"},
                                           GpuCase{"qwen2", {2, 1}, "cuda_ipc"},
                                           GpuCase{"mistral", {1, 1, 1}, "cuda_ipc"}),
                         CaseName);

// The cuda_ipc sender's own copy stream (used between different GPUs: staging buffers, the
// transfer overlapping the next step) forced on one GPU: the same greedy tokens as
// transformers.
TEST(RingGpuE2ETest, CopyStreamTransfersKeepTheGreedyTokens) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  Golden golden = LoadGolden("llama");
  ASSERT_FALSE(golden.prompts.empty());
  std::vector<v1::GenerateRequest> requests;
  for (size_t i = 0; i < golden.prompts.size(); ++i) {
    requests.push_back(IdsRequest(golden.prompts[i], static_cast<int>(golden.greedy[i].size())));
  }
  // The stage processes inherit it.
  ASSERT_EQ(setenv("RINGSERVE_CUDA_IPC_COPY_STREAM", "always", 1), 0);
  auto ring = Ring::Start({.model_dir = FixtureModel("llama"),
                           .partition = {1, 1, 1, 1},
                           .device = "cuda:0",
                           .channel = "cuda_ipc"});
  unsetenv("RINGSERVE_CUDA_IPC_COPY_STREAM");
  ASSERT_TRUE(ring.ok()) << ring.status();
  std::vector<std::vector<int32_t>> got = GenerateEach(**ring, requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(got[i], golden.greedy[i]) << "prompt " << i << ": differs from transformers";
  }
}

// A stage refuses an unknown RINGSERVE_CUDA_IPC_COPY_STREAM value by name.
TEST(RingGpuE2ETest, UnknownCopyStreamModeIsRefused) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  ASSERT_EQ(setenv("RINGSERVE_CUDA_IPC_COPY_STREAM", "sometimes", 1), 0);
  auto ring = Ring::Start({.model_dir = FixtureModel("llama"),
                           .partition = {2, 2},
                           .device = "cuda:0",
                           .channel = "cuda_ipc"});
  unsetenv("RINGSERVE_CUDA_IPC_COPY_STREAM");
  ASSERT_FALSE(ring.ok());
  EXPECT_NE(ring.status().ToString().find("RINGSERVE_CUDA_IPC_COPY_STREAM"), std::string::npos)
      << ring.status();
}

// Several micro-batches in flight through a 4-stage cuda_ipc ring: stages that are not last
// return before their GPU work ran (the handoff is on the GPU), so a stage prepares the next
// micro-batch while earlier ones are still queued. Every copy of every golden prompt, all at
// once, still gets transformers' greedy tokens.
TEST(RingGpuE2ETest, MicroBatchesInFlightKeepTheGreedyTokens) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  Golden golden = LoadGolden("llama");
  ASSERT_FALSE(golden.prompts.empty());
  std::vector<v1::GenerateRequest> requests;
  std::vector<std::vector<int32_t>> want;
  for (int copy = 0; copy < 4; ++copy) {
    for (size_t i = 0; i < golden.prompts.size(); ++i) {
      requests.push_back(IdsRequest(golden.prompts[i], static_cast<int>(golden.greedy[i].size())));
      want.push_back(golden.greedy[i]);
    }
  }
  auto ring = Ring::Start({.model_dir = FixtureModel("llama"),
                           .partition = {1, 1, 1, 1},
                           .micro_batches_in_flight = 4,
                           .max_tokens_per_micro_batch = 16,
                           .device = "cuda:0",
                           .channel = "cuda_ipc"});
  ASSERT_TRUE(ring.ok()) << ring.status();
  std::vector<Generation> got(requests.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < requests.size(); ++i) {
    threads.emplace_back([&, i] { got[i] = (*ring)->Generate(requests[i]); });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(got[i].status.ok()) << "request " << i << ": " << got[i].status.error_message();
    EXPECT_EQ(got[i].tokens, want[i]) << "request " << i;
  }
  auto stats = (*ring)->SettledStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  for (const auto& stage : stats->stages()) EXPECT_GT(stage.mean_step_ms(), 0) << stage.index();
}

// Seeded sampling and greedy requests through a 4-stage cuda_ipc ring on one GPU give the
// same tokens as on one CUDA stage.
TEST(RingGpuE2ETest, SeededSamplingMatchesOneStage) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(5);
  std::vector<v1::GenerateRequest> requests;
  for (int i = 0; i < 12; ++i) {
    std::vector<int32_t> prompt(3 + 5 * i);
    for (auto& t : prompt) t = std::uniform_int_distribution<int32_t>(3, 500)(rng);
    requests.push_back(IdsRequest(prompt, 10));
    if (i % 2 == 0) {
      v1::SamplingParams* s = requests.back().mutable_sampling();
      s->set_temperature(0.9f);
      s->set_top_k(40);
      s->set_top_p(0.9f);
      s->set_seed(100 + i);
    }
  }
  std::vector<std::vector<std::vector<int32_t>>> results;
  for (std::vector<int> partition : std::vector<std::vector<int>>{{4}, {1, 1, 1, 1}}) {
    auto ring = Ring::Start({.model_dir = FixtureModel("llama"),
                             .partition = partition,
                             .device = "cuda:0",
                             .channel = "cuda_ipc"});
    ASSERT_TRUE(ring.ok()) << ring.status();
    results.push_back(GenerateEach(**ring, requests));
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(results[1][i], results[0][i]) << "request " << i;
    EXPECT_EQ(results[1][i].size(), 10u);
  }
}

// A one-stage ring with plans sent ahead leaves each step's sampling in flight and feeds the
// next step its tokens on the GPU (StepExecutor::Submit): every copy of every golden prompt, all
// at once, gets transformers' greedy tokens, and seeded and greedy requests get the same tokens
// as the same ring with each step's tokens through the host (RINGSERVE_SAMPLING_IN_FLIGHT=0).
TEST(RingGpuE2ETest, OneStageFeedsTokensOnTheDevice) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  Golden golden = LoadGolden("llama");
  ASSERT_FALSE(golden.prompts.empty());
  std::vector<v1::GenerateRequest> greedy;
  std::vector<std::vector<int32_t>> want;
  for (int copy = 0; copy < 3; ++copy) {
    for (size_t i = 0; i < golden.prompts.size(); ++i) {
      greedy.push_back(IdsRequest(golden.prompts[i], static_cast<int>(golden.greedy[i].size())));
      want.push_back(golden.greedy[i]);
    }
  }
  std::mt19937 rng(9);
  std::vector<v1::GenerateRequest> seeded;
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> prompt(4 + 7 * i);
    for (auto& t : prompt) t = std::uniform_int_distribution<int32_t>(3, 500)(rng);
    seeded.push_back(IdsRequest(prompt, 16));
    if (i % 2 == 0) {
      v1::SamplingParams* s = seeded.back().mutable_sampling();
      s->set_temperature(0.9f);
      s->set_top_p(0.95f);
      s->set_seed(300 + i);
    }
  }
  std::vector<std::vector<std::vector<int32_t>>> results;
  for (bool in_flight : {true, false}) {
    if (!in_flight) {
      ASSERT_EQ(setenv("RINGSERVE_SAMPLING_IN_FLIGHT", "0", 1), 0);
    }
    auto ring = Ring::Start({.model_dir = FixtureModel("llama"),
                             .partition = {4},
                             .device = "cuda:0",
                             .channel = "cuda_ipc"});
    unsetenv("RINGSERVE_SAMPLING_IN_FLIGHT");
    ASSERT_TRUE(ring.ok()) << ring.status();
    std::vector<Generation> got(greedy.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < greedy.size(); ++i) {
      threads.emplace_back([&, i] { got[i] = (*ring)->Generate(greedy[i]); });
    }
    for (auto& t : threads) t.join();
    for (size_t i = 0; i < greedy.size(); ++i) {
      ASSERT_TRUE(got[i].status.ok()) << "request " << i << ": " << got[i].status.error_message();
      EXPECT_EQ(got[i].tokens, want[i]) << "request " << i << (in_flight ? "" : ", host-fed");
    }
    results.push_back(GenerateEach(**ring, seeded));
    const bool fed = (*ring)->StagesLog().find("sampling left in flight") != std::string::npos;
    EXPECT_EQ(fed, in_flight) << (*ring)->StagesLog();
  }
  for (size_t i = 0; i < seeded.size(); ++i) {
    EXPECT_EQ(results[0][i], results[1][i]) << "request " << i;
    EXPECT_EQ(results[0][i].size(), 16u);
  }
}

}  // namespace
}  // namespace ringserve::testing
