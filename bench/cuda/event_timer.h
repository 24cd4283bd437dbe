// Times back-to-back launches on the default stream with CUDA events (the stage benchmark's
// tables: GEMMs, small kernels, prefill pieces).
#pragma once

#include <cuda_runtime.h>

namespace ringserve::cuda {

// Milliseconds per call of `fn`, averaged over `iters` back-to-back calls after `warmups`
// untimed ones. fn returns a status, ignored here (the tables report errors elsewhere).
template <typename Fn>
double TimeMs(Fn&& fn, int warmups, int iters) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (int i = 0; i < warmups; ++i) (void)fn();
  cudaEventRecord(e0);
  for (int i = 0; i < iters; ++i) (void)fn();
  cudaEventRecord(e1);
  cudaEventSynchronize(e1);
  float ms = 0;
  cudaEventElapsedTime(&ms, e0, e1);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return ms / iters;
}

}  // namespace ringserve::cuda
