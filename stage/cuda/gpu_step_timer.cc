#include "stage/cuda/gpu_step_timer.h"

namespace ringserve::cuda {

GpuStepTimer::~GpuStepTimer() {
  if (!created_) return;
  for (Pair& p : pairs_) {
    if (p.start) cudaEventDestroy(p.start);
    if (p.end) cudaEventDestroy(p.end);
  }
}

bool GpuStepTimer::EnsureEvents() {
  if (created_) return true;
  for (Pair& p : pairs_) {
    if (cudaEventCreate(&p.start) != cudaSuccess || cudaEventCreate(&p.end) != cudaSuccess) {
      return false;
    }
  }
  created_ = true;
  return true;
}

void GpuStepTimer::Begin(cudaStream_t stream) {
  open_ = false;
  if (!EnsureEvents() || timed_ - taken_ >= kMaxPending) return;
  if (cudaEventRecord(pairs_[timed_ % kMaxPending].start, stream) != cudaSuccess) return;
  open_ = true;
}

void GpuStepTimer::End(cudaStream_t stream) {
  if (!open_) return;
  open_ = false;
  if (cudaEventRecord(pairs_[timed_ % kMaxPending].end, stream) != cudaSuccess) return;
  ++timed_;
}

int64_t GpuStepTimer::TakeCompletedMicros() {
  double total_ms = 0;
  while (taken_ < timed_) {
    const Pair& p = pairs_[taken_ % kMaxPending];
    if (cudaEventQuery(p.end) != cudaSuccess) break;  // not yet run (or failed: stop counting)
    float ms = 0;
    if (cudaEventElapsedTime(&ms, p.start, p.end) == cudaSuccess) total_ms += ms;
    ++taken_;
  }
  return static_cast<int64_t>(total_ms * 1000.0);
}

}  // namespace ringserve::cuda
