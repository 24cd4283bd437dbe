// Runs step plans on one stage, in order: receive the previous stage's activations (unless
// first), run the model slice, then send the activations on (unless last) or sample one token
// per sampling chunk (last). Owns the slice and the stage's channel ends.
//
// A slice that is also a ResidentSlice (CUDA) keeps activations on its GPU: device channel ends
// move them GPU to GPU, host (tcp) ends copy them through the host, and the last slice samples
// its logits rows itself.
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
#include "stage/activation_channel.h"
#include "stage/model/model_slice.h"
#include "stage/model/resident_slice.h"
#include "ring/plan_codec.h"
#include "stage/stage_backend.h"

namespace ringserve {

struct StepOutcome {
  std::vector<v1::SampledToken> tokens;  // last stage: one per sampling chunk, in chunk order
  // Slice forward + sampling. A GPU slice: the GPU time of the steps that finished on the GPU
  // since the previous outcome (the CPU only enqueues; usually the previous step's time, this
  // step's own on the last stage, which waits for its tokens).
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
  // sending end exactly on the last. Device ends need a ResidentSlice.
  StepExecutor(StepExecutorOptions options, std::unique_ptr<ModelSlice> slice,
               StageChannels channels);
  ~StepExecutor();

  // Runs one plan. Any error (bad plan, channel failure, model error) names the stage and the
  // micro-batch; the caller must then stop using this executor (the channels are closed, so
  // the neighbours fail fast too).
  absl::StatusOr<StepOutcome> Run(const v1::StepPlan& plan);

  // Closes both channel ends (neighbours' pending calls fail).
  void CloseChannels();

  const ModelSlice& slice() const { return *slice_; }
  int64_t bytes_sent() const { return bytes_sent_.load(); }
  int64_t bytes_received() const { return bytes_received_.load(); }

 private:
  absl::StatusOr<StepOutcome> RunChecked(const v1::StepPlan& plan);
  // The input of a stage that is not first, into hidden_in_ or the resident slice's buffer.
  absl::Status ReceiveInput(uint64_t micro_batch_id, int64_t total_tokens);
  absl::Status SendOutput(uint64_t micro_batch_id, std::span<const float> host_out,
                          int64_t total_tokens, StepOutcome* outcome);
  // A resident slice: ends the step's GPU timing; returns the GPU time of the steps finished
  // since the previous call (this one, on the last stage, which waits for its tokens).
  int64_t EndGpuStep();

  StepExecutorOptions options_;
  std::unique_ptr<ModelSlice> slice_;
  ResidentSlice* resident_ = nullptr;  // slice_ as a ResidentSlice, or null
  StageChannels channels_;
  std::vector<float> hidden_in_;
  std::vector<float> hidden_out_;
  // Where a step's time goes (summed; logged when the executor goes away).
  struct Timing {
    int64_t steps = 0, prepare_us = 0, wait_us = 0, forward_us = 0, send_us = 0, gpu_us = 0;
    void Add(int64_t prepare, int64_t wait) {
      ++steps;
      prepare_us += prepare;
      wait_us += wait;
    }
    void AddCompute(int64_t forward, int64_t send) {
      forward_us += forward;
      send_us += send;
    }
  } timing_;
  std::atomic<int64_t> bytes_sent_{0};
  std::atomic<int64_t> bytes_received_{0};
};

}  // namespace ringserve
