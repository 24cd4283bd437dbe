// The trained demo model (models/ringserve-tiny) through a 2-stage CPU ring, against what
// transformers computed from the same bf16 weights when the model was trained
// (scripts/train_small_model.py -> tests/fixtures/trained/): greedy continuations, prompt
// log-probabilities and the perplexity of a held-out document.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>

#include "bench/perplexity/perplexity.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/ring/perplexity_golden_testing.h"
#include "tests/ring/ring_harness.h"

namespace ringserve::testing {
namespace {

namespace v1 = ringserve::v1;

// Transformers and the CPU stage both compute in fp32 from the bf16 weights, in different
// orders: greedy steps whose top-2 logits lie closer than this are not compared.
constexpr double kMinGreedyMargin = 1e-3;
constexpr double kLogprobTolerance = 2e-3;
constexpr int32_t kBos = 0;  // models/ringserve-tiny/config.json
constexpr int32_t kEos = 1;

nlohmann::json ReadFixture(const std::string& name) {
  std::ifstream in(SourceDir() + "/tests/fixtures/trained/" + name);
  return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
}

class TrainedModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto ring =
        Ring::Start({.model_dir = SourceDir() + "/models/ringserve-tiny", .partition = {4, 4}});
    ASSERT_TRUE(ring.ok()) << ring.status();
    ring_ = std::move(ring).value().release();
  }
  static void TearDownTestSuite() {
    delete ring_;
    ring_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(ring_, nullptr); }
  static Ring* ring_;
};

Ring* TrainedModelTest::ring_ = nullptr;

TEST_F(TrainedModelTest, GreedyContinuationEqualsTransformers) {
  nlohmann::json golden = ReadFixture("greedy_golden.json");
  ASSERT_FALSE(golden.is_discarded());
  int compared = 0;
  for (const auto& p : golden["prompts"]) {
    const std::string prompt = p["prompt"].get<std::string>();
    SCOPED_TRACE(prompt);
    if (p["min_margin"].get<double>() < kMinGreedyMargin) continue;  // a near tie
    const auto expected = p["greedy_ids"].get<std::vector<int32_t>>();
    Generation by_ids = ring_->Generate(
        IdsRequest(p["prompt_ids"].get<std::vector<int32_t>>(), static_cast<int>(expected.size())));
    ASSERT_TRUE(by_ids.status.ok()) << by_ids.status.error_message();
    EXPECT_EQ(by_ids.tokens, expected);

    // The same prompt as text: the coordinator's tokenizer adds BOS, the text streams back.
    v1::GenerateRequest request;
    request.set_text(prompt);
    request.set_add_special_tokens(true);
    request.mutable_sampling()->set_max_tokens(static_cast<int>(expected.size()));
    request.mutable_sampling()->set_ignore_eos(true);
    Generation by_text = ring_->Generate(request);
    ASSERT_TRUE(by_text.status.ok()) << by_text.status.error_message();
    EXPECT_EQ(by_text.tokens, expected);
    // The golden text shows special tokens; the stream hides them.
    const bool has_special = std::any_of(expected.begin(), expected.end(),
                                         [](int32_t id) { return id == kBos || id == kEos; });
    if (!has_special) {
      EXPECT_EQ(by_text.text, p["greedy_text"].get<std::string>());
    }
    ++compared;
  }
  EXPECT_GE(compared, 4);
}

TEST_F(TrainedModelTest, PromptLogprobsEqualTransformers) {
  nlohmann::json golden = ReadFixture("greedy_golden.json");
  ASSERT_FALSE(golden.is_discarded());
  for (const auto& p : golden["prompts"]) {
    SCOPED_TRACE(p["prompt"].get<std::string>());
    v1::GenerateRequest request = IdsRequest(p["prompt_ids"].get<std::vector<int32_t>>(), 1);
    request.set_prompt_logprobs(true);
    Generation g = ring_->Generate(request);
    ASSERT_TRUE(g.status.ok()) << g.status.error_message();
    const auto expected = p["prompt_logprobs"].get<std::vector<double>>();
    ASSERT_EQ(g.prompt_logprobs.size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_NEAR(g.prompt_logprobs[i], expected[i], kLogprobTolerance) << "position " << i + 1;
    }
  }
  // Without the flag, none come back.
  Generation plain = ring_->Generate(IdsRequest({0, 100, 200}, 1));
  ASSERT_TRUE(plain.status.ok());
  EXPECT_TRUE(plain.prompt_logprobs.empty());
}

TEST_F(TrainedModelTest, PerplexityOfAHeldOutDocumentEqualsTransformers) {
  nlohmann::json golden = ReadFixture("perplexity_golden.json");
  ASSERT_FALSE(golden.is_discarded());
  auto report = MeasureGoldenPerplexity(ring_->stub(), golden);
  ASSERT_TRUE(report.ok()) << report.status();
  const auto& windows = golden["windows"];
  ASSERT_EQ(report->windows.size(), windows.size());
  for (size_t i = 0; i < windows.size(); ++i) {
    EXPECT_EQ(report->windows[i].start, windows[i]["start"].get<int>());
    EXPECT_EQ(report->windows[i].scored, windows[i]["scored"].get<int>());
    const double nll = windows[i]["nll"].get<double>();
    EXPECT_NEAR(report->windows[i].nll, nll, 1e-4 * nll) << "window " << i;
  }
}

}  // namespace
}  // namespace ringserve::testing
