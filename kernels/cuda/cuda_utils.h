// Small helpers shared by the CUDA kernels and their callers: error checking that turns CUDA
// and cuBLAS failures into absl::Status, an owning device buffer, and the bf16 type.
//
// Every CUDA runtime / cuBLAS call in ringserve goes through RS_CUDA_RETURN_IF_ERROR or
// RS_CUBLAS_RETURN_IF_ERROR (or CudaStatus / CublasStatus). Launch helpers check
// cudaGetLastError() after each launch and return its status.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"

namespace ringserve::cuda {

using bf16 = __nv_bfloat16;

// OK for cudaSuccess, else Internal naming `what` and the CUDA error string.
absl::Status CudaStatus(cudaError_t error, const char* what);
// OK for CUBLAS_STATUS_SUCCESS (0), else Internal naming `what` and the cuBLAS status.
absl::Status CublasStatus(int status, const char* what);
// Status of the last launch (cudaGetLastError), naming the kernel.
absl::Status LaunchStatus(const char* kernel);

// Number of visible CUDA devices; 0 when there is no driver or no device (never an error).
int CudaDeviceCount();

// The stream a launcher enqueues on, and whether its kernels are launched as programmatic
// dependents of the kernel before them (dependent_launch.cuh): set only from a KernelPlan whose
// dependent_launch is on (kernel_selector.h: an sm_90 device running sm_90 code). A plain
// cudaStream_t (or nullptr) converts to a stream without dependent launches, and a LaunchStream
// converts back to its cudaStream_t for the runtime's calls. CUDA graphs captured from dependent
// launches keep the programmatic edges.
struct LaunchStream {
  LaunchStream(cudaStream_t s = nullptr, bool dependent_launch = false)  // NOLINT: implicit
      : stream(s), dependent(dependent_launch) {}
  operator cudaStream_t() const { return stream; }  // NOLINT: implicit
  cudaStream_t stream;
  bool dependent;
};

// An owning, move-only device allocation (cudaMalloc / cudaFree). Not thread-safe.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { Reset(); }
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      Reset();
      ptr_ = std::exchange(other.ptr_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // Frees any previous allocation, then allocates `bytes` (uninitialized). ResourceExhausted
  // when the device is out of memory.
  absl::Status Allocate(size_t bytes);
  void Reset();

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace ringserve::cuda

#define RS_CUDA_RETURN_IF_ERROR(expr)                                              \
  do {                                                                             \
    ::absl::Status rs_cuda_status_ = ::ringserve::cuda::CudaStatus((expr), #expr); \
    if (!rs_cuda_status_.ok()) return rs_cuda_status_;                             \
  } while (0)

#define RS_CUBLAS_RETURN_IF_ERROR(expr)                                 \
  do {                                                                  \
    ::absl::Status rs_cublas_status_ =                                  \
        ::ringserve::cuda::CublasStatus(static_cast<int>(expr), #expr); \
    if (!rs_cublas_status_.ok()) return rs_cublas_status_;              \
  } while (0)
