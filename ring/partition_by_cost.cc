#include "ring/partition_by_cost.h"

#include <algorithm>
#include <limits>

#include "absl/status/status.h"
#include "fmt/format.h"

namespace ringserve {
namespace {

// DeepSeek's multi-head latent attention: q (low-rank or not), kv_a with the rope key, the
// norms, kv_b and o_proj, as slice_weights' MlaAttentionTensorSpecs lists them.
int64_t MlaAttentionParameterCount(const ModelConfig& c) {
  const MlaConfig& m = *c.mla;
  const int64_t hidden = c.hidden_size;
  const int64_t heads = c.num_heads;
  int64_t n = 0;
  if (m.q_lora_rank > 0) {
    n += int64_t{m.q_lora_rank} * (hidden + 1) + heads * m.qk_head_dim() * m.q_lora_rank;
    if (m.attention_bias) n += m.q_lora_rank;
  } else {
    n += heads * m.qk_head_dim() * hidden;
  }
  n += int64_t{m.latent_cache_dim()} * hidden + m.kv_lora_rank;
  n += heads * (m.qk_nope_head_dim + m.v_head_dim) * m.kv_lora_rank;
  n += hidden * heads * m.v_head_dim;
  if (m.attention_bias) n += m.latent_cache_dim() + hidden;
  return n;
}

}  // namespace

int64_t LayerParameterCount(const ModelConfig& c, int layer) {
  const int64_t hidden = c.hidden_size;
  const int64_t q = c.q_size();
  const int64_t kv = c.kv_size();
  int64_t n = 2 * hidden;  // input and post-attention norms
  if (c.mla) {
    n += MlaAttentionParameterCount(c);
  } else {
    n += (q + 2 * kv) * hidden + hidden * q;  // q/k/v/o projections
    if (c.qkv_bias) n += q + 2 * kv;
    if (c.o_bias) n += hidden;
    if (c.qk_norm) n += 2 * int64_t{c.head_dim};
    if (c.attention_sinks) n += c.num_heads;
  }
  const MoeConfig& m = c.moe;
  if (!m.IsMoeLayer(layer)) return n + 3 * hidden * c.intermediate_size;
  const int64_t experts = m.router.num_experts;
  n += experts * hidden;  // router
  if (m.router_bias) n += experts;
  if (m.correction_bias) n += experts;
  n += experts * 3 * hidden * m.expert_intermediate_size;
  if (m.layout == ExpertLayout::kGptOssStacked) {
    n += experts * (2 * int64_t{m.expert_intermediate_size} + hidden);  // expert biases
  }
  n += 3 * hidden * m.shared_intermediate_size;
  if (m.shared_expert_gate) n += hidden;
  return n;
}

absl::StatusOr<std::vector<int>> PartitionByCost(std::span<const int64_t> costs, int num_stages) {
  const int layers = static_cast<int>(costs.size());
  if (num_stages < 1 || num_stages > layers) {
    return absl::InvalidArgumentError(
        fmt::format("cannot split {} layers into {} non-empty stages", layers, num_stages));
  }
  std::vector<int64_t> prefix(layers + 1, 0);
  for (int i = 0; i < layers; ++i) {
    if (costs[i] < 0) {
      return absl::InvalidArgumentError(fmt::format("layer {} has a negative cost", i));
    }
    prefix[i + 1] = prefix[i] + costs[i];
  }
  constexpr int64_t kInf = std::numeric_limits<int64_t>::max();
  // best[s][i]: the smallest largest-group sum of the last s stages over layers [i, layers).
  std::vector<std::vector<int64_t>> best(num_stages + 1, std::vector<int64_t>(layers + 1, kInf));
  best[0][layers] = 0;
  for (int s = 1; s <= num_stages; ++s) {
    for (int i = layers - s; i >= 0; --i) {
      for (int j = i + 1; j <= layers - (s - 1); ++j) {
        if (best[s - 1][j] == kInf) continue;
        best[s][i] = std::min(best[s][i], std::max(prefix[j] - prefix[i], best[s - 1][j]));
      }
    }
  }
  // Walk forward: each stage takes the fewest layers that keep the optimum reachable.
  std::vector<int> counts;
  const int64_t target = best[num_stages][0];
  int i = 0;
  for (int s = num_stages; s >= 1; --s) {
    for (int j = i + 1; j <= layers - (s - 1); ++j) {
      if (prefix[j] - prefix[i] <= target && best[s - 1][j] <= target) {
        counts.push_back(j - i);
        i = j;
        break;
      }
    }
  }
  return counts;
}

}  // namespace ringserve
