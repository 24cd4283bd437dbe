#include "coordinator/scheduler/speculation_payoff.h"

#include <algorithm>
#include <bit>

namespace ringserve {

int SpeculationPayoff::Bucket(int decoding) {
  return decoding <= 1 ? 0 : static_cast<int>(std::bit_width(static_cast<unsigned>(decoding))) - 1;
}

SpeculationPayoff::Mode SpeculationPayoff::ModeFor(const SpeculationPayoffOptions& options,
                                                   int decoding) const {
  if (!options.enabled) return Mode::kSpeculate;
  auto it = buckets_.find(Bucket(decoding));
  if (it == buckets_.end()) return Mode::kSpeculate;
  const BucketState& b = it->second;
  if (b.speculate.samples < options.samples) return Mode::kSpeculate;
  if (b.plain.samples < options.samples) return Mode::kPlain;
  return b.speculate.rate() >= b.plain.rate() ? Mode::kSpeculate : Mode::kPlain;
}

void SpeculationPayoff::OnMeasured(const SpeculationPayoffOptions& options, int decoding, Mode mode,
                                   bool warm, double took_s, int tokens) {
  if (!options.enabled || !warm || took_s <= 0) return;
  BucketState& b = buckets_[Bucket(decoding)];
  Measure& m = mode == Mode::kSpeculate ? b.speculate : b.plain;
  m.tokens = options.decay * m.tokens + tokens;
  m.seconds = options.decay * m.seconds + took_s;
  ++m.samples;
  if (b.speculate.samples < options.samples || b.plain.samples < options.samples) return;
  const Mode faster = b.speculate.rate() >= b.plain.rate() ? Mode::kSpeculate : Mode::kPlain;
  if (b.interval == 0) b.interval = options.reprobe_after;
  if (b.probing) {  // this measurement completed the probe
    b.probing = false;
    b.interval =
        faster == b.faster_before
            ? std::min(options.max_reprobe_after, std::max(options.reprobe_after, 2 * b.interval))
            : options.reprobe_after;
  }
  if (++b.since_decision < b.interval) return;
  // Measure the slower mode again (its old sums stay as the prior).
  b.since_decision = 0;
  b.probing = true;
  b.faster_before = faster;
  (faster == Mode::kSpeculate ? b.plain : b.speculate).samples = 0;
}

double SpeculationPayoff::Rate(int bucket, Mode mode) const {
  auto it = buckets_.find(bucket);
  if (it == buckets_.end()) return 0;
  return (mode == Mode::kSpeculate ? it->second.speculate : it->second.plain).rate();
}

}  // namespace ringserve
