#include "stage/model/moe_router.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "fmt/format.h"

namespace ringserve {
namespace {

// Indices of the k largest values, largest first; equal values keep the lower index first.
void TopK(std::span<const float> values, int k, std::vector<int32_t>& order) {
  order.resize(values.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    return values[a] > values[b] || (values[a] == values[b] && a < b);
  });
  order.resize(k);
}

}  // namespace

void RouteTokens(const RouterOptions& o, std::span<const float> logits,
                 std::span<const float> correction_bias, int64_t num_tokens,
                 std::span<int32_t> expert_ids, std::span<float> weights) {
  const int e = o.num_experts;
  const int k = o.top_k;
  std::vector<float> score(e), choice(e);
  std::vector<int32_t> order;
  for (int64_t t = 0; t < num_tokens; ++t) {
    const std::span<const float> row = logits.subspan(t * e, e);
    int32_t* ids = expert_ids.data() + t * k;
    float* w = weights.data() + t * k;
    switch (o.scoring) {
      case RouterScoring::kSoftmaxTopK: {
        const float max_logit = *std::max_element(row.begin(), row.end());
        float sum = 0.0f;
        for (int x = 0; x < e; ++x) sum += score[x] = std::exp(row[x] - max_logit);
        for (int x = 0; x < e; ++x) score[x] /= sum;
        if (o.topk_group < o.n_group) {
          // DeepSeek-V2's group_limited_greedy: a group scores its best expert; experts of
          // dropped groups score 0 (transformers' mask), below every softmax probability.
          choice = score;
          const int per_group = e / o.n_group;
          std::vector<float> group_score(o.n_group);
          for (int g = 0; g < o.n_group; ++g) {
            group_score[g] = *std::max_element(score.begin() + g * per_group,
                                               score.begin() + (g + 1) * per_group);
          }
          TopK(group_score, o.topk_group, order);
          std::vector<bool> kept(o.n_group, false);
          for (int32_t g : order) kept[g] = true;
          for (int x = 0; x < e; ++x) {
            if (!kept[x / per_group]) choice[x] = 0.0f;
          }
          TopK(choice, k, order);
        } else {
          TopK(score, k, order);
        }
        float top_sum = 0.0f;
        for (int j = 0; j < k; ++j) top_sum += w[j] = score[order[j]];
        const float denominator = o.norm_topk_prob ? top_sum : 1.0f;
        for (int j = 0; j < k; ++j) w[j] = w[j] / denominator * o.routed_scaling_factor;
        break;
      }
      case RouterScoring::kTopKSoftmax: {
        TopK(row, k, order);
        const float max_logit = row[order[0]];
        float sum = 0.0f;
        for (int j = 0; j < k; ++j) sum += w[j] = std::exp(row[order[j]] - max_logit);
        for (int j = 0; j < k; ++j) w[j] /= sum;
        break;
      }
      case RouterScoring::kSigmoidGroupedTopK: {
        for (int x = 0; x < e; ++x) {
          score[x] = 1.0f / (1.0f + std::exp(-row[x]));
          choice[x] = score[x] + (correction_bias.empty() ? 0.0f : correction_bias[x]);
        }
        const int per_group = e / o.n_group;
        if (o.topk_group < o.n_group) {
          std::vector<float> group_score(o.n_group);
          for (int g = 0; g < o.n_group; ++g) {
            std::span<const float> members(choice.data() + g * per_group, per_group);
            TopK(members, 2, order);
            group_score[g] = members[order[0]] + members[order[1]];
          }
          TopK(group_score, o.topk_group, order);
          std::vector<bool> kept(o.n_group, false);
          for (int32_t g : order) kept[g] = true;
          // Experts of dropped groups cannot be chosen: -inf, as DeepSeek's reference code
          // masks them (some transformers versions mask with 0, which differs only where fewer
          // than top_k kept experts have a positive score + bias).
          for (int x = 0; x < e; ++x) {
            if (!kept[x / per_group]) choice[x] = -std::numeric_limits<float>::infinity();
          }
        }
        TopK(choice, k, order);
        float sum = 0.0f;
        for (int j = 0; j < k; ++j) sum += w[j] = score[order[j]];
        const float denominator = o.norm_topk_prob ? sum + 1e-20f : 1.0f;
        for (int j = 0; j < k; ++j) w[j] = w[j] / denominator * o.routed_scaling_factor;
        break;
      }
    }
    for (int j = 0; j < k; ++j) ids[j] = order[j];
  }
}

}  // namespace ringserve
