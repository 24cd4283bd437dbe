// Runs step plans on one stage, in order: receive the previous stage's activations (unless
// first), run the model slice, then send the activations on (unless last) or sample one token
// per sampling chunk (last). Owns the slice and the stage's channel ends.
//
// One path for every backend: the slice's activation buffer (host or device memory) is what the
// channels move; how (directly, through the host, GPU to GPU) is fixed when the executor is
// created (stage/activation_ports.h).
//
// Not thread-safe: one thread calls Run, plan after plan. Counters are atomics, readable from
// any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
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
  // Testing aid: extra time spent in every step, as if the slice were slower.
  absl::Duration debug_step_delay = absl::ZeroDuration();
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

  // Runs one plan. Any error (bad plan, channel failure, model error) names the stage and the
  // micro-batch; the caller must then stop using this executor (the channels are closed, so
  // the neighbours fail fast too).
  absl::StatusOr<StepOutcome> Run(const v1::StepPlan& plan);

  // Plan-ahead: the stage's end of the token back edge (stage 0 and the last stage; null
  // elsewhere). A plan that uses it fails without one. Call before the first Run.
  void AttachTokenBackEdge(std::unique_ptr<TokenBackEdge> edge) { back_edge_ = std::move(edge); }

  // The last stage with speculative decoding: plans that carry speculation are sampled,
  // verified and drafted by `speculator` (stage/speculative/speculator.h).
  void SetSpeculator(std::unique_ptr<Speculator> speculator);

  // Closes both channel ends and the back edge (neighbours' pending calls fail).
  void CloseChannels();

  const ModelSlice& slice() const { return *slice_; }
  int64_t bytes_sent() const { return bytes_sent_.load(); }
  int64_t bytes_received() const { return bytes_received_.load(); }

 private:
  StepExecutor(StepExecutorOptions options, std::unique_ptr<ModelSlice> slice);
  absl::StatusOr<StepOutcome> RunChecked(const v1::StepPlan& plan);
  // The last stage: samples the batch's rows into outcome->tokens.
  absl::Status SampleInto(const DecodedPlan& decoded, StepOutcome* outcome);

  StepExecutorOptions options_;
  std::unique_ptr<ModelSlice> slice_;
  std::unique_ptr<InputPort> input_;          // null on the first stage
  std::unique_ptr<OutputPort> output_;        // null on the last stage
  std::unique_ptr<TokenBackEdge> back_edge_;  // plan-ahead; see AttachTokenBackEdge
  std::unique_ptr<Speculator> speculator_;    // the last stage with speculation only
  // Over a device channel the slice prepares a batch after its input has arrived, otherwise
  // before (step_executor.cc says why).
  bool prepare_after_input_ = false;
  // Where a step's time goes (summed; logged when the executor goes away).
  struct Timing {
    int64_t steps = 0, prepare_us = 0, wait_us = 0, forward_us = 0, send_us = 0, busy_us = 0;
  } timing_;
  std::atomic<int64_t> bytes_sent_{0};
  std::atomic<int64_t> bytes_received_{0};
};

}  // namespace ringserve
