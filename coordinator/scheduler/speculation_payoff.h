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
// and per load bucket (how many sequences decode: 1, 2-3, 4-7, 8-15, ...). A micro-batch of the
// speculating mode counts only if it verifies or drafts: where every sequence's own policy has
// backed off (speculation.h), it decodes plainly.
//
// A bucket runs one mode and now and then probes the other (measures it for up to `samples`
// micro-batches). The first micro-batch after a mode switch is not measured (it only starts the
// drafts, or verifies the last ones). A probe costs the micro-batches it spends in the slower
// mode and two switches (a switch restarts the plan-ahead pipeline), so the rules below keep
// probes few where speculation does not pay, and keep a bucket's mode steady where it cannot be
// measured:
//
//  - Decided: a bucket where both modes were measured runs the faster by their rates (the
//    running mode's follows each of its measured micro-batches, the other's is from its last
//    probe; speculation on a tie) and probes the other after `reprobe_after` of its measured
//    micro-batches; a probe that confirms the decision doubles that interval (up to
//    `max_reprobe_after`), one that overturns it resets it, so where speculation keeps losing
//    it is tried ever more rarely.
//  - Borrowed: speculation's payoff only falls as the load grows (a verification chunk's 1 + k
//    rows per sequence cost more in a larger batch; an accepted draft saves the same step), so
//    a bucket without a decision of its own takes plain decoding when a lower bucket decided
//    it, and speculation when a higher bucket decided it. It also takes plain decoding from the
//    adjacent bucket above (twice its load) when that decided it: the payoff changes little
//    over a factor of two, and plain decoding is the baseline, so a wrong borrow forgoes at
//    most speculation's gain until the bucket's first probe. (One that would borrow both modes,
//    from measurements that contradict monotonicity, borrows neither; speculation is never
//    borrowed upwards.) A borrowing bucket measures the borrowed mode and probes the other
//    after `reprobe_after` micro-batches, as a decided one does: an 8-stream closed loop whose
//    count moves between 7 and 8 (buckets 2 and 3) pays one first probe, not one per bucket.
//  - Fresh: a bucket with neither measures plain decoding first, then probes speculation at
//    once. Plain first, so that the first probe is of speculation, and may end early:
//  - A probe ends early, keeping the bucket's mode, once the probed mode has measured more than
//    `clear_loss` slower (by its new samples alone) over at least `min_samples` micro-batches
//    that cover `samples` sequence steps (micro-batches times sequences decoding): at 8
//    streams a probe of a speculation that loses clearly costs 4 measured micro-batches, not
//    16, while at one sequence a probe always runs its full `samples` (one sequence's
//    acceptance is too noisy to judge sooner).
//  - A probe is given up, as if it had confirmed the bucket's mode, once it has switched into
//    its mode `max_probe_switches` times: its bucket is visited in stretches between
//    micro-batches of other buckets in the other mode, too short to measure that mode (the
//    first of each is a switch) or for it to repay the two switches of each. (Before, such a
//    bucket kept probing speculation, on every visit.)
//  - An overturn reaches the buckets that monotonicity says should follow: when a probe finds
//    speculation faster at bucket b than the mode b ran, lower buckets running plain decoding
//    by their own decision probe at their next measured micro-batch; when it finds plain
//    decoding faster, so do higher ones running speculation. A change of load or acceptance is
//    followed this way, and by each bucket's own probes.
//
// The scheduler adds one rule of its own (scheduler.cc): a plan that prefills does not switch
// into speculation, as the sequences it prefills are about to raise the decoding count.
//
// Pure (no clock of its own: callers pass times in seconds); not thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <optional>

namespace ringserve {

struct SpeculationPayoffOptions {
  bool enabled = true;  // false: always speculate (the per-sequence policy still backs off)
  int samples = 16;     // measured micro-batches per mode for a decision (a probe's length)
  // Micro-batches of a bucket before the slower mode is measured again: a few seconds at any
  // load (an H100 ran ~1,200 micro-batches a second at 8 streams of a small target, where its
  // speculating micro-batches, re-probes every 1,000 among them, with two mode switches each,
  // cost that ring 5% of its throughput).
  int reprobe_after = 4000;
  int max_reprobe_after = 64000;  // the interval's cap after confirming probes (doubling)
  double decay = 0.97;            // weight of the past in each mode's token and time sums
  // A probe ends early when its mode measured more than this fraction slower than the
  // bucket's mode, over at least `min_samples` micro-batches covering `samples` sequence steps.
  double clear_loss = 0.25;
  int min_samples = 4;
  // Switches into the probed mode (the first starts the probe) after which an unfinished probe
  // is given up: its bucket is visited in stretches too short to measure or repay that mode.
  int max_probe_switches = 4;
  // A warm micro-batch that took more than `outlier_factor` times what its tokens took in the
  // other mode is a one-time cost, not the mode's rate: a verification shape's CUDA graph
  // captured or its GEMMs tuned mid-probe (~0.1 s each), or a slow catch-up of the draft after
  // a switch. It is not measured; a probe that meets more than `max_outliers` of them is given
  // up. (On an H200 the payoff chose plain decoding where forced speculation was 4% and 20%
  // faster, plausibly from such costs: bench/spec/NOTES.md.)
  double outlier_factor = 10.0;
  int max_outliers = 16;
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

  // The decision a bucket holds of its own (both modes measured there), if any.
  std::optional<Mode> Decision(int bucket) const;

 private:
  struct Measure {
    double tokens = 0;  // decayed sums: the mode's rate
    double seconds = 0;
    // Since the last (re)start of its measurement: warm micro-batches, and undecayed sums.
    int samples = 0;
    int sequence_steps = 0;
    double new_tokens = 0;
    double new_seconds = 0;
    int switches = 0;  // micro-batches that switched into the mode (unmeasured)
    int outliers = 0;  // warm micro-batches left unmeasured as one-time costs
    double rate() const { return seconds > 0 ? tokens / seconds : 0; }
    double new_rate() const { return new_seconds > 0 ? new_tokens / new_seconds : 0; }
    void Restart();
  };
  struct BucketState {
    Measure speculate;
    Measure plain;
    bool compared = false;  // both modes measured here: it runs the faster
    bool probing = false;   // `probed` is being measured
    Mode probed = Mode::kSpeculate;
    Mode before = Mode::kPlain;  // the mode the running probe may overturn
    int since = 0;               // measured micro-batches of the bucket's mode since its last probe
    int interval = 0;            // before the next probe (0: options.reprobe_after)
    bool waits = false;          // a fresh bucket gave up a probe: the next waits for `interval`
    Measure& of(Mode mode) { return mode == Mode::kSpeculate ? speculate : plain; }
  };

  // Its own decision: the faster mode by the rates now, once both were measured here.
  static std::optional<Mode> Decided(const BucketState& state);
  // The mode a bucket without a decision of its own borrows, if any (see the header comment).
  std::optional<Mode> Borrowed(int bucket) const;
  // The mode a bucket runs between probes: its decision, else the borrowed one, else plain.
  Mode Running(int bucket, const BucketState& state) const;
  void EndProbe(const SpeculationPayoffOptions& options, int bucket, BucketState& state,
                std::optional<Mode> faster);

  std::map<int, BucketState> buckets_;
};

}  // namespace ringserve
