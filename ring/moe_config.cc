#include "ring/moe_config.h"

#include <cmath>

#include "fmt/format.h"

namespace ringserve {

absl::Status ValidateRouterOptions(const RouterOptions& o) {
  if (o.num_experts <= 0 || o.num_experts > kMaxExperts) {
    return absl::InvalidArgumentError(
        fmt::format("number of experts must be in [1, {}], got {}", kMaxExperts, o.num_experts));
  }
  if (o.top_k < 1 || o.top_k > o.num_experts) {
    return absl::InvalidArgumentError(fmt::format(
        "num_experts_per_tok {} must be in [1, number of experts {}]", o.top_k, o.num_experts));
  }
  if (o.scoring == RouterScoring::kTopKSoftmax) return absl::OkStatus();
  // The sigmoid router scores a group by its two best experts.
  const int min_group = o.scoring == RouterScoring::kSigmoidGroupedTopK ? 2 : 1;
  if (o.n_group < 1 || o.num_experts % o.n_group != 0 || o.num_experts / o.n_group < min_group) {
    return absl::InvalidArgumentError(
        fmt::format("n_group {} must divide the {} experts into groups of at least {}", o.n_group,
                    o.num_experts, min_group));
  }
  if (o.topk_group < 1 || o.topk_group > o.n_group) {
    return absl::InvalidArgumentError(
        fmt::format("topk_group {} must be in [1, n_group {}]", o.topk_group, o.n_group));
  }
  if (o.top_k > o.topk_group * (o.num_experts / o.n_group)) {
    return absl::InvalidArgumentError(
        fmt::format("num_experts_per_tok {} exceeds the {} experts of topk_group {} groups",
                    o.top_k, o.topk_group * (o.num_experts / o.n_group), o.topk_group));
  }
  if (!std::isfinite(o.routed_scaling_factor)) {
    return absl::InvalidArgumentError("routed_scaling_factor must be finite");
  }
  return absl::OkStatus();
}

}  // namespace ringserve
