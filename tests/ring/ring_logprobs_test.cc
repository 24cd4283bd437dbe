// Sampling outputs through a real 2-stage CPU ring (stage and coordinator processes on
// loopback, gRPC Generate) on the trained model (models/ringserve-tiny): each generated token's
// log-probability and top alternatives equal the log_softmax that prompt scoring of the same
// text computes (another code path on the last stage: ALL_TOKENS rows of a prefill chunk),
// min_tokens holds back stop ids, n choices follow seed + index and share the prompt's blocks,
// and bad values are refused by name.
#include <cmath>

#include "gtest/gtest.h"
#include "tests/ring/ring_harness.h"

namespace ringserve::testing {
namespace {

namespace v1 = ringserve::v1;

class RingLogprobsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto ring =
        Ring::Start({.model_dir = SourceDir() + "/models/ringserve-tiny", .partition = {3, 5}});
    ASSERT_TRUE(ring.ok()) << ring.status();
    ring_ = ring->release();
  }
  static void TearDownTestSuite() {
    delete ring_;
    ring_ = nullptr;
  }
  static Ring* ring_;
  const std::vector<int32_t> prompt_ = {0, 200, 31, 77, 450, 12, 999, 1500, 64, 300};
};
Ring* RingLogprobsTest::ring_ = nullptr;

TEST_F(RingLogprobsTest, GeneratedLogprobsEqualPromptScoring) {
  ASSERT_NE(ring_, nullptr);
  v1::GenerateRequest request = IdsRequest(prompt_, 5);
  request.mutable_sampling()->set_logprobs(true);
  request.mutable_sampling()->set_top_logprobs(4);
  request.mutable_sampling()->set_ignore_eos(true);
  Generation g = ring_->Generate(request);
  ASSERT_TRUE(g.status.ok()) << g.status.error_message();
  ASSERT_EQ(g.tokens.size(), 5u);
  ASSERT_EQ(g.logprobs.size(), 5u);

  // Score prompt + generated: entry i is log p(token i + 1 | tokens 0..i).
  std::vector<int32_t> text = prompt_;
  text.insert(text.end(), g.tokens.begin(), g.tokens.end());
  v1::GenerateRequest score = IdsRequest(text, 1);
  score.set_prompt_logprobs(true);
  Generation s = ring_->Generate(score);
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  ASSERT_EQ(s.prompt_logprobs.size(), text.size() - 1);

  for (size_t t = 0; t < g.tokens.size(); ++t) {
    const v1::TokenLogprob& lp = g.logprobs[t];
    EXPECT_EQ(lp.token_id(), g.tokens[t]);
    EXPECT_NEAR(lp.logprob(), s.prompt_logprobs[prompt_.size() - 1 + t], 1e-4) << "token " << t;
    ASSERT_EQ(lp.top_token_ids_size(), 4);
    ASSERT_EQ(lp.top_logprobs_size(), 4);
    // Greedy: the sampled token is the most likely; the list is sorted; the probabilities of
    // the alternatives sum to at most 1.
    EXPECT_EQ(lp.top_token_ids(0), lp.token_id());
    EXPECT_FLOAT_EQ(lp.top_logprobs(0), lp.logprob());
    double mass = 0;
    for (int k = 0; k < 4; ++k) {
      if (k > 0) {
        EXPECT_LE(lp.top_logprobs(k), lp.top_logprobs(k - 1));
      }
      EXPECT_LE(lp.top_logprobs(k), 0.0f);
      mass += std::exp(lp.top_logprobs(k));
    }
    EXPECT_LE(mass, 1.0 + 1e-5);
  }
  // Scoring a second alternative: text with the runner-up at the first generated position.
  std::vector<int32_t> alt = prompt_;
  alt.push_back(g.logprobs[0].top_token_ids(1));
  v1::GenerateRequest alt_score = IdsRequest(alt, 1);
  alt_score.set_prompt_logprobs(true);
  Generation a = ring_->Generate(alt_score);
  ASSERT_TRUE(a.status.ok());
  ASSERT_EQ(a.prompt_logprobs.size(), alt.size() - 1);
  EXPECT_NEAR(a.prompt_logprobs.back(), g.logprobs[0].top_logprobs(1), 1e-4);
}

