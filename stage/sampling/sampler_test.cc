#include "stage/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace ringserve {
namespace {

std::vector<double> Softmax(const std::vector<float>& logits, double temperature) {
  double max_value = -1e300;
  for (float v : logits) max_value = std::max(max_value, v / temperature);
  std::vector<double> p(logits.size());
  double total = 0;
  for (size_t i = 0; i < logits.size(); ++i)
    total += p[i] = std::exp(logits[i] / temperature - max_value);
  for (double& v : p) v /= total;
  return p;
}

// Frequencies of SampleRow over token indices [0, draws) with one seed.
std::vector<double> Frequencies(const std::vector<float>& logits, SamplingConfig config,
                                int draws) {
  std::vector<double> counts(logits.size(), 0.0);
  for (int i = 0; i < draws; ++i) {
    int32_t token = SampleRow(logits, RowSampling{config, static_cast<uint64_t>(i)});
    counts.at(static_cast<size_t>(token)) += 1.0;
  }
  for (double& c : counts) c /= draws;
  return counts;
}

TEST(SamplerTest, GreedyIsArgmaxWithTiesToLowestId) {
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int trial = 0; trial < 100; ++trial) {
    std::vector<float> logits(257);
    for (float& v : logits) v = normal(rng);
    size_t expected = 0;
    for (size_t i = 1; i < logits.size(); ++i) {
      if (logits[i] > logits[expected]) expected = i;
    }
    SCOPED_TRACE(trial);
    EXPECT_EQ(GreedyToken(logits), static_cast<int32_t>(expected));
    EXPECT_EQ(SampleRow(logits,
                        RowSampling{SamplingConfig{
                                        .temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .seed = 99},
                                    static_cast<uint64_t>(trial)}),
              static_cast<int32_t>(expected));
  }
  EXPECT_EQ(GreedyToken(std::vector<float>{1.0f, 5.0f, 2.0f, 5.0f, 5.0f}), 1);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(GreedyToken(std::vector<float>{nan, 0.5f, nan, 0.7f}), 3);
}

TEST(SamplerTest, TopKOneIsGreedyForAnyTemperatureAndSeed) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> logits(64);
    for (float& v : logits) v = normal(rng);
    SamplingConfig config{.temperature = 0.5f + trial * 0.05f,
                          .top_k = 1,
                          .top_p = 1.0f,
                          .seed = static_cast<uint64_t>(trial)};
    EXPECT_EQ(SampleRow(logits, RowSampling{config, static_cast<uint64_t>(trial * 3)}),
              GreedyToken(logits));
  }
}

TEST(SamplerTest, TemperatureSamplingMatchesSoftmax) {
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, -1.0f, 1.5f, 0.0f};
  constexpr int kDraws = 200000;
  for (float temperature : {0.6f, 1.0f, 1.7f}) {
    SamplingConfig config{.temperature = temperature, .top_k = 0, .top_p = 1.0f, .seed = 2024};
    std::vector<double> freq = Frequencies(logits, config, kDraws);
    std::vector<double> expected = Softmax(logits, temperature);
    for (size_t i = 0; i < logits.size(); ++i) {
      // sigma <= sqrt(0.25 / 200000) = 0.0011; 5 sigma.
      EXPECT_NEAR(freq[i], expected[i], 0.0056) << "T=" << temperature << " token " << i;
    }
  }
}

TEST(SamplerTest, TopKRenormalizesOverTheKLargest) {
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, -1.0f, 1.5f, 0.0f};
  SamplingConfig config{.temperature = 1.0f, .top_k = 3, .top_p = 1.0f, .seed = 5};
  std::vector<double> freq = Frequencies(logits, config, 100000);
  std::vector<double> kept = Softmax({1.0f, 2.0f, 1.5f}, 1.0);
  EXPECT_NEAR(freq[0], kept[0], 0.008);
  EXPECT_NEAR(freq[1], kept[1], 0.008);
  EXPECT_NEAR(freq[4], kept[2], 0.008);
  EXPECT_EQ(freq[2] + freq[3] + freq[5], 0.0);
}

