#include <cfloat>
#include <climits>

#include "kernels/cuda/sampling.h"

namespace ringserve::cuda {
namespace {

constexpr int kThreads = 1024;

__device__ __forceinline__ void Better(float& best, int& best_id, float v, int id) {
  if (v > best || (v == best && id < best_id)) {
    best = v;
    best_id = id;
  }
}

__global__ void __launch_bounds__(kThreads)
    ArgmaxKernel(const float* __restrict__ logits, int vocab, int32_t* __restrict__ tokens) {
  __shared__ float vals[32];
  __shared__ int ids[32];
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  float best = -INFINITY;
  int best_id = INT_MAX;
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    float v = row[i];
    if (isnan(v)) v = -INFINITY;
    Better(best, best_id, v, i);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, off);
    const int oi = __shfl_xor_sync(0xffffffffu, best_id, off);
    Better(best, best_id, ov, oi);
  }
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  if (lane == 0) {
    vals[warp] = best;
    ids[warp] = best_id;
  }
  __syncthreads();
  if (warp == 0) {
    best = vals[lane];
    best_id = ids[lane];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, best, off);
      const int oi = __shfl_xor_sync(0xffffffffu, best_id, off);
      Better(best, best_id, ov, oi);
    }
    if (lane == 0) tokens[blockIdx.x] = best_id == INT_MAX ? 0 : best_id;
  }
}

}  // namespace

absl::Status LaunchArgmax(const float* logits, int rows, int vocab, int32_t* tokens,
                          cudaStream_t stream) {
  if (rows < 0 || vocab <= 0) return absl::InvalidArgumentError("LaunchArgmax: bad shape");
  if (rows == 0) return absl::OkStatus();
  ArgmaxKernel<<<rows, kThreads, 0, stream>>>(logits, vocab, tokens);
  return LaunchStatus("ArgmaxKernel");
}

}  // namespace ringserve::cuda
