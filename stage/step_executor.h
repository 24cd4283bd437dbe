// Runs step plans on one stage, in order: receive the previous stage's activations (unless
// first), run the model slice, then send the activations on (unless last) or sample one token
// per sampling chunk (last). Owns the slice and the stage's channel ends.
//
// One path for every backend: the slice's activation buffer (host or device memory) is what the
// channels move; how (directly, through the host, GPU to GPU) is fixed when the executor is
// created (stage/activation_ports.h).
//
// Not thread-safe: one thread calls Run (or Submit and FinishOldest), plan after plan. Counters
// are atomics, readable from any thread; Activity and AbortChannels may be called from any
// thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ring/plan_codec.h"
#include "stage/activation_ports.h"
#include "stage/channels/stage_channels.h"
#include "stage/model/model_slice.h"
#include "stage/token_back_edge.h"

namespace ringserve {

class Speculator;  // stage/speculative/speculator.h

struct StepOutcome {
  std::vector<v1::SampledToken> tokens;  // last stage: one per sampling chunk, in chunk order
  std::vector<v1::PromptLogprobs> prompt_logprobs;  // last stage: one per ALL_TOKENS chunk
  // Slice forward + sending or sampling (ModelSlice::TakeStepMicros). A GPU slice: the GPU
  // time of the steps that finished on the GPU since the previous outcome (the CPU only
  // enqueues; usually the previous step's time, this step's own on the last stage, which waits
  // for its tokens).
  int64_t busy_us = 0;
  int64_t wait_us = 0;  // waiting for the previous stage's activations
  int64_t bytes_sent = 0;
  int num_tokens = 0;
};

struct StepExecutorOptions {
  int stage_index = 0;
  absl::Duration recv_timeout = absl::Seconds(120);
  absl::Duration send_timeout = absl::Seconds(120);
  // Submit may leave a step's sampling in flight (one-stage rings with plans sent ahead); off:
  // every step finishes inside Submit (A/B runs: RINGSERVE_SAMPLING_IN_FLIGHT=0 for a stage).
  bool sampling_in_flight = true;
  // Testing aid: extra time spent in every step, as if the slice were slower.
  absl::Duration debug_step_delay = absl::ZeroDuration();
  // Testing aid (> 0): after this many steps the stage stops taking its input, as a wedged
  // stage that no longer reads would: the next step waits, receiving, until AbortChannels.
  int debug_stall_after_steps = 0;
};

// What a step executor is doing (the stage's activity reports, proto StageActivity).
struct ExecutorActivity {
  enum class State { kIdle, kReceiving, kComputing, kSending };  // proto StageActivity's order
  State state = State::kIdle;
  uint64_t micro_batch_id = 0;  // of the step in that state
  absl::Time since;             // when the executor entered it
  // Bytes its channels have moved (ActivationSender::bytes_moved), summed; -1 when one of them
  // cannot tell (a GPU channel) or it has none.
  int64_t channel_bytes = -1;
};

class StepExecutor {
 public:
  // The channels' receiving end (host or device) is null exactly on the first stage, the
  // sending end exactly on the last. FailedPrecondition for a device end when the slice's
  // activations live on the host.
  static absl::StatusOr<std::unique_ptr<StepExecutor>> Create(StepExecutorOptions options,
                                                              std::unique_ptr<ModelSlice> slice,
                                                              StageChannels channels);
  ~StepExecutor();

  // Runs one plan to its outcome (Submit, then FinishOldest). FailedPrecondition while steps
  // submitted before are unfinished.
  absl::StatusOr<StepOutcome> Run(const v1::StepPlan& plan);

  // Plans in flight. Submit runs a plan's step, except that on a one-stage ring with plans sent
  // ahead (an in-process token back edge, a slice that can_sample_async) it may leave the step's
  // sampling in flight: the device then runs the next submitted step, which takes its ahead
  // tokens from that sampling on the device (ModelSlice::PrepareFed), while the host collects
  // and reports the tokens. Every other step finishes inside Submit (it first collects the
  // samplings in flight when it needs their tokens on the host or samples itself).
  // FinishOldest returns the outcomes in submission order, one per submitted plan; it blocks
  // until the oldest step's tokens are on the host (OldestFinishes: without blocking).
  // Any error (bad plan, channel failure, model error) names the stage and the micro-batch; a
  // failed Submit leaves no step behind. After a channel or model error the caller must stop
  // using this executor (the channels are closed, so the neighbours fail fast too).
  absl::Status Submit(v1::StepPlan plan);
  int steps_in_flight() const { return static_cast<int>(pending_.size()); }
  bool OldestFinishes() const;
  // The oldest step's micro-batch (steps_in_flight() > 0).
  uint64_t oldest_micro_batch_id() const { return pending_.front().plan.micro_batch_id(); }
  absl::StatusOr<StepOutcome> FinishOldest();

  // Plan-ahead: the stage's end of the token back edge (stage 0 and the last stage; null
  // elsewhere). A plan that uses it fails without one. Call before the first Run.
  void AttachTokenBackEdge(std::unique_ptr<TokenBackEdge> edge) { back_edge_ = std::move(edge); }

