// GpuStepTimer: the GPU time of a stage's steps, measured with CUDA timing events on the
// stage's stream. A GPU stage only enqueues work and returns (the handoff to the next stage
// happens on the GPU), so the CPU time of a step says little about how busy the GPU was.
//
// Begin() before a step's work is enqueued, End() after; TakeCompletedMicros() sums the steps
// whose End has passed on the GPU since the previous call, oldest first (a step still running
// is counted by a later call). At most kMaxPending steps are timed at once; a step begun while
// that many are still pending is not timed (its time is lost, never mis-attributed).
//
// Not thread-safe (one stage thread). Errors from CUDA are ignored: timing is best effort and
// never fails a step.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdint>

namespace ringserve::cuda {

class GpuStepTimer {
 public:
  static constexpr int kMaxPending = 16;

  GpuStepTimer() = default;
  ~GpuStepTimer();
  GpuStepTimer(const GpuStepTimer&) = delete;
  GpuStepTimer& operator=(const GpuStepTimer&) = delete;

  void Begin(cudaStream_t stream);
  void End(cudaStream_t stream);
  int64_t TakeCompletedMicros();

 private:
  struct Pair {
    cudaEvent_t start = nullptr;
    cudaEvent_t end = nullptr;
  };
  bool EnsureEvents();

  std::array<Pair, kMaxPending> pairs_{};
  bool created_ = false;
  uint64_t timed_ = 0;  // steps with both events recorded; pairs_[timed_ % kMaxPending] is next
  uint64_t taken_ = 0;  // steps counted by TakeCompletedMicros
  bool open_ = false;   // Begin recorded, End not yet
};

}  // namespace ringserve::cuda
