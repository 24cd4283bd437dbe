// `--partition auto` from measured cost: what a probe measured per decoder layer (time of one
// decode step, bytes the stage must hold for it) and the contiguous split over stages of given
// memory that minimizes the slowest stage. Pure functions; the probe's text form is here so that
// the stage (which measures) and the coordinator (which decides) speak it from one place.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace ringserve {

// One decoder layer as a probe measured it. Layer 0 includes the embedding and the last layer
// the final norm, lm_head and sampling (they always run on the first and the last stage).
struct LayerCost {
  double step_us = 0;  // a decode step of the probe's rows through this layer alone, median
  int64_t bytes = 0;   // weights as the backend holds them, plus the KV floor the caller adds
};

// What `stage --probe_layers` reports: per-layer costs and the device it ran on.
struct LayerCostProfile {
  std::string device{};  // "cpu", "cuda:0", ...
  int rows = 0;          // decode rows (sequences) of the timed step
  int context = 0;       // their context length
  std::vector<LayerCost> layers{};
  int64_t memory_bytes = 0;                  // the device's memory (CPU: available host memory)
  int64_t kv_bytes_per_token_and_layer = 0;  // as the backend stores K/V
};

// The text form: a header line "probe DEVICE rows R context C memory M kv_bytes K" then one
// line "layer I us T bytes B" per layer, in order. ParseLayerCostProfile returns
// InvalidArgument naming the line for anything else (a missing or repeated layer, bad numbers).
std::string FormatLayerCostProfile(const LayerCostProfile& profile);
absl::StatusOr<LayerCostProfile> ParseLayerCostProfile(std::string_view text);

struct PartitionProposal {
  std::vector<int> counts{};           // layers per stage
  std::vector<double> stage_us{};      // sum of the stage's layer step_us
  std::vector<int64_t> stage_bytes{};  // sum of the stage's layer bytes
};

// The contiguous split of `layers` over stage_memory.size() non-empty stages that minimizes the
// largest stage_us among those where every stage's bytes fit its stage_memory (bytes); among
// equals, earlier stages take as few layers as possible. InvalidArgument when there are fewer
// layers than stages, a negative cost, or no split fits the memory (naming the tightest stage).
absl::StatusOr<PartitionProposal> ProposePartition(std::span<const LayerCost> layers,
                                                   std::span<const int64_t> stage_memory);

// The stage sums of any split `counts` (which must cover `layers` exactly).
PartitionProposal EvaluatePartition(std::span<const LayerCost> layers, std::span<const int> counts);

// One line per stage for humans: "stage 1: layers [8, 16) 2.31 ms, 3.2 GiB of 40.0 GiB".
std::string DescribePartition(const PartitionProposal& proposal,
                              std::span<const int64_t> stage_memory);

}  // namespace ringserve