  // The last stage with speculative decoding: plans that carry speculation are sampled,
  // verified and drafted by `speculator` (stage/speculative/speculator.h).
  void SetSpeculator(std::unique_ptr<Speculator> speculator);

  // Closes both channel ends and the back edge (neighbours' pending calls fail).
  void CloseChannels();
  // Thread-safe: a step blocked on a channel (a neighbour that takes or sends nothing) fails at
  // once with Cancelled, and so does every later channel call. For a stage whose ring is over
  // (its Steps stream ended) while its executor thread still waits.
  void AbortChannels();
  // Thread-safe: what the executor is doing now.
  ExecutorActivity Activity() const;

  const ModelSlice& slice() const { return *slice_; }
  int64_t bytes_sent() const { return bytes_sent_.load(); }
  int64_t bytes_received() const { return bytes_received_.load(); }
  // Steps whose ahead tokens came from the device (Submit), since creation.
  int64_t fed_steps() const { return fed_steps_; }

 private:
  // A submitted plan until FinishOldest returns its outcome.
  struct PendingStep {
    v1::StepPlan plan;
    DecodedPlan decoded;
    StepOutcome outcome;
    bool sampling_in_flight = false;  // SampleAsync not yet collected
    bool fed = false;  // ahead tokens taken on the device: the back edge's messages still to take
    int64_t idle_before_us = -1;  // submitted with no step in flight: how long it was idle
  };

  StepExecutor(StepExecutorOptions options, std::unique_ptr<ModelSlice> slice);
  absl::Status SubmitChecked(PendingStep& step);
  // The ahead tokens of `step` (stage 0 with a back edge): on the device from the step in
  // flight just before it when it can (`feeds`, step.fed), else from the back edge's messages
  // on the host (collecting the samplings in flight first).
  absl::Status TakeAheadTokens(PendingStep& step, std::vector<TokenFeed>* feeds);
  // Whether the last stage may leave the step's sampling in flight.
  bool CanDefer(const PendingStep& step) const;
  // Completes the steps submitted before `step` that still wait for their sampling or their
  // back-edge messages, oldest first (their outcomes stay for FinishOldest).
  absl::Status FinishSamplingsBefore(const PendingStep* step);
  // Takes a step's back-edge messages (fed) and its tokens (sampling in flight); sends them on.
  absl::Status Complete(PendingStep& step);
  absl::Status AnnotateError(const absl::Status& status, uint64_t micro_batch_id);
  // Records what the executor starts doing (Activity).
  void SetActivity(ExecutorActivity::State state, uint64_t micro_batch_id);
  // options_.debug_stall_after_steps' stall: waits until AbortChannels, then Cancelled.
  absl::Status DebugStall(uint64_t micro_batch_id);
  // The last stage: samples the batch's rows into outcome->tokens.
  absl::Status SampleInto(const DecodedPlan& decoded, StepOutcome* outcome);
  // outcome->tokens from the slice's sampled rows (one per LAST_TOKEN chunk, in chunk order).
  absl::Status TokensFromRows(const DecodedPlan& decoded, const SampledRows& sampled,
                              StepOutcome* outcome) const;

  StepExecutorOptions options_;
  std::unique_ptr<ModelSlice> slice_;
  std::unique_ptr<InputPort> input_;          // null on the first stage
  std::unique_ptr<OutputPort> output_;        // null on the last stage
  std::unique_ptr<TokenBackEdge> back_edge_;  // plan-ahead; see AttachTokenBackEdge
  std::unique_ptr<Speculator> speculator_;    // the last stage with speculation only
  std::deque<PendingStep> pending_;           // submitted, outcome not yet returned
  int samplings_in_flight_ = 0;               // pending_ steps with sampling_in_flight
  int64_t fed_steps_ = 0;
  // Over a device channel the slice prepares a batch after its input has arrived, otherwise
  // before (step_executor.cc says why).
  bool prepare_after_input_ = false;
  // Where a step's time goes (summed; logged when the executor goes away).
  struct Timing {
    int64_t steps = 0, prepare_us = 0, wait_us = 0, forward_us = 0, send_us = 0, busy_us = 0;
    // Steps submitted with none in flight, and how long the executor had been idle before
    // each (on a speculating ring: the coordinator's turn between a result and the next plan).
    int64_t idle_steps = 0, idle_us = 0;
    // Steps the speculator sampled (a subset of the above): forward = the target's wait,
    // verification and drafting (stage/speculative/speculator.h splits it), busy = GPU time.
    int64_t spec_steps = 0, spec_forward_us = 0, spec_busy_us = 0, spec_idle_steps = 0,
            spec_idle_us = 0;
  } timing_;
  std::atomic<int64_t> bytes_sent_{0};
  std::atomic<int64_t> bytes_received_{0};
  mutable std::mutex activity_mu_;
  ExecutorActivity activity_;  // guarded by activity_mu_ (channel_bytes unused)
  bool aborted_ = false;       // guarded by activity_mu_
  std::condition_variable aborted_cv_;
};

}  // namespace ringserve
