#include "stage/sampling/row_extras.h"

#include <cmath>
#include <limits>
#include <random>

#include "gtest/gtest.h"
#include "stage/sampling/sampler.h"

namespace ringserve {
namespace {

TEST(RowExtrasTest, TopLogprobsAreTheLargestInOrderWithTokenLogprobValues) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> row(1000);
  for (float& v : row) v = normal(rng);
  row[17] = row[400] = 30.0f;  // the largest, tied: the lower id first
  std::vector<TopLogprob> top = TopLogprobs(row, 20);
  ASSERT_EQ(top.size(), 20u);
  EXPECT_EQ(top[0].token, 17);
  EXPECT_EQ(top[1].token, 400);
  std::vector<float> sorted = row;
  std::sort(sorted.rbegin(), sorted.rend());
  for (size_t k = 0; k < top.size(); ++k) {
    EXPECT_EQ(row[top[k].token], sorted[k]) << k;
    EXPECT_FLOAT_EQ(top[k].logprob, TokenLogprob(row, top[k].token)) << k;
  }
  EXPECT_TRUE(TopLogprobs(row, 0).empty());
  EXPECT_EQ(TopLogprobs(std::vector<float>{1.0f, 2.0f}, 5).size(), 2u);
}

TEST(RowExtrasTest, NanCountsAsMinusInfinity) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<TopLogprob> top = TopLogprobs(std::vector<float>{nan, 0.0f, nan, 0.0f}, 3);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].token, 1);
  EXPECT_EQ(top[1].token, 3);
  EXPECT_NEAR(top[0].logprob, std::log(0.5), 1e-6);
  EXPECT_TRUE(std::isinf(top[2].logprob) && top[2].logprob < 0);
}

TEST(RowExtrasTest, SuppressedTokensAreNeverSampled) {
  std::vector<float> row = {0.0f, 5.0f, 4.9f, -1.0f};
  EXPECT_EQ(SuppressTokens(row, std::vector<int32_t>{1, 99, -1})[1],
            -std::numeric_limits<float>::infinity());
  std::vector<RowSampling> rows(200);
  for (size_t i = 0; i < rows.size(); ++i) {
    rows[i].config = {.temperature = 2.0f, .seed = 7};
    rows[i].token_index = i;
    rows[i].suppress_token_ids = {1};
  }
  std::vector<float> logits;
  for (size_t i = 0; i < rows.size(); ++i) logits.insert(logits.end(), row.begin(), row.end());
  absl::StatusOr<std::vector<int32_t>> tokens = SampleTokens(logits, 4, rows);
  ASSERT_TRUE(tokens.ok());
  int twos = 0;
  for (int32_t t : *tokens) {
    EXPECT_NE(t, 1);
    twos += t == 2;
  }
  EXPECT_GT(twos, 100) << "the mass moves to the others, 2 most of all";
}

}  // namespace
}  // namespace ringserve
