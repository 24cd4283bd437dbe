#include "coordinator/scheduler/speculation.h"

#include <algorithm>
#include <cmath>

namespace ringserve {

int SpeculationPolicy::NextDrafts(const SpeculationOptions& options, int decoding_sequences) const {
  if (options.max_drafts <= 0 || decoding_sequences > options.max_decoding_sequences) return 0;
  if (acceptance_ < options.off_below) {
    return plain_tokens_ >= options.probe_after_tokens ? 1 : 0;
  }
  const double a = std::min(acceptance_, 0.999);
  int best_k = 0;
  double best = 1.0;  // no drafts: one token per unit of cost
  for (int k = 1; k <= options.max_drafts; ++k) {
    const double value = (1.0 - std::pow(a, k + 1)) / (1.0 - a) / (1.0 + options.draft_cost * k);
    if (value > best) {
      best = value;
      best_k = k;
    }
  }
  return best_k;
}

void SpeculationPolicy::OnVerified(const SpeculationOptions& options, int drafted, int accepted) {
  if (drafted <= 0) return;
  const double rate = static_cast<double>(accepted) / drafted;
  acceptance_ = (1.0 - options.ewma_weight) * acceptance_ + options.ewma_weight * rate;
  plain_tokens_ = 0;
}

}  // namespace ringserve
