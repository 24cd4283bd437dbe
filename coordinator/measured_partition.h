// `coordinator --partition auto`: runs the stage binary's layer probe (`stage --probe_layers`,
// stage/layer_cost_probe.h) on the device the local stages will use, then proposes the split
// that minimizes the slowest stage's measured decode time while every stage's layers fit its
// memory (ring/partition_proposal.h), and says why.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ring/defaults.h"
#include "ring/partition_proposal.h"

namespace ringserve {

struct MeasuredPartitionOptions {
  std::string stage_binary{};
  std::string model_dir{};
  std::string device = "cpu";  // every local stage's device (they share it)
  int num_stages = 1;
  // The share of the device's memory the stages take together (each gets 1 / num_stages of it).
  double memory_fraction = kDefaultGpuMemoryFraction;
  // Each layer must leave room for the K/V of this many tokens (capped at the model's context).
  int kv_floor_tokens = 8192;
  int probe_rows = 32;
  int probe_context = 256;
  absl::Duration timeout = absl::Minutes(10);
};

struct MeasuredPartition {
  std::vector<int> counts{};
  LayerCostProfile profile{};  // as measured (bytes without the KV floor)
  std::string why{};           // a human-readable paragraph: the split, each stage, the comparison
};

// What the probe printed, turned into the proposal. Pure (no process): the tests and
// ProposeMeasuredPartition share it. Errors: ProposePartition's, and InvalidArgument when the
// profile's layer count differs from the model's (`num_layers`).
absl::StatusOr<MeasuredPartition> ProposeFromProfile(const LayerCostProfile& profile,
                                                     int num_layers, int max_positions,
                                                     std::span<const int64_t> parameter_costs,
                                                     const MeasuredPartitionOptions& options);

// Runs the probe and proposes. The probe writes its profile and log into a directory made for
// it under the temp directory ($TMPDIR, else /tmp) by mkdtemp (unpredictable name, created
// exclusively, mode 0700), removed with its files before this returns, on every path. Errors:
// the probe's (its stderr's last line), a timeout, FailedPrecondition when no such directory
// can be made, or ProposeFromProfile's.
absl::StatusOr<MeasuredPartition> ProposeMeasuredPartition(const MeasuredPartitionOptions& options);

}  // namespace ringserve
