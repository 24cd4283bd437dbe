// The selector's inputs from the real device and this build (kernel_selector.h).
#pragma once

#include "absl/status/statusor.h"
#include "kernels/cuda/kernel_selector.h"

namespace ringserve::cuda {

// Compute capability, SM count and per-CTA shared memory of CUDA device `device`. Internal error
// naming the CUDA failure (no device, no driver).
absl::StatusOr<DeviceInfo> QueryDeviceInfo(int device);

// The architectures this binary's kernels were compiled for (nvcc's __CUDA_ARCH_LIST__) and
// whether the sm_90a prefill kernel is in it.
CompiledKernels CompiledKernelsOfThisBuild();

// SelectKernels for `device` and this build.
absl::StatusOr<KernelPlan> SelectKernelsForDevice(int device, const AttentionDims& dims,
                                                  const KernelOptions& options);

}  // namespace ringserve::cuda
