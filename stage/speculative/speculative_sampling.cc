#include "stage/speculative/speculative_sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "stage/sampling/sampler.h"

namespace ringserve {
namespace {

struct Candidate {
  int32_t id = 0;
  double value = 0;
};

// The sampler's order: higher value first, ties -> lower id first.
bool Before(const Candidate& a, const Candidate& b) {
  if (a.value != b.value) return a.value > b.value;
  return a.id < b.id;
}

}  // namespace

double SpeculativeUniform(const SamplingConfig& config, uint64_t token_index,
                          SpeculativeDraw purpose) {
  return SamplingUniform(config.seed ^ static_cast<uint64_t>(purpose), token_index);
}

std::vector<double> SamplingDistribution(std::span<const float> logits,
                                         const SamplingConfig& config) {
  std::vector<double> probs(logits.size(), 0.0);
  if (logits.empty()) return probs;
  if (config.temperature == 0.0f || logits.size() == 1) {
    probs[GreedyToken(logits)] = 1.0;
    return probs;
  }
  const double inv_temperature = 1.0 / static_cast<double>(config.temperature);
  std::vector<Candidate> candidates;
  candidates.reserve(logits.size());
  double max_value = -std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < logits.size(); ++i) {
    const float logit = std::isnan(logits[i]) ? -std::numeric_limits<float>::infinity() : logits[i];
    const double value = static_cast<double>(logit) * inv_temperature;
    if (value == -std::numeric_limits<double>::infinity()) continue;
    candidates.push_back({static_cast<int32_t>(i), value});
    max_value = std::max(max_value, value);
  }
  if (candidates.empty() || std::isinf(max_value)) {
    probs[GreedyToken(logits)] = 1.0;
    return probs;
  }
  const bool use_top_k = config.top_k > 0 && static_cast<size_t>(config.top_k) < candidates.size();
  const bool use_top_p = config.top_p < 1.0f;
  if (use_top_k || use_top_p) std::sort(candidates.begin(), candidates.end(), Before);
  if (use_top_k) candidates.resize(static_cast<size_t>(config.top_k));
  double total = 0.0;
  std::vector<double> weights(candidates.size());
  for (size_t i = 0; i < candidates.size(); ++i) {
    weights[i] = std::exp(candidates[i].value - max_value);
    total += weights[i];
  }
  size_t kept = candidates.size();
  if (use_top_p) {
    const double threshold = static_cast<double>(config.top_p) * total;
    double cumulative = 0.0;
    kept = 0;
    while (kept < candidates.size()) {
      cumulative += weights[kept++];
      if (cumulative >= threshold) break;
    }
    total = cumulative;
  }
  for (size_t i = 0; i < kept; ++i) probs[candidates[i].id] = weights[i] / total;
  return probs;
}

int32_t DrawFromDistribution(std::span<const double> probs, double u) {
  double total = 0.0;
  for (double p : probs) total += p;
  if (!(total > 0.0)) return 0;
  const double target = u * total;
  double cumulative = 0.0;
  int32_t last_nonzero = 0;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (probs[i] <= 0.0) continue;
    cumulative += probs[i];
    last_nonzero = static_cast<int32_t>(i);
    if (target < cumulative) return last_nonzero;
  }
  return last_nonzero;  // rounding left the target at the sum
}

Verification VerifyDrafts(std::span<const float> target_rows, int vocab_size,
                          std::span<const int32_t> drafts, std::span<const double> draft_probs,
                          const RowSampling& row) {
  const size_t vocab = static_cast<size_t>(vocab_size);
  auto target_row = [&](size_t i) { return target_rows.subspan(i * vocab, vocab); };
  Verification out;
  const SamplingConfig& config = row.config;
  const bool greedy = config.temperature == 0.0f;
  for (size_t i = 0; i < drafts.size(); ++i) {
    const uint64_t token_index = row.token_index + i;
    const int32_t draft = drafts[i];
    if (greedy) {
      const int32_t best = GreedyToken(target_row(i));
      if (best != draft) {
        out.token = best;
        return out;
      }
      out.accepted.push_back(draft);
      continue;
    }
    const std::vector<double> p = SamplingDistribution(target_row(i), config);
    std::span<const double> q = draft_probs.subspan(i * vocab, vocab);
    const double p_x = draft >= 0 && static_cast<size_t>(draft) < vocab ? p[draft] : 0.0;
    const double q_x = draft >= 0 && static_cast<size_t>(draft) < vocab ? q[draft] : 0.0;
    const double u = SpeculativeUniform(config, token_index, SpeculativeDraw::kAccept);
    // q_x == 0 cannot happen for a token drawn from q; accept only what p allows then.
    const bool accept = q_x > 0.0 ? u < std::min(1.0, p_x / q_x) : false;
    if (accept) {
      out.accepted.push_back(draft);
      continue;
    }
    std::vector<double> residual(vocab);
    double mass = 0.0;
    for (size_t v = 0; v < vocab; ++v) {
      residual[v] = std::max(0.0, p[v] - q[v]);
      mass += residual[v];
    }
    // p == q exactly leaves no residual mass (the draft is then always accepted): fall back to p.
    std::span<const double> from = mass > 0.0 ? std::span<const double>(residual) : p;
    out.token = DrawFromDistribution(
        from, SpeculativeUniform(config, token_index, SpeculativeDraw::kResidual));
    return out;
  }
  // Every draft accepted: the bonus token from the last row, as the plain sampler draws it.
  RowSampling bonus = row;
  bonus.token_index = row.token_index + drafts.size();
  out.token = SampleRow(target_row(drafts.size()), bonus);
  return out;
}

}  // namespace ringserve
