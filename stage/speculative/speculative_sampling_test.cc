// Speculative sampling: greedy verification equals plain greedy decoding, and rejection
// sampling emits tokens distributed exactly as the target's sampler (chi-square over many
// seeded trials with fixed target and draft distributions on a tiny vocabulary).
#include "stage/speculative/speculative_sampling.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "stage/sampling/sampler.h"

namespace ringserve {
namespace {

constexpr int kVocab = 6;
// The 0.999 quantile of chi-square with 5 degrees of freedom: a correct sampler fails one run
// in a thousand (the trials are seeded, so the test is deterministic).
constexpr double kChiSquare5 = 20.52;

double ChiSquare(const std::vector<int>& counts, const std::vector<double>& probs) {
  int total = 0;
  for (int c : counts) total += c;
  double chi = 0.0;
  for (size_t v = 0; v < counts.size(); ++v) {
    const double expected = probs[v] * total;
    if (expected == 0.0) {
      if (counts[v] != 0) return 1e9;  // a token the target never draws
      continue;
    }
    chi += (counts[v] - expected) * (counts[v] - expected) / expected;
  }
  return chi;
}

TEST(SpeculativeSamplingTest, DistributionMatchesTheSampler) {
  const std::vector<float> logits = {1.0f, 2.5f, 0.3f, 2.5f, -1.0f, 0.9f};
  for (SamplingConfig config :
       {SamplingConfig{.temperature = 0.8f}, SamplingConfig{.temperature = 1.3f, .top_k = 4},
        SamplingConfig{.temperature = 1.0f, .top_p = 0.7f}}) {
    const std::vector<double> probs = SamplingDistribution(logits, config);
    double sum = 0.0;
    for (double p : probs) sum += p;
    EXPECT_NEAR(sum, 1.0, 1e-9);
    std::vector<int> counts(kVocab, 0);
    for (uint64_t seed = 1; seed <= 20000; ++seed) {
      config.seed = seed;
      ++counts[SampleRow(logits, RowSampling{.config = config, .token_index = 7})];
    }
    EXPECT_LT(ChiSquare(counts, probs), kChiSquare5) << "temperature " << config.temperature;
  }
}

TEST(SpeculativeSamplingTest, GreedyAcceptsWhileTheArgmaxAgrees) {
  // Row i's argmax: 2, 4, 1.
  const std::vector<float> rows = {0, 0, 9, 0, 0, 0,  //
                                   0, 0, 0, 0, 9, 0,  //
                                   0, 9, 0, 0, 0, 0};
  RowSampling greedy{.config = SamplingConfig{}, .token_index = 3};
  Verification all = VerifyDrafts(rows, kVocab, std::vector<int32_t>{2, 4}, {}, greedy);
  EXPECT_EQ(all.accepted, (std::vector<int32_t>{2, 4}));
  EXPECT_EQ(all.token, 1);  // the bonus token
  Verification second = VerifyDrafts(rows, kVocab, std::vector<int32_t>{2, 5}, {}, greedy);
  EXPECT_EQ(second.accepted, (std::vector<int32_t>{2}));
  EXPECT_EQ(second.token, 4);  // the correction
  Verification none = VerifyDrafts(rows, kVocab, std::vector<int32_t>{3, 4}, {}, greedy);
  EXPECT_TRUE(none.accepted.empty());
  EXPECT_EQ(none.token, 2);
}

// Drafts drawn from q, verified against p, over many seeds: the token emitted at each position
// (given that the step reached it) is distributed as p's row for that position.
TEST(SpeculativeSamplingTest, RejectionSamplingEmitsTheTargetDistribution) {
  const std::vector<float> target = {1.0f, 2.0f,  0.5f, -0.5f, 1.5f, 0.0f,  //
                                     0.2f, -1.0f, 2.2f, 1.1f,  0.4f, 0.9f,  //
                                     0.0f, 0.0f,  0.0f, 3.0f,  0.0f, 1.0f};
  const std::vector<float> draft = {2.0f, 0.5f, 0.5f, 1.0f, 0.2f,  -2.0f,  //
                                    0.2f, 0.5f, 1.0f, 2.0f, -1.0f, 0.9f};
  for (SamplingConfig base :
       {SamplingConfig{.temperature = 1.0f}, SamplingConfig{.temperature = 0.7f, .top_k = 4}}) {
    std::vector<std::vector<double>> p;
    for (int i = 0; i < 3; ++i) {
      p.push_back(
          SamplingDistribution(std::span<const float>(target).subspan(i * kVocab, kVocab), base));
    }
    std::vector<std::vector<int>> counts(3, std::vector<int>(kVocab, 0));
    int all_accepted = 0;
    for (uint64_t seed = 1; seed <= 30000; ++seed) {
      SamplingConfig config = base;
      config.seed = seed * 7919;
      const RowSampling row{.config = config, .token_index = 5};
      std::vector<int32_t> drafts;
      std::vector<double> q;
      for (int i = 0; i < 2; ++i) {
        std::vector<double> qi =
            SamplingDistribution(std::span<const float>(draft).subspan(i * kVocab, kVocab), config);
        drafts.push_back(DrawFromDistribution(
            qi, SpeculativeUniform(config, row.token_index + i, SpeculativeDraw::kDraft)));
        q.insert(q.end(), qi.begin(), qi.end());
      }
      Verification v = VerifyDrafts(target, kVocab, drafts, q, row);
      std::vector<int32_t> emitted = v.accepted;
      emitted.push_back(v.token);
      for (size_t i = 0; i < emitted.size(); ++i) ++counts[i][emitted[i]];
      all_accepted += v.accepted.size() == 2 ? 1 : 0;
    }
    for (int i = 0; i < 3; ++i) {
      EXPECT_LT(ChiSquare(counts[i], p[i]), kChiSquare5)
          << "position " << i << " temperature " << base.temperature;
    }
    EXPECT_GT(all_accepted, 1000);  // the bonus position was exercised
  }
}

TEST(SpeculativeSamplingTest, SeededVerificationIsDeterministic) {
  const std::vector<float> target = {1.0f, 2.0f,  0.5f, -0.5f, 1.5f, 0.0f,
                                     0.2f, -1.0f, 2.2f, 1.1f,  0.4f, 0.9f};
  const std::vector<double> q(kVocab, 1.0 / kVocab);
  const RowSampling row{.config = SamplingConfig{.temperature = 1.0f, .seed = 42},
                        .token_index = 9};
  Verification a = VerifyDrafts(target, kVocab, std::vector<int32_t>{3}, q, row);
  Verification b = VerifyDrafts(target, kVocab, std::vector<int32_t>{3}, q, row);
  EXPECT_EQ(a.accepted, b.accepted);
  EXPECT_EQ(a.token, b.token);
}

}  // namespace
}  // namespace ringserve