TEST(SamplerTest, TopPKeepsTheMinimalNucleus) {
  // Probabilities 0.5, 0.3, 0.15, 0.05 (log of them as logits, T = 1).
  const std::vector<float> logits = {std::log(0.15f), std::log(0.5f), std::log(0.05f),
                                     std::log(0.3f)};
  constexpr int kDraws = 100000;
  // 0.5 < 0.75 <= 0.5 + 0.3: the nucleus is {1, 3}, renormalized to 5/8 and 3/8.
  std::vector<double> freq =
      Frequencies(logits, {.temperature = 1.0f, .top_k = 0, .top_p = 0.75f, .seed = 11}, kDraws);
  EXPECT_EQ(freq[0] + freq[2], 0.0);
  EXPECT_NEAR(freq[1], 0.625, 0.008);
  EXPECT_NEAR(freq[3], 0.375, 0.008);
  // 0.4 <= 0.5: the most likely token alone.
  freq = Frequencies(logits, {.temperature = 1.0f, .top_k = 0, .top_p = 0.4f, .seed = 11}, 2000);
  EXPECT_EQ(freq[1], 1.0);
  // 0.9 needs three tokens: {1, 3, 0}.
  freq = Frequencies(logits, {.temperature = 1.0f, .top_k = 0, .top_p = 0.9f, .seed = 3}, kDraws);
  EXPECT_EQ(freq[2], 0.0);
  EXPECT_NEAR(freq[0], 0.15 / 0.95, 0.008);
  // top-k applies first: k = 2 then p = 0.9 of {0.5, 0.3}/0.8 keeps both.
  freq = Frequencies(logits, {.temperature = 1.0f, .top_k = 2, .top_p = 0.9f, .seed = 3}, kDraws);
  EXPECT_EQ(freq[0] + freq[2], 0.0);
  EXPECT_NEAR(freq[1], 0.625, 0.008);
}

// The algorithm of the header, written plainly (full sort), as the oracle for SampleRow.
int32_t ReferenceSample(const std::vector<float>& logits, const RowSampling& row) {
  const SamplingConfig& c = row.config;
  std::vector<std::pair<double, int32_t>> order;  // (scaled logit, id), in id order
  double max_z = -1e300;
  for (size_t i = 0; i < logits.size(); ++i) {
    order.push_back({logits[i] / static_cast<double>(c.temperature), static_cast<int32_t>(i)});
    max_z = std::max(max_z, order.back().first);
  }
  if (c.top_k > 0 || c.top_p < 1.0f) {  // otherwise SampleRow keeps id order
    std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first > b.first : a.second < b.second;
    });
  }
  if (c.top_k > 0 && static_cast<size_t>(c.top_k) < order.size()) order.resize(c.top_k);
  std::vector<double> p;
  double total = 0;
  for (const auto& entry : order) total += p.emplace_back(std::exp(entry.first - max_z));
  size_t kept = order.size();
  if (c.top_p < 1.0f) {
    double cumulative = 0;
    for (kept = 0; kept < order.size();) {
      cumulative += p[kept++];
      if (cumulative >= c.top_p * total) break;
    }
    total = cumulative;
  }
  const double target = SamplingUniform(c.seed, row.token_index) * total;
  double cumulative = 0;
  for (size_t i = 0; i < kept; ++i) {
    cumulative += p[i];
    if (target < cumulative) return order[i].second;
  }
  return order[kept - 1].second;
}

TEST(SamplerTest, MatchesAPlainReferenceImplementation) {
  std::mt19937 rng(99);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<float> logits(trial % 3 == 0 ? 5000 : 300);
    for (float& v : logits) v = std::round(normal(rng) * 4.0f) / 4.0f;  // with ties
    SamplingConfig config{.temperature = 0.3f + 0.01f * (trial % 150),
                          .top_k = trial % 4 == 0 ? 0 : trial % 97,
                          .top_p = trial % 5 == 0 ? 1.0f : 0.05f + 0.003f * (trial % 300),
                          .seed = static_cast<uint64_t>(trial)};
    RowSampling row{config, static_cast<uint64_t>(trial * 13)};
    ASSERT_EQ(SampleRow(logits, row), ReferenceSample(logits, row))
        << "trial " << trial << " top_k " << config.top_k << " top_p " << config.top_p;
  }
}

TEST(SamplerTest, SameSeedAndIndexGiveSameTokenWhateverTheBatch) {
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  constexpr int kVocab = 1000;
  constexpr int kRows = 8;
  std::vector<float> logits(kRows * kVocab);
  for (float& v : logits) v = normal(rng);
  std::vector<RowSampling> rows;
  for (int r = 0; r < kRows; ++r) {
    rows.push_back({SamplingConfig{.temperature = 0.9f,
                                   .top_k = r % 3 == 0 ? 50 : 0,
                                   .top_p = r % 2 == 0 ? 0.9f : 1.0f,
                                   .seed = static_cast<uint64_t>(1000 + r)},
                    static_cast<uint64_t>(r * 7)});
  }
  auto tokens = SampleTokens(logits, kVocab, rows);
  ASSERT_TRUE(tokens.ok()) << tokens.status();

  // Reverse the batch and put unrelated rows in between: every request gets its same token.
  std::vector<float> shuffled;
  std::vector<RowSampling> shuffled_rows;
  std::vector<float> noise(kVocab);
  for (int r = kRows - 1; r >= 0; --r) {
    for (float& v : noise) v = normal(rng);
    shuffled.insert(shuffled.end(), noise.begin(), noise.end());
    shuffled_rows.push_back(
        {SamplingConfig{.temperature = 1.3f, .top_k = 0, .top_p = 1.0f, .seed = 77},
         static_cast<uint64_t>(r)});
    shuffled.insert(shuffled.end(), logits.begin() + r * kVocab, logits.begin() + (r + 1) * kVocab);
    shuffled_rows.push_back(rows[r]);
  }
  auto again = SampleTokens(shuffled, kVocab, shuffled_rows);
  ASSERT_TRUE(again.ok()) << again.status();
  for (int r = 0; r < kRows; ++r) {
    EXPECT_EQ((*again)[2 * (kRows - 1 - r) + 1], (*tokens)[r]) << "row " << r;
    // And alone.
    EXPECT_EQ(SampleRow(std::span<const float>(logits).subspan(r * kVocab, kVocab), rows[r]),
              (*tokens)[r]);
  }
}