TEST_F(RingLogprobsTest, SampledTokensReportTheirRawLogprob) {
  ASSERT_NE(ring_, nullptr);
  v1::GenerateRequest request = IdsRequest(prompt_, 6);
  request.mutable_sampling()->set_temperature(1.3f);
  request.mutable_sampling()->set_seed(42);
  request.mutable_sampling()->set_logprobs(true);
  request.mutable_sampling()->set_ignore_eos(true);
  Generation g1 = ring_->Generate(request);
  Generation g2 = ring_->Generate(request);
  ASSERT_TRUE(g1.status.ok() && g2.status.ok());
  EXPECT_EQ(g1.tokens, g2.tokens) << "same seed, same tokens";
  ASSERT_EQ(g1.logprobs.size(), g1.tokens.size());
  std::vector<int32_t> text = prompt_;
  text.insert(text.end(), g1.tokens.begin(), g1.tokens.end());
  v1::GenerateRequest score = IdsRequest(text, 1);
  score.set_prompt_logprobs(true);
  Generation s = ring_->Generate(score);
  ASSERT_TRUE(s.status.ok());
  for (size_t t = 0; t < g1.tokens.size(); ++t) {
    EXPECT_EQ(g1.logprobs[t].top_token_ids_size(), 0);
    // Raw logits (no temperature), as OpenAI and vLLM report.
    EXPECT_NEAR(g1.logprobs[t].logprob(), s.prompt_logprobs[prompt_.size() - 1 + t], 1e-4);
  }
}

TEST_F(RingLogprobsTest, MinTokensHoldsBackStopIds) {
  ASSERT_NE(ring_, nullptr);
  Generation free = ring_->Generate(IdsRequest(prompt_, 4));
  ASSERT_TRUE(free.status.ok());
  ASSERT_FALSE(free.tokens.empty());
  const int32_t stop = free.tokens[0];
  v1::GenerateRequest stopped = IdsRequest(prompt_, 4);
  stopped.mutable_sampling()->add_stop_token_ids(stop);
  Generation without = ring_->Generate(stopped);
  ASSERT_TRUE(without.status.ok());
  EXPECT_EQ(without.tokens, std::vector<int32_t>{stop}) << "the stop id ends it at once";

  stopped.mutable_sampling()->set_min_tokens(3);
  Generation held = ring_->Generate(stopped);
  ASSERT_TRUE(held.status.ok()) << held.status.error_message();
  ASSERT_GE(held.tokens.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_NE(held.tokens[i], stop) << "token " << i;
}

// n choices: choice i samples with seed + i (the same tokens as a request of that seed alone),
// and choices 1.. take the prompt's full KV blocks from the prefix cache.
TEST_F(RingLogprobsTest, ChoicesShareThePromptAndFollowSeedPlusIndex) {
  ASSERT_NE(ring_, nullptr);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 70; ++i) prompt.push_back(100 + (i * 37) % 3000);  // 4 full blocks of 16
  v1::GenerateRequest request = IdsRequest(prompt, 5);
  request.mutable_sampling()->set_temperature(1.0f);
  request.mutable_sampling()->set_seed(900);
  request.mutable_sampling()->set_ignore_eos(true);
  auto before = ring_->SettledStats();
  ASSERT_TRUE(before.ok()) << before.status();
  request.set_n(3);
  Generation all = ring_->Generate(request);
  ASSERT_TRUE(all.status.ok()) << all.status.error_message();
  auto after = ring_->SettledStats();
  ASSERT_TRUE(after.ok()) << after.status();
  ASSERT_EQ(all.choices.size(), 3u);
  EXPECT_EQ(all.completion_tokens, 15);
  EXPECT_GE(after->prefix_hit_tokens() - before->prefix_hit_tokens(), 2 * 64)
      << "choices 1 and 2 reuse the prompt's 4 full blocks";
  request.set_n(1);
  for (int i = 0; i < 3; ++i) {
    request.mutable_sampling()->set_seed(900 + i);
    Generation one = ring_->Generate(request);
    ASSERT_TRUE(one.status.ok());
    EXPECT_EQ(all.choices[i], one.tokens) << "choice " << i;
  }
  request.set_n(17);
  EXPECT_EQ(ring_->Generate(request).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(RingLogprobsTest, BadValuesAreRefusedByName) {
  ASSERT_NE(ring_, nullptr);
  auto refused = [&](const std::function<void(v1::SamplingParams*)>& set, const std::string& name) {
    v1::GenerateRequest request = IdsRequest(prompt_, 4);
    set(request.mutable_sampling());
    Generation g = ring_->Generate(request);
    EXPECT_EQ(g.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << name;
    EXPECT_NE(g.status.error_message().find(name), std::string::npos) << g.status.error_message();
  };
  refused(
      [](v1::SamplingParams* s) {
        s->set_logprobs(true);
        s->set_top_logprobs(21);
      },
      "top_logprobs");
  refused([](v1::SamplingParams* s) { s->set_top_logprobs(2); }, "top_logprobs");
  refused([](v1::SamplingParams* s) { s->set_min_tokens(5); }, "min_tokens");
  refused([](v1::SamplingParams* s) { s->add_stop_token_ids(1 << 20); }, "stop_token_ids");
}

}  // namespace
}  // namespace ringserve::testing
