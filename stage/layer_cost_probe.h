// The measurement behind `coordinator --partition auto`: loads each decoder layer of a model
// alone on the device the stages will use (a slice [l, l + 1): layer 0 with the embedding, the
// last layer with the final norm, lm_head and sampling), times a decode step of `rows`
// sequences at `context` tokens through it (random hidden states, so a MoE layer's router
// spreads the rows over its experts as real ones do), and reports the median per layer with
// the bytes the layer's weights take there. `stage --probe_layers` prints it
// (ring/partition_proposal.h's text form). One layer is resident at a time, so a model larger
// than the device can be probed.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "ring/partition_proposal.h"

namespace ringserve {

struct LayerProbeOptions {
  std::string model_dir{};
  std::string device = "cpu";  // "cpu" or "cuda:N"
  int rows = 32;               // decode sequences per timed step
  int context = 256;           // tokens of context each sequence has
  int repeats = 5;             // timed steps per layer (after two untimed ones); the median
};

// Errors: the model's (missing files, unsupported config keys) and the backend's, passed
// through; InvalidArgument for rows, context or repeats < 1, or a context beyond the model's.
absl::StatusOr<LayerCostProfile> ProbeLayerCosts(const LayerProbeOptions& options);

}  // namespace ringserve
