#include "common/status_macros.h"
#include "kernels/cuda/cold_cache_timer.h"

namespace ringserve::cuda {
namespace {

// Reads every 16 bytes of `buf` through L2 (not L1), so L2 ends up holding clean lines of the
// scratch buffer only. `sink` is written only if the XOR of everything is an unlikely value,
// which keeps the loads alive.
__global__ void ReadThroughKernel(const uint4* __restrict__ buf, int64_t n, uint32_t* sink) {
  uint32_t x = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcg(buf + i);
    x ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (x == 0x9e3779b9u) *sink = x;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ColdCacheTimer>> ColdCacheTimer::Create() {
  int device = 0, l2_bytes = 0, sms = 0;
  RS_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  RS_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device));
  RS_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  std::unique_ptr<ColdCacheTimer> timer(new ColdCacheTimer());
  timer->grid_ = 4 * sms;
  // 2 x L2 of scratch plus the sink word; zeroed once so no later pass writes anything.
  const size_t bytes = 2 * static_cast<size_t>(std::max(l2_bytes, 1 << 20));
  RS_RETURN_IF_ERROR(timer->scratch_.Allocate(bytes + 16));
  RS_CUDA_RETURN_IF_ERROR(cudaMemset(timer->scratch_.get(), 0, bytes + 16));
  RS_CUDA_RETURN_IF_ERROR(cudaEventCreate(&timer->start_));
  RS_CUDA_RETURN_IF_ERROR(cudaEventCreate(&timer->stop_));
  return timer;
}

ColdCacheTimer::~ColdCacheTimer() {
  if (start_) cudaEventDestroy(start_);
  if (stop_) cudaEventDestroy(stop_);
}

void ColdCacheTimer::Evict(cudaStream_t stream) {
  const int64_t n = static_cast<int64_t>(scratch_.bytes() - 16) / 16;
  ReadThroughKernel<<<grid_, 256, 0, stream>>>(
      scratch_.as<uint4>(), n, reinterpret_cast<uint32_t*>(scratch_.as<uint4>() + n));
}

}  // namespace ringserve::cuda
