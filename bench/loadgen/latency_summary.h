// Summary statistics of a sample of latencies (or any non-negative figures) for the load
// generator's report: count, mean, min, max and percentiles.
#pragma once

#include <cstdint>
#include <vector>

namespace ringserve::loadgen {

struct Summary {
  int64_t count = 0;
  double mean = 0;
  double min = 0;
  double max = 0;
  double p50 = 0;
  double p90 = 0;
  double p99 = 0;
};

// The q-quantile (q in [0, 1]) of `sorted` (ascending), linearly interpolated between the two
// closest ranks (numpy's default "linear" method). 0 for an empty sample.
double Percentile(const std::vector<double>& sorted, double q);

// Summarizes `values` (any order). All fields 0 for an empty sample.
Summary Summarize(std::vector<double> values);

}  // namespace ringserve::loadgen
