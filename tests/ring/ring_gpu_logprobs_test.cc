// Log-probabilities through a GPU ring (label gpu; skips without a GPU): prompt log-probabilities
// (ALL_TOKENS logits, a prompt longer than one lm_head pass of the CUDA last stage), top
// log-probabilities and min_tokens, on the trained model (models/ringserve-tiny), through a
// 2-stage CUDA ring on one GPU against a 2-stage CPU ring: equal within bf16 tolerance (the
// CUDA slice keeps activations in bf16 between kernels, the CPU slice in fp32).
#include <cuda_runtime.h>

#include <cmath>

#include "fmt/format.h"
#include "gtest/gtest.h"
#include "tests/ring/ring_harness.h"

namespace ringserve::testing {
namespace {

namespace v1 = ringserve::v1;

bool HaveGpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

std::string TrainedModel() { return SourceDir() + "/models/ringserve-tiny"; }

std::vector<int32_t> LongPrompt(Ring& ring) {
  v1::TokenizeRequest request;
  std::string text;
  for (int i = 0; text.size() < 3000; ++i) {
    text += fmt::format(
        "And it came to pass in the {} year, that the king went up to the house of the LORD, "
        "and all the men of Judah with him. ",
        i + 1);
  }
  request.set_text(text);
  request.set_add_special_tokens(true);
  v1::TokenizeResponse response;
  grpc::ClientContext context;
  EXPECT_TRUE(ring.stub().Tokenize(&context, request, &response).ok());
  std::vector<int32_t> ids(response.token_ids().begin(), response.token_ids().end());
  if (ids.size() > 700) ids.resize(700);
  return ids;
}

struct Outputs {
  Generation scored;  // prompt log-probabilities, greedy, top-5 logprobs
  Generation held;    // min_tokens with the unconstrained first token as a stop id
  Generation unconstrained;
};

Outputs RunOn(const std::string& device, const std::vector<int32_t>& prompt) {
  Outputs out;
  auto ring = Ring::Start({.model_dir = TrainedModel(),
                           .partition = {4, 4},
                           .device = device,
                           .channel = device == "cpu" ? "tcp" : "cuda_ipc"});
  EXPECT_TRUE(ring.ok()) << ring.status();
  if (!ring.ok()) return out;
  v1::GenerateRequest scored = IdsRequest(prompt, 6);
  scored.set_prompt_logprobs(true);
  scored.mutable_sampling()->set_logprobs(true);
  scored.mutable_sampling()->set_top_logprobs(5);
  out.scored = (*ring)->Generate(scored);
  EXPECT_TRUE(out.scored.status.ok()) << out.scored.status.error_message();

  const std::vector<int32_t> short_prompt(prompt.begin(), prompt.begin() + 40);
  out.unconstrained = (*ring)->Generate(IdsRequest(short_prompt, 4));
  if (out.unconstrained.tokens.empty()) return out;
  v1::GenerateRequest held = IdsRequest(short_prompt, 4);
  held.mutable_sampling()->add_stop_token_ids(out.unconstrained.tokens[0]);
  held.mutable_sampling()->set_min_tokens(3);
  out.held = (*ring)->Generate(held);
  EXPECT_TRUE(out.held.status.ok()) << out.held.status.error_message();
  return out;
}

TEST(RingGpuLogprobsTest, GpuRingMatchesCpuRingWithinBf16) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device";
  std::vector<int32_t> prompt;
  {
    auto ring = Ring::Start({.model_dir = TrainedModel(), .partition = {8}});
    ASSERT_TRUE(ring.ok()) << ring.status();
    prompt = LongPrompt(**ring);
  }
  ASSERT_GT(prompt.size(), 600u);  // beyond one lm_head pass (max_logit_rows 256)
  const Outputs cpu = RunOn("cpu", prompt);
  const Outputs gpu = RunOn("cuda:0", prompt);

  // Prompt log-probabilities.
  ASSERT_EQ(cpu.scored.prompt_logprobs.size(), prompt.size() - 1);
  ASSERT_EQ(gpu.scored.prompt_logprobs.size(), prompt.size() - 1);
  double cpu_nll = 0, gpu_nll = 0, max_diff = 0;
  for (size_t i = 0; i < prompt.size() - 1; ++i) {
    const float c = cpu.scored.prompt_logprobs[i], g = gpu.scored.prompt_logprobs[i];
    ASSERT_TRUE(std::isfinite(c) && std::isfinite(g)) << "position " << i + 1;
    cpu_nll -= c;
    gpu_nll -= g;
    max_diff = std::max(max_diff, std::abs(static_cast<double>(c) - g));
  }
  EXPECT_LT(max_diff, 0.15) << "one prompt token's logprob differs beyond bf16 noise";
  EXPECT_NEAR(gpu_nll / cpu_nll, 1.0, 2e-3) << "cpu " << cpu_nll << " gpu " << gpu_nll;

  // Top log-probabilities of the generated tokens: the same greedy tokens, each the most likely
  // of its row, the top lists in order and close.
  ASSERT_EQ(cpu.scored.logprobs.size(), cpu.scored.tokens.size());
  ASSERT_EQ(gpu.scored.logprobs.size(), gpu.scored.tokens.size());
  EXPECT_EQ(gpu.scored.tokens, cpu.scored.tokens);
  for (size_t t = 0; t < gpu.scored.logprobs.size() && t < cpu.scored.logprobs.size(); ++t) {
    const v1::TokenLogprob& g = gpu.scored.logprobs[t];
    const v1::TokenLogprob& c = cpu.scored.logprobs[t];
    ASSERT_EQ(g.top_token_ids_size(), 5);
    EXPECT_EQ(g.top_token_ids(0), g.token_id()) << "greedy token " << t;
    EXPECT_NEAR(g.top_logprobs(0), g.logprob(), 1e-6);
    EXPECT_NEAR(g.logprob(), c.logprob(), 0.1) << "token " << t;
    for (int k = 1; k < 5; ++k) {
      EXPECT_LE(g.top_logprobs(k), g.top_logprobs(k - 1));
    }
    EXPECT_EQ(g.top_token_ids(0), c.top_token_ids(0));
  }

  // min_tokens: the stop id is held back for the first 3 tokens on both.
  for (const Outputs* o : {&cpu, &gpu}) {
    ASSERT_FALSE(o->unconstrained.tokens.empty());
    ASSERT_GE(o->held.tokens.size(), 3u);
    for (int i = 0; i < 3; ++i) EXPECT_NE(o->held.tokens[i], o->unconstrained.tokens[0]);
  }
  EXPECT_EQ(gpu.held.tokens, cpu.held.tokens);
}

}  // namespace
}  // namespace ringserve::testing
