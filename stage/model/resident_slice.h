// A slice whose activations live in device memory (the CUDA backend): the step executor then
// keeps a micro-batch's hidden states on the GPU from the receiving channel through the layers
// to the sending channel, and samples the last slice's logits where they are. Implemented next
// to ModelSlice by backends that can (CudaModelSlice); found with dynamic_cast.
//
// Memory: device_hidden() is [max batch tokens, hidden] fp32 on the slice's device. Ordering:
// everything is enqueued on stream(); a GPU channel orders its copies on the same stream.
// Not thread-safe (as ModelSlice).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/gpu_stream.h"
#include "stage/model/model_slice.h"
#include "stage/sampling/sampler.h"

namespace ringserve {

struct SampledRows {
  std::vector<int32_t> tokens;  // one per sampling row, in chunk order
  std::vector<float> logprobs;  // log_softmax(raw logits)[token], same order
};

class ResidentSlice {
 public:
  virtual ~ResidentSlice() = default;

  virtual float* device_hidden() = 0;
  virtual GpuStream gpu_stream() = 0;
  virtual int gpu_device() const = 0;
  // Rows of device_hidden().
  virtual int max_batch_tokens() const = 0;

  // Host <-> device_hidden() copies of a micro-batch's [tokens, hidden] fp32 (a tcp hop).
  virtual absl::Status CopyHiddenIn(std::span<const float> hidden) = 0;
  virtual absl::Status CopyHiddenOut(std::span<float> hidden) = 0;

  // Optional (the step executor calls it before the input arrives over a host channel, after
  // the input's wait over a GPU channel): validates `batch` and enqueues its metadata upload,
  // so that the ForwardResident / SampleResident call for the same batch object (which must
  // follow, with the batch unchanged) only launches. Errors as ForwardResident's.
  virtual absl::Status PrepareResident(const MicroBatch& batch) = 0;
  // Not the last slice: runs `batch` on the input in device_hidden() (the first slice embeds
  // the token ids) and leaves the output there, enqueued on gpu_stream().
  virtual absl::Status ForwardResident(const MicroBatch& batch) = 0;
  // The last slice: runs `batch` on device_hidden() and samples one token per LAST_TOKEN row
  // (`rows` in chunk order). Returns when the tokens are on the host.
  virtual absl::StatusOr<SampledRows> SampleResident(const MicroBatch& batch,
                                                     std::span<const RowSampling> rows) = 0;

  // GPU time of steps (the CPU only enqueues a step's work, so its CPU time says little):
  // BeginStepTiming() before a step's work is enqueued on gpu_stream(), EndStepTiming() after.
  // TakeStepGpuMicros() returns the GPU time of the timed steps that have finished on the GPU
  // since the previous call (a step still running is counted by a later call). Best effort.
  virtual void BeginStepTiming() = 0;
  virtual void EndStepTiming() = 0;
  virtual int64_t TakeStepGpuMicros() = 0;
};

}  // namespace ringserve
