#include "coordinator/scheduler/speculation_payoff.h"

#include <algorithm>
#include <bit>

namespace ringserve {
namespace {

using Mode = SpeculationPayoff::Mode;

Mode Other(Mode mode) { return mode == Mode::kSpeculate ? Mode::kPlain : Mode::kSpeculate; }

}  // namespace

void SpeculationPayoff::Measure::Restart() {
  samples = 0;
  sequence_steps = 0;
  new_tokens = 0;
  new_seconds = 0;
  switches = 0;
  outliers = 0;
}

int SpeculationPayoff::Bucket(int decoding) {
  return decoding <= 1 ? 0 : static_cast<int>(std::bit_width(static_cast<unsigned>(decoding))) - 1;
}

std::optional<Mode> SpeculationPayoff::Decided(const BucketState& state) {
  if (!state.compared) return std::nullopt;
  return state.speculate.rate() >= state.plain.rate() ? Mode::kSpeculate : Mode::kPlain;
}

std::optional<Mode> SpeculationPayoff::Borrowed(int bucket) const {
  bool plain = false;
  bool speculate = false;
  for (const auto& [other, state] : buckets_) {
    const std::optional<Mode> decided = Decided(state);
    if (other == bucket || !decided) continue;
    if (*decided == Mode::kPlain) plain |= other < bucket || other == bucket + 1;
    if (*decided == Mode::kSpeculate) speculate |= other > bucket;
  }
  if (plain == speculate) return std::nullopt;  // neither, or measurements that contradict
  return plain ? Mode::kPlain : Mode::kSpeculate;
}

Mode SpeculationPayoff::Running(int bucket, const BucketState& state) const {
  if (const std::optional<Mode> decided = Decided(state)) return *decided;
  return Borrowed(bucket).value_or(Mode::kPlain);
}

Mode SpeculationPayoff::ModeFor(const SpeculationPayoffOptions& options, int decoding) const {
  if (!options.enabled) return Mode::kSpeculate;
  const int bucket = Bucket(decoding);
  auto it = buckets_.find(bucket);
  if (it == buckets_.end()) return Running(bucket, BucketState{});
  return it->second.probing ? it->second.probed : Running(bucket, it->second);
}

void SpeculationPayoff::OnMeasured(const SpeculationPayoffOptions& options, int decoding, Mode mode,
                                   bool warm, double took_s, int tokens) {
  if (!options.enabled || took_s <= 0) return;
  const int bucket = Bucket(decoding);
  BucketState& b = buckets_[bucket];
  Measure& m = b.of(mode);
  const Measure& other = b.of(Other(mode));
  if (warm && tokens > 0 && other.rate() > 0 &&
      took_s > options.outlier_factor * tokens / other.rate()) {
    if (b.probing && mode == b.probed && ++m.outliers > options.max_outliers) {
      EndProbe(options, bucket, b, std::nullopt);
    }
    return;
  }
  if (!warm) {
    // Only a probe's first switch is its own: the others are visits of this bucket between
    // micro-batches of other buckets in the other mode, each paying two switches.
    if (b.probing && mode == b.probed && ++m.switches >= options.max_probe_switches) {
      EndProbe(options, bucket, b, std::nullopt);
    }
    return;
  }
  m.tokens = options.decay * m.tokens + tokens;
  m.seconds = options.decay * m.seconds + took_s;
  ++m.samples;
  m.sequence_steps += std::max(1, decoding);
  m.new_tokens += tokens;
  m.new_seconds += took_s;

  if (b.probing) {
    if (mode != b.probed) return;
    if (m.samples >= options.samples) {
      EndProbe(options, bucket, b,
               b.speculate.rate() >= b.plain.rate() ? Mode::kSpeculate : Mode::kPlain);
    } else if (m.samples >= options.min_samples && m.sequence_steps >= options.samples &&
               m.new_rate() < (1 - options.clear_loss) * b.of(b.before).rate()) {
      // The new samples alone say it: older ones (decayed, from before a change) must not
      // outweigh them in the rate the bucket compares from now on.
      m.tokens = m.new_tokens;
      m.seconds = m.new_seconds;
      EndProbe(options, bucket, b, b.before);
    }
    return;
  }
  const Mode running = Running(bucket, b);
  if (mode != running || m.samples < options.samples) return;  // the bucket's mode first
  const bool waits = b.compared || b.waits || Borrowed(bucket);
  const int interval = b.interval > 0 ? b.interval : options.reprobe_after;
  if (waits && ++b.since < interval) return;
  b.probing = true;
  b.before = running;
  b.probed = Other(running);
  b.of(b.probed).Restart();
}

void SpeculationPayoff::EndProbe(const SpeculationPayoffOptions& options, int bucket,
                                 BucketState& b, std::optional<Mode> faster) {
  const int interval = b.interval > 0 ? b.interval : options.reprobe_after;
  const int longer =
      std::min(options.max_reprobe_after, std::max(options.reprobe_after, 2 * interval));
  b.probing = false;
  b.since = 0;
  if (!faster) {  // given up: as if it had confirmed the bucket's mode
    b.interval = longer;
    b.waits = true;
    return;
  }
  const bool first = !b.compared;
  b.compared = true;
  if (*faster == b.before) {
    b.interval = first ? options.reprobe_after : longer;
    return;
  }
  b.interval = options.reprobe_after;
  // An overturn (of a decision, or of the mode borrowed or started with): the buckets that
  // monotonicity says should follow probe at their next measured micro-batch (more speculation
  // below a bucket where it now wins, less above one where it now loses).
  for (auto& [other, state] : buckets_) {
    if (other == bucket || state.probing || Decided(state) != b.before) continue;
    if ((*faster == Mode::kSpeculate) == (other < bucket)) {
      const int wait = state.interval > 0 ? state.interval : options.reprobe_after;
      state.since = std::max(state.since, wait - 1);
    }
  }
}

double SpeculationPayoff::Rate(int bucket, Mode mode) const {
  auto it = buckets_.find(bucket);
  if (it == buckets_.end()) return 0;
  return (mode == Mode::kSpeculate ? it->second.speculate : it->second.plain).rate();
}

std::optional<Mode> SpeculationPayoff::Decision(int bucket) const {
  auto it = buckets_.find(bucket);
  return it == buckets_.end() ? std::nullopt : Decided(it->second);
}

}  // namespace ringserve
