// Speculative decoding through real CPU rings (stage and coordinator processes, tcp): the
// trained pair models/ringserve-tiny (target) and models/ringserve-tiny-draft (draft, same
// tokenizer). Greedy output equals plain decoding, through a 2-stage and a 1-stage ring, with
// several micro-batches in flight, chunked prefill, a KV cache small enough to preempt, and the
// prefix cache; seeded sampling replays; the drafts are accepted often enough to matter.
#include <cstdio>
#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/ring/ring_harness.h"

namespace ringserve::testing {
namespace {

namespace v1 = ringserve::v1;

constexpr int kMaxTokens = 40;

std::vector<v1::GenerateRequest> Requests() {
  std::vector<v1::GenerateRequest> requests;
  for (const char* text :
       {"In the beginning God created the heaven and the earth. And the earth was without form, "
        "and "
        "void; and darkness was upon the face of the deep.",
        "And it came to pass, when the king of Israel heard the words of the book of the law, that "
        "he rent his clothes.",
        "CYNIC, n. A blackguard whose faulty vision sees things as they are, not as they ought to "
        "be.",
        "And the LORD spake unto Moses, saying, Speak unto the children of Israel, and say unto "
        "them, When ye be come into the land"}) {
    requests.push_back(GreedyTextRequest(text, kMaxTokens));
  }
  return requests;
}

// Speculation pays less than plain decoding on the CPU: with the payoff measured (`payoff`) it
// backs off after measuring both modes; the tests that check the speculating path turn it off.
std::vector<std::string> SpeculationArgs(int k, bool payoff = false) {
  return {"--speculative_model", SourceDir() + "/models/ringserve-tiny-draft",
          "--num_speculative_tokens", std::to_string(k),
          payoff ? "--speculative_payoff=true" : "--speculative_payoff=false"};
}

class SpeculativeRingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto plain =
        Ring::Start({.model_dir = SourceDir() + "/models/ringserve-tiny", .partition = {4, 4}});
    ASSERT_TRUE(plain.ok()) << plain.status();
    plain_ = std::move(plain).value().release();
    for (const Generation& g : GenerateConcurrently(*plain_, Requests())) {
      ASSERT_TRUE(g.status.ok()) << g.status.error_message();
      expected_.push_back(g.tokens);
    }
  }
  static void TearDownTestSuite() {
    delete plain_;
    plain_ = nullptr;
    expected_.clear();
  }
  void SetUp() override { ASSERT_NE(plain_, nullptr); }

  // Runs the requests through `ring` and checks them against plain decoding.
  static void ExpectPlainGreedy(Ring& ring) {
    std::vector<Generation> got = GenerateConcurrently(ring, Requests());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(got[i].status.ok()) << got[i].status.error_message();
      EXPECT_EQ(got[i].tokens, expected_[i]) << "request " << i;
    }
    // Once more: the prompts now come from the prefix cache.
    got = GenerateConcurrently(ring, Requests());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(got[i].status.ok()) << got[i].status.error_message();
      EXPECT_EQ(got[i].tokens, expected_[i]) << "request " << i << " (prefix cached)";
    }
  }

  static Ring* plain_;
  static std::vector<std::vector<int32_t>> expected_;
};

Ring* SpeculativeRingTest::plain_ = nullptr;
std::vector<std::vector<int32_t>> SpeculativeRingTest::expected_;

TEST_F(SpeculativeRingTest, TwoStagesGreedyEqualsPlainDecoding) {
  // Two micro-batches in flight, prefill chunks of 8 tokens, 10 KV blocks of 16 positions for
  // four sequences of ~70 positions each: chunked prefill and preemption happen; the second
  // round finds the prompts' full blocks in the prefix cache.
  auto ring = Ring::Start({.model_dir = SourceDir() + "/models/ringserve-tiny",
                           .partition = {4, 4},
                           .micro_batches_in_flight = 2,
                           .max_tokens_per_micro_batch = 8,
                           .kv_blocks = 10,
                           .coordinator_args = SpeculationArgs(4)});
  ASSERT_TRUE(ring.ok()) << ring.status();
  ExpectPlainGreedy(**ring);
  auto stats = (*ring)->SettledStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  std::printf("speculation: %lld verification steps, %lld of %lld drafts accepted, %lld tokens\n",
              static_cast<long long>(stats->speculative_verifications()),
              static_cast<long long>(stats->speculative_drafts_accepted()),
              static_cast<long long>(stats->speculative_drafts_verified()),
              static_cast<long long>(stats->speculative_verification_tokens()));
  EXPECT_GT(stats->speculative_drafts_verified(), 0);
  // The trained draft agrees with the target on many greedy tokens of this text.
  EXPECT_GT(stats->speculative_drafts_accepted(), stats->speculative_drafts_verified() / 3);
  EXPECT_GT(stats->preemptions(), 0);
  EXPECT_GT(stats->prefix_hit_tokens(), 0);
}

TEST_F(SpeculativeRingTest, OneStageGreedyEqualsPlainDecoding) {
  // With the payoff measured: sequences switch between speculating and plain decoding planned
  // ahead mid-request.
  auto ring = Ring::Start({.model_dir = SourceDir() + "/models/ringserve-tiny",
                           .partition = {8},
                           .coordinator_args = SpeculationArgs(3, /*payoff=*/true)});
  ASSERT_TRUE(ring.ok()) << ring.status();
  ExpectPlainGreedy(**ring);
}

