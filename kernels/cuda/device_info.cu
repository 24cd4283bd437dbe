// A .cu file so that nvcc defines __CUDA_ARCH_LIST__ (the virtual architectures it compiles the
// library's kernels for, e.g. 800,900) in this translation unit too.
#include <cuda_runtime.h>

#include "common/status_macros.h"
#include "kernels/cuda/cuda_utils.h"
#include "kernels/cuda/device_info.h"

namespace ringserve::cuda {

absl::StatusOr<DeviceInfo> QueryDeviceInfo(int device) {
  int major = 0, minor = 0;
  DeviceInfo info;
  RS_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  RS_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  RS_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&info.num_sms, cudaDevAttrMultiProcessorCount, device));
  RS_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&info.max_shared_memory_per_block_optin,
                                                 cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  info.compute_capability = major * 10 + minor;
  return info;
}

CompiledKernels CompiledKernelsOfThisBuild() {
  CompiledKernels compiled;
#if defined(__CUDA_ARCH_LIST__)
  for (int arch : {__CUDA_ARCH_LIST__}) compiled.archs.push_back(arch / 10);
#else
#error "nvcc defines __CUDA_ARCH_LIST__ (CUDA 11.5+); this file must be compiled by nvcc"
#endif
#if defined(RS_HAVE_SM90_PREFILL)
  compiled.sm90a_prefill = true;
#endif
  return compiled;
}

absl::StatusOr<KernelPlan> SelectKernelsForDevice(int device, const AttentionDims& dims,
                                                  const KernelOptions& options) {
  RS_ASSIGN_OR_RETURN(const DeviceInfo info, QueryDeviceInfo(device));
  return SelectKernels(info, CompiledKernelsOfThisBuild(), dims, options);
}

}  // namespace ringserve::cuda
