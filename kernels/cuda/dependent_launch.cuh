// Programmatic dependent launch (sm_90): a decode step is ~10 small kernels per layer, and on
// an H200 the gap between two dependent kernels (drain, launch, ramp-up) is a few microseconds
// each — a large share of a 1-stream step. A kernel launched with LaunchDependent may be
// scheduled while the previous kernel on the stream is still running; it must call
// WaitForPreviousKernel() before it touches global memory (reads OR writes) that kernels before
// it on the stream may write, which blocks until the previous kernel has completed and its
// writes are visible, and then lets the next kernel be scheduled early in turn. Only data no
// kernel of the stream writes in the meantime may be read before the wait (the GEMVs' weights;
// the decode attention's older keys, attention.h); each such kernel states it in its header.
// Without the launch attribute (a LaunchStream without `dependent`: the KernelPlan's choice) or in
// code compiled for older GPUs the wait is a no-op and the stream serializes as usual — so the
// selector never asks for dependent launches of code compiled below sm_90, which would not wait.
// CUDA graphs captured from such launches keep the programmatic edges.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "kernels/cuda/cuda_utils.h"

namespace ringserve::cuda {

__device__ __forceinline__ void WaitForPreviousKernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

template <typename... Params, typename... Args>
void LaunchDependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes,
                     LaunchStream stream, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = stream.dependent ? 1 : 0;
  cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace ringserve::cuda