TEST_F(SpeculativeRingTest, FourStagesGreedyEqualsPlainDecoding) {
  // Four chains of micro-batches in flight (none planned ahead while sequences speculate), the
  // sequences spread over them.
  auto ring = Ring::Start({.model_dir = SourceDir() + "/models/ringserve-tiny",
                           .partition = {2, 2, 2, 2},
                           .coordinator_args = SpeculationArgs(4)});
  ASSERT_TRUE(ring.ok()) << ring.status();
  ExpectPlainGreedy(**ring);
  auto stats = (*ring)->SettledStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_GT(stats->speculative_drafts_accepted(), 0);
}

TEST_F(SpeculativeRingTest, SeededSamplingReplays) {
  auto ring = Ring::Start({.model_dir = SourceDir() + "/models/ringserve-tiny",
                           .partition = {4, 4},
                           .coordinator_args = SpeculationArgs(4)});
  ASSERT_TRUE(ring.ok()) << ring.status();
  v1::GenerateRequest request = Requests()[0];
  request.mutable_sampling()->set_temperature(0.8f);
  request.mutable_sampling()->set_top_k(50);
  request.mutable_sampling()->set_seed(1234);
  Generation first = (*ring)->Generate(request);
  Generation second = (*ring)->Generate(request);
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  ASSERT_TRUE(second.status.ok()) << second.status.error_message();
  EXPECT_EQ(first.tokens.size(), static_cast<size_t>(kMaxTokens));
  EXPECT_EQ(first.tokens, second.tokens);
}

// The draft model drafting for itself: every greedy draft must be accepted, so a context the
// last stage got wrong (an off-by-one in what the coordinator tells it, a stale draft cache
// after a rollback) shows up as rejections here, while the output would still be right.
TEST(SpeculativeRingSelfDraftTest, ADraftOfItselfIsAlwaysAccepted) {
  auto ring = Ring::Start({.model_dir = SourceDir() + "/models/ringserve-tiny-draft",
                           .partition = {1, 1},
                           .micro_batches_in_flight = 2,
                           .coordinator_args = SpeculationArgs(4)});
  ASSERT_TRUE(ring.ok()) << ring.status();
  for (const Generation& g : GenerateConcurrently(**ring, Requests())) {
    ASSERT_TRUE(g.status.ok()) << g.status.error_message();
    EXPECT_EQ(g.tokens.size(), static_cast<size_t>(kMaxTokens));
  }
  auto stats = (*ring)->SettledStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  ASSERT_GT(stats->speculative_drafts_verified(), 4 * kMaxTokens / 2);
  // fp32 rows computed in different batch shapes may flip a near tie, rarely.
  EXPECT_GE(stats->speculative_drafts_accepted(), stats->speculative_drafts_verified() * 95 / 100);
  EXPECT_GT(stats->speculative_verification_tokens(), 3 * stats->speculative_verifications());
}

// DeepSeek's MTP layer drafting on the CPU last stage (random-weight fixture with a dense MTP
// layer): greedy output equals plain decoding through 1 and 2 stages, and drafts were verified.
TEST(SpeculativeRingMtpTest, MtpGreedyEqualsPlainDecoding) {
  const std::string model = FixtureModel("deepseek_v3");
  std::vector<v1::GenerateRequest> requests;
  for (int i = 0; i < 3; ++i) {
    std::vector<int32_t> prompt;
    for (int t = 0; t < 9 + 5 * i; ++t) prompt.push_back((7 * t + 13 * i + 3) % 120 + 2);
    requests.push_back(IdsRequest(prompt, 24));
  }
  auto plain = Ring::Start({.model_dir = model, .partition = {2, 2}});
  ASSERT_TRUE(plain.ok()) << plain.status();
  std::vector<Generation> expected = GenerateConcurrently(**plain, requests);
  for (const std::vector<int>& partition : {std::vector<int>{2, 2}, std::vector<int>{4}}) {
    auto ring = Ring::Start({.model_dir = model,
                             .partition = partition,
                             .coordinator_args = {"--speculative_mtp", "--num_speculative_tokens",
                                                  "1", "--speculative_payoff=false"}});
    ASSERT_TRUE(ring.ok()) << ring.status();
    std::vector<Generation> got = GenerateConcurrently(**ring, requests);
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(got[i].status.ok()) << got[i].status.error_message();
      EXPECT_EQ(got[i].tokens, expected[i].tokens) << "request " << i;
    }
    auto stats = (*ring)->SettledStats();
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_GT(stats->speculative_drafts_verified(), 0);
    std::printf("mtp, %zu stage(s): %lld of %lld drafts accepted\n", partition.size(),
                static_cast<long long>(stats->speculative_drafts_accepted()),
                static_cast<long long>(stats->speculative_drafts_verified()));
  }
}

TEST(SpeculativeRingFlagsTest, BadSpeculationFlagsAreRefused) {
  auto result = RunCoordinatorToExit({"--num_speculative_tokens", "0", "--speculative_model",
                                      SourceDir() + "/models/ringserve-tiny-draft"},
                                     absl::Seconds(30));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_NE(result->exit_code, 0);
  EXPECT_THAT(result->stderr_text, ::testing::HasSubstr("--num_speculative_tokens"));
}

}  // namespace
}  // namespace ringserve::testing
