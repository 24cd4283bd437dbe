#include "kernels/cuda/cuda_utils.h"

#include <cublasLt.h>

#include "absl/strings/str_cat.h"

namespace ringserve::cuda {

absl::Status CudaStatus(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  std::string message = absl::StrCat("CUDA error in ", what, ": ", cudaGetErrorName(error), " (",
                                     cudaGetErrorString(error), ")");
  if (error == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

absl::Status CublasStatus(int status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(
      "cuBLAS error in ", what, ": ", cublasLtGetStatusString(static_cast<cublasStatus_t>(status)),
      " (", status, ")"));
}

absl::Status LaunchStatus(const char* kernel) { return CudaStatus(cudaGetLastError(), kernel); }

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return count;
}

absl::Status DeviceBuffer::Allocate(size_t bytes) {
  Reset();
  if (bytes == 0) return absl::OkStatus();
  void* ptr = nullptr;
  RS_CUDA_RETURN_IF_ERROR(cudaMalloc(&ptr, bytes));
  ptr_ = ptr;
  bytes_ = bytes;
  return absl::OkStatus();
}

void DeviceBuffer::Reset() {
  if (ptr_ != nullptr) cudaFree(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
}

}  // namespace ringserve::cuda
