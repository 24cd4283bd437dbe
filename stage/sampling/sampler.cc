#include "stage/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <numeric>

#include "fmt/format.h"
#include "stage/sampling/row_extras.h"

namespace ringserve {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

float Clean(float value) {
  return std::isnan(value) ? -std::numeric_limits<float>::infinity() : value;
}

struct Candidate {
  int32_t id;
  double value;   // logit / temperature: orders the candidates
  double weight;  // exp(value - max): unnormalized probability
};

// Higher value first; ties -> lower id first. A strict weak order, so results are unique.
bool Before(const Candidate& a, const Candidate& b) {
  if (a.value != b.value) return a.value > b.value;
  return a.id < b.id;
}

}  // namespace

double SamplingUniform(uint64_t seed, uint64_t token_index) {
  uint64_t bits = SplitMix64(SplitMix64(seed) ^ SplitMix64(token_index + 0x632be59bd9b4e019ull));
  // 53 random bits -> [0, 1).
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

int32_t GreedyToken(std::span<const float> logits) {
  int32_t best = 0;
  float best_value = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < logits.size(); ++i) {
    float value = Clean(logits[i]);
    if (value > best_value) {
      best_value = value;
      best = static_cast<int32_t>(i);
    }
  }
  return best;
}

int32_t SampleRow(std::span<const float> logits, const RowSampling& row) {
  const SamplingConfig& config = row.config;
  if (!ValidateSamplingConfig(config).ok()) std::abort();  // programmer error, see header
  if (config.temperature == 0.0f || logits.size() <= 1) return GreedyToken(logits);

  const double inv_temperature = 1.0 / static_cast<double>(config.temperature);
  std::vector<Candidate> candidates;
  candidates.reserve(logits.size());
  double max_value = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < logits.size(); ++i) {
    double value = static_cast<double>(Clean(logits[i])) * inv_temperature;
    if (value == -std::numeric_limits<double>::infinity()) continue;
    candidates.push_back({static_cast<int32_t>(i), value, 0.0});
    max_value = std::max(max_value, value);
  }
  if (candidates.empty()) return 0;
  if (std::isinf(max_value)) return GreedyToken(logits);  // +inf logits: the first one wins

  const bool use_top_k = config.top_k > 0 && static_cast<size_t>(config.top_k) < candidates.size();
  const bool use_top_p = config.top_p < 1.0f;
  if (use_top_k) {
    auto kth = candidates.begin() + config.top_k;
    std::partial_sort(candidates.begin(), kth, candidates.end(), Before);
    candidates.erase(kth, candidates.end());
  }
  double total = 0.0;
  for (Candidate& candidate : candidates) {
    candidate.weight = std::exp(candidate.value - max_value);
    total += candidate.weight;
  }
  // Without top-k or top-p the candidates stay in id order; otherwise they are sorted (logit
  // desc, id asc). Both are fixed functions of the logits.
  size_t kept = candidates.size();
  if (use_top_p) {
    const double threshold = static_cast<double>(config.top_p) * total;
    // The nucleus is usually small: sort a growing prefix instead of the whole vocabulary. A
    // partial sort yields exactly the head of the full order, so the result is the same.
    size_t sorted = use_top_k ? candidates.size() : 0;
    double cumulative = 0.0;
    kept = 0;
    while (kept < candidates.size()) {
      if (kept == sorted) {
        const size_t grow = std::min(candidates.size(), std::max<size_t>(64, 4 * sorted));
        std::partial_sort(candidates.begin() + sorted, candidates.begin() + grow, candidates.end(),
                          Before);
        sorted = grow;
      }
      cumulative += candidates[kept].weight;
      ++kept;
      if (cumulative >= threshold) break;
    }
    total = cumulative;
  }
  const double target = SamplingUniform(config.seed, row.token_index) * total;
  double cumulative = 0.0;
  for (size_t i = 0; i < kept; ++i) {
    cumulative += candidates[i].weight;
    if (target < cumulative) return candidates[i].id;
  }
  // Rounding left target at or past the sum: the last candidate with non-zero mass.
  for (size_t i = kept; i-- > 0;) {
    if (candidates[i].weight > 0.0) return candidates[i].id;
  }
  return candidates[0].id;
}

float TokenLogprob(std::span<const float> logits, int32_t token) {
  const float minus_inf = -std::numeric_limits<float>::infinity();
  if (token < 0 || static_cast<size_t>(token) >= logits.size()) return minus_inf;
  double max_value = -std::numeric_limits<double>::infinity();
  for (float v : logits) max_value = std::max(max_value, static_cast<double>(Clean(v)));
  if (std::isinf(max_value)) return Clean(logits[token]) == max_value ? 0.0f : minus_inf;
  double total = 0.0;
  for (float v : logits) total += std::exp(static_cast<double>(Clean(v)) - max_value);
  return static_cast<float>(static_cast<double>(Clean(logits[token])) - max_value -
                            std::log(total));
}

absl::StatusOr<std::vector<int32_t>> SampleTokens(std::span<const float> logits, int vocab_size,
                                                  std::span<const RowSampling> rows) {
  if (vocab_size < 1) {
    return absl::InvalidArgumentError(fmt::format("vocab_size must be >= 1, got {}", vocab_size));
  }
  if (logits.size() != rows.size() * static_cast<size_t>(vocab_size)) {
    return absl::InvalidArgumentError(
        fmt::format("logits have {} values, expected {} rows x {} vocab = {}", logits.size(),
                    rows.size(), vocab_size, rows.size() * static_cast<size_t>(vocab_size)));
  }
  for (size_t r = 0; r < rows.size(); ++r) {
    absl::Status status = ValidateSamplingConfig(rows[r].config);
    if (!status.ok()) {
      return absl::InvalidArgumentError(
          fmt::format("sampling row {}: {}", r, std::string(status.message())));
    }
  }
  std::vector<int32_t> tokens(rows.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    std::span<const float> row =
        logits.subspan(r * static_cast<size_t>(vocab_size), static_cast<size_t>(vocab_size));
    if (rows[r].suppress_token_ids.empty()) {
      tokens[r] = SampleRow(row, rows[r]);
    } else {
      tokens[r] = SampleRow(SuppressTokens(row, rows[r].suppress_token_ids), rows[r]);
    }
  }
  return tokens;
}

}  // namespace ringserve
