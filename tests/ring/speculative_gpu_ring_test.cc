// Speculative decoding through a one-stage CUDA ring (label gpu; skips without a GPU): the draft
// model on the GPU drafts greedily round after round with each round fed the previous round's
// argmax on the device (DraftModel::ProposeFed). The draft drafting for itself must see nearly
// every draft accepted (a round fed a wrong token would be rejected from there on), and the
// trained pair's greedy output equals plain decoding on the same GPU.
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/ring/ring_harness.h"

namespace ringserve::testing {
namespace {

namespace v1 = ringserve::v1;

constexpr int kMaxTokens = 40;

bool HaveGpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

std::vector<v1::GenerateRequest> Requests() {
  std::vector<v1::GenerateRequest> requests;
  for (const char* text :
       {"In the beginning God created the heaven and the earth. And the earth was without form.",
        "And it came to pass, when the king of Israel heard the words of the book of the law",
        "And the LORD spake unto Moses, saying, Speak unto the children of Israel"}) {
    requests.push_back(GreedyTextRequest(text, kMaxTokens));
  }
  return requests;
}

// Speculation forced on (no payoff back-off), k = 4.
RingOptions OneCudaStage(const std::string& model, int layers, bool speculate) {
  RingOptions options{.model_dir = SourceDir() + "/" + model,
                      .partition = {layers},
                      .device = "cuda:0",
                      .channel = "cuda_ipc"};
  if (speculate) {
    options.coordinator_args = {"--speculative_model", SourceDir() + "/models/ringserve-tiny-draft",
                                "--num_speculative_tokens", "4", "--speculative_payoff=false"};
  }
  return options;
}

TEST(SpeculativeGpuRingTest, ADraftOfItselfIsAlmostAlwaysAccepted) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  auto ring = Ring::Start(OneCudaStage("models/ringserve-tiny-draft", 2, /*speculate=*/true));
  ASSERT_TRUE(ring.ok()) << ring.status();
  for (const Generation& g : GenerateConcurrently(**ring, Requests())) {
    ASSERT_TRUE(g.status.ok()) << g.status.error_message() << "\n" << (*ring)->StagesLog();
    EXPECT_EQ(g.tokens.size(), static_cast<size_t>(kMaxTokens));
  }
  auto stats = (*ring)->SettledStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  ASSERT_GT(stats->speculative_drafts_verified(), 3 * kMaxTokens / 2);
  // bf16 rows of a 1-token draft step and a 5-token verification chunk may flip a near tie.
  EXPECT_GE(stats->speculative_drafts_accepted(), stats->speculative_drafts_verified() * 85 / 100);
}

TEST(SpeculativeGpuRingTest, GreedyEqualsPlainDecoding) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  std::vector<std::vector<int32_t>> plain;
  {
    auto ring = Ring::Start(OneCudaStage("models/ringserve-tiny", 8, /*speculate=*/false));
    ASSERT_TRUE(ring.ok()) << ring.status();
    for (const Generation& g : GenerateConcurrently(**ring, Requests())) {
      ASSERT_TRUE(g.status.ok()) << g.status.error_message();
      plain.push_back(g.tokens);
    }
  }
  auto ring = Ring::Start(OneCudaStage("models/ringserve-tiny", 8, /*speculate=*/true));
  ASSERT_TRUE(ring.ok()) << ring.status();
  const std::vector<Generation> got = GenerateConcurrently(**ring, Requests());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i].status.ok()) << got[i].status.error_message();
    EXPECT_EQ(got[i].tokens, plain[i]) << "request " << i;
  }
  auto stats = (*ring)->SettledStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_GT(stats->speculative_drafts_accepted(), 0);
}

}  // namespace
}  // namespace ringserve::testing