TEST(SamplerTest, DrawsDependOnSeedAndIndex) {
  const std::vector<float> logits(50, 0.0f);  // uniform over 50 tokens
  auto draw = [&](uint64_t seed, uint64_t index) {
    return SampleRow(logits,
                     {{.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = seed}, index});
  };
  int same_across_seeds = 0;
  int same_across_indices = 0;
  for (uint64_t i = 0; i < 200; ++i) {
    same_across_seeds += draw(1, i) == draw(2, i);
    same_across_indices += draw(1, i) == draw(1, i + 1);
    EXPECT_EQ(draw(5, i), draw(5, i));
  }
  // Independent draws coincide with probability 1/50: expect about 4 of 200.
  EXPECT_LT(same_across_seeds, 20);
  EXPECT_LT(same_across_indices, 20);
  double sum = 0;
  for (uint64_t i = 0; i < 10000; ++i) {
    double u = SamplingUniform(9, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / 10000, 0.5, 0.02);
}

TEST(SamplerTest, NonFiniteLogitsAreHandled) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  RowSampling row{{.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = 1}, 0};
  // -inf and NaN are never chosen.
  for (uint64_t i = 0; i < 100; ++i) {
    row.token_index = i;
    int32_t token = SampleRow(std::vector<float>{-inf, 0.0f, nan, 0.0f}, row);
    EXPECT_TRUE(token == 1 || token == 3) << token;
  }
  EXPECT_EQ(SampleRow(std::vector<float>{-inf, nan}, row), 0);
  EXPECT_EQ(SampleRow(std::vector<float>{1.0f, inf, 2.0f}, row), 1);
}

TEST(SamplerTest, TokenLogprobIsLogSoftmaxOfTheRawLogits) {
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, -1.0f};
  std::vector<double> p = Softmax(logits, 1.0);
  for (int32_t token = 0; token < 4; ++token) {
    EXPECT_NEAR(TokenLogprob(logits, token), std::log(p[token]), 1e-6) << token;
  }
  EXPECT_EQ(TokenLogprob(logits, 4), -std::numeric_limits<float>::infinity());
  EXPECT_EQ(TokenLogprob(logits, -1), -std::numeric_limits<float>::infinity());
  // Large logits do not overflow.
  EXPECT_NEAR(TokenLogprob(std::vector<float>{1000.0f, 1000.0f}, 1), std::log(0.5), 1e-6);
}

TEST(SamplerTest, BadParametersAreInvalidArgument) {
  const std::vector<float> logits(4 * 2, 0.0f);
  auto sample = [&](SamplingConfig config) {
    std::vector<RowSampling> rows = {{SamplingConfig{}, 0}, {config, 0}};
    return SampleTokens(logits, 4, rows).status();
  };
  for (SamplingConfig bad :
       {SamplingConfig{.temperature = -0.1f}, SamplingConfig{.temperature = NAN},
        SamplingConfig{.temperature = INFINITY}, SamplingConfig{.top_k = -1},
        SamplingConfig{.top_p = 0.0f}, SamplingConfig{.top_p = -0.5f},
        SamplingConfig{.top_p = 1.01f}, SamplingConfig{.top_p = NAN}}) {
    absl::Status status = sample(bad);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find("row 1"), absl::string_view::npos) << status;
    EXPECT_EQ(ValidateSamplingConfig(bad).code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_TRUE(sample(SamplingConfig{.temperature = 2.0f, .top_k = 3, .top_p = 1.0f}).ok());
  std::vector<RowSampling> one = {{SamplingConfig{}, 0}};
  EXPECT_EQ(SampleTokens(logits, 4, one).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SampleTokens(logits, 0, one).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ringserve
