#include "stage/sampling/row_extras.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace ringserve {
namespace {

double CleanValue(float v) {
  return std::isnan(v) ? -std::numeric_limits<double>::infinity() : static_cast<double>(v);
}

}  // namespace

std::vector<TopLogprob> TopLogprobs(std::span<const float> logits, int n) {
  std::vector<TopLogprob> out;
  if (n <= 0 || logits.empty()) return out;
  const size_t count = std::min(static_cast<size_t>(n), logits.size());
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  auto before = [&](int32_t a, int32_t b) {
    const double va = CleanValue(logits[a]), vb = CleanValue(logits[b]);
    return va != vb ? va > vb : a < b;
  };
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(count), ids.end(),
                    before);
  const double max_value = CleanValue(logits[ids[0]]);
  const double minus_inf = -std::numeric_limits<double>::infinity();
  double log_total = 0.0;
  if (!std::isinf(max_value)) {
    double total = 0.0;
    for (float v : logits) total += std::exp(CleanValue(v) - max_value);
    log_total = std::log(total);
  }
  for (size_t i = 0; i < count; ++i) {
    const double v = CleanValue(logits[ids[i]]);
    double logprob;
    if (std::isinf(max_value)) {
      logprob = v == max_value ? 0.0 : minus_inf;  // TokenLogprob's rule for an infinite max
    } else {
      logprob = v - max_value - log_total;
    }
    out.push_back({ids[i], static_cast<float>(logprob)});
  }
  return out;
}

std::vector<float> SuppressTokens(std::span<const float> logits,
                                  std::span<const int32_t> suppress) {
  std::vector<float> out(logits.begin(), logits.end());
  for (int32_t id : suppress) {
    if (id >= 0 && static_cast<size_t>(id) < out.size()) {
      out[id] = -std::numeric_limits<float>::infinity();
    }
  }
  return out;
}

}  // namespace ringserve
