// Whether speculative decoding pays, judged by measured throughput (speculation.h decides k per
// sequence from its acceptance rate; this decides, for the whole ring, whether to draft at all).
//
// A good acceptance rate does not make speculation pay: a verification chunk of 1 + k tokens,
// the draft model's steps and the step-by-step planning they need cost time, and at a large
// batch (or with a small target) that time is more than the accepted drafts save. So the
// scheduler measures both: decode-only micro-batches are timed (from the later of their issue
// and the previous completion, to their completion: the ring's throughput, also with several
// micro-batches in flight; plus the coordinator's time between the previous completion and
// their issue, up to their own time: speculating sequences wait for each result, plain decodes
// planned ahead hide it) and their emitted tokens counted, per mode (speculating or plain)
// and per load bucket (how many sequences decode: 1, 2-3, 4-7, 8-15, ...). A bucket first
// measures speculation, then plain decoding, `samples` micro-batches each, and then runs the
// faster mode (speculation on a tie); the slower one is measured again after `reprobe_after`
// micro-batches of that bucket, so a change of load or acceptance is followed. Each probe costs
// `samples` micro-batches in the slower mode (and a switch each way), so a probe that confirms
// the decision doubles the bucket's interval (up to `max_reprobe_after`) and one that overturns
// it resets the interval to `reprobe_after`: where speculation keeps losing, it is tried ever
// more rarely. The first
// micro-batch after a mode switch is not measured (it only starts the drafts, or verifies the last
// ones).
//
// Pure (no clock of its own: callers pass times in seconds); not thread-safe.
#pragma once

#include <cstdint>
#include <map>

namespace ringserve {

struct SpeculationPayoffOptions {
  bool enabled = true;  // false: always speculate (the per-sequence policy still backs off)
  int samples = 16;     // measured micro-batches per mode before deciding
  // Micro-batches of a bucket before the slower mode is measured again: a few seconds at any
  // load (an H100 ran ~1,200 micro-batches a second at 8 streams of a small target, where the
  // re-probes at 1,000, with two mode switches each, cost that ring 5% of its throughput).
  int reprobe_after = 4000;
  int max_reprobe_after = 64000;  // the interval's cap after confirming probes (doubling)
  double decay = 0.97;            // weight of the past in each mode's token and time sums
};

class SpeculationPayoff {
 public:
  enum class Mode { kSpeculate, kPlain };

  // The load bucket of `decoding` sequences: 0 for 0-1, 1 for 2-3, 2 for 4-7, ...
  static int Bucket(int decoding);

  // The mode for the next micro-batch with `decoding` sequences decoding.
  Mode ModeFor(const SpeculationPayoffOptions& options, int decoding) const;

  // A micro-batch planned in `mode` for `decoding` sequences finished: it `took_s` seconds of
  // the ring's time and emitted `tokens`. `warm`: the micro-batch planned before it was in the
  // same mode (else it only counts towards the switch).
  void OnMeasured(const SpeculationPayoffOptions& options, int decoding, Mode mode, bool warm,
                  double took_s, int tokens);

  // Measured tokens per second of a bucket's mode (0 when not measured).
  double Rate(int bucket, Mode mode) const;

 private:
  struct Measure {
    double tokens = 0;
    double seconds = 0;
    int samples = 0;  // since the last (re)start of its measurement
    double rate() const { return seconds > 0 ? tokens / seconds : 0; }
  };
  struct BucketState {
    Measure speculate;
    Measure plain;
    int since_decision = 0;  // measured micro-batches since both modes were measured
    int interval = 0;        // the current reprobe interval (0: options.reprobe_after)
    bool probing = false;    // the slower mode is being measured again
    Mode faster_before = Mode::kSpeculate;  // the decision the running probe may overturn
  };
  std::map<int, BucketState> buckets_;
};

}  // namespace ringserve
