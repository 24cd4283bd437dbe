#include "bench/loadgen/latency_summary.h"

#include <vector>

#include "gtest/gtest.h"

namespace ringserve::loadgen {
namespace {

TEST(LatencySummaryTest, EmptySampleIsAllZero) {
  Summary s = Summarize({});
  EXPECT_EQ(s.count, 0);
  EXPECT_EQ(s.mean, 0);
  EXPECT_EQ(s.p99, 0);
}

TEST(LatencySummaryTest, InterpolatesBetweenRanksLikeNumpy) {
  // numpy.percentile([1, 2, 3, 4], [50, 90, 99]) == [2.5, 3.7, 3.97]
  Summary s = Summarize({4, 1, 3, 2});
  EXPECT_EQ(s.count, 4);
  EXPECT_DOUBLE_EQ(s.mean, 2.5);
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.max, 4);
  EXPECT_DOUBLE_EQ(s.p50, 2.5);
  EXPECT_NEAR(s.p90, 3.7, 1e-12);
  EXPECT_NEAR(s.p99, 3.97, 1e-12);
}

TEST(LatencySummaryTest, SingleValueIsEveryPercentile) {
  Summary s = Summarize({7.5});
  EXPECT_EQ(s.count, 1);
  EXPECT_DOUBLE_EQ(s.p50, 7.5);
  EXPECT_DOUBLE_EQ(s.p99, 7.5);
  EXPECT_DOUBLE_EQ(Percentile({7.5}, 1.5), 7.5);  // q is clamped
}

TEST(LatencySummaryTest, TailPercentileSeesTheOutlier) {
  std::vector<double> values(99, 1.0);
  values.push_back(100.0);
  Summary s = Summarize(values);
  EXPECT_DOUBLE_EQ(s.p50, 1.0);
  EXPECT_GT(s.p99, 1.0);
  EXPECT_DOUBLE_EQ(s.max, 100.0);
}

}  // namespace
}  // namespace ringserve::loadgen
