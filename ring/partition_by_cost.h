// Partitions by layer cost: what each decoder layer weighs (a MoE layer holds every expert, so
// it can cost tens of dense layers) and contiguous layer counts per stage that balance a cost.
// Pure functions; the coordinator's `--partition auto` is meant to call them with measured or
// parameter costs and each stage's memory.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "ring/model_config.h"

namespace ringserve {

// Weight parameters of decoder layer `layer`: norms, attention (q/k norms, biases, sinks), then
// the dense MLP or, on a MoE layer, the router (and its biases), every expert and the shared
// experts. Equals the element count of the checkpoint tensors a stage reads for the layer.
int64_t LayerParameterCount(const ModelConfig& config, int layer);

// Layer counts for `num_stages` contiguous, non-empty groups of `costs` (one per layer, >= 0)
// that minimize the largest group sum; among those, the one whose earlier stages take as few
// layers as possible. InvalidArgument unless 1 <= num_stages <= costs.size().
absl::StatusOr<std::vector<int>> PartitionByCost(std::span<const int64_t> costs, int num_stages);

}  // namespace ringserve
