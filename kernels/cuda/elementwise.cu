#include <cuda_fp16.h>

#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/elementwise.h"

namespace ringserve::cuda {
namespace {

constexpr int kNormThreads = 256;

__global__ void __launch_bounds__(kNormThreads)
    AddRmsNormKernel(float* __restrict__ residual, const bf16* __restrict__ delta,
                     const bf16* __restrict__ bias, const bf16* __restrict__ weight,
                     bf16* __restrict__ out, int dim, float eps) {
  WaitForPreviousKernel();
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  float* res = residual + row * dim;
  float sum_sq = 0.0f;
  if (delta != nullptr) {
    const bf16* d = delta + row * dim;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
      float v = res[i] + __bfloat162float(d[i]);
      if (bias != nullptr) v += __bfloat162float(bias[i]);
      res[i] = v;
      sum_sq += v * v;
    }
  } else {
    for (int i = threadIdx.x; i < dim; i += blockDim.x) sum_sq += res[i] * res[i];
  }
  if (out == nullptr) return;
  sum_sq = BlockSum(sum_sq, scratch);
  const float inv = rsqrtf(sum_sq / dim + eps);
  bf16* o = out + row * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    o[i] = __float2bfloat16(res[i] * inv * __bfloat162float(weight[i]));
  }
}

// Vectorized variant for dim % 4 == 0 and dim / 4 <= kNormCache * kNormThreads: each thread
// keeps its (up to kNormCache) float4 pieces of the row in registers between the add and the
// scale, loads 16 bytes of fp32 / 8 bytes of bf16 at a time.
constexpr int kNormCache = 8;

__global__ void __launch_bounds__(kNormThreads)
    AddRmsNormKernel4(float* __restrict__ residual, const bf16* __restrict__ delta,
                      const bf16* __restrict__ bias, const bf16* __restrict__ weight,
                      bf16* __restrict__ out, int dim, float eps) {
  WaitForPreviousKernel();
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  const int vecs = dim / 4;
  float4* res = reinterpret_cast<float4*>(residual + row * dim);
  const uint2* dl = delta != nullptr ? reinterpret_cast<const uint2*>(delta + row * dim) : nullptr;
  const uint2* bs = reinterpret_cast<const uint2*>(bias);
  float4 x[kNormCache];
  float sum_sq = 0.0f;
#pragma unroll
  for (int k = 0; k < kNormCache; ++k) {
    const int i = threadIdx.x + k * kNormThreads;
    if (i < vecs) {
      x[k] = res[i];
      if (dl != nullptr) {
        float d[4];
        Unpack4(dl[i], d);
        if (bs != nullptr) {
          float b[4];
          Unpack4(bs[i], b);
#pragma unroll
          for (int j = 0; j < 4; ++j) d[j] += b[j];
        }
        x[k].x += d[0];
        x[k].y += d[1];
        x[k].z += d[2];
        x[k].w += d[3];
        res[i] = x[k];
      }
      sum_sq += SumSquares4(x[k]);
    }
  }
  if (out == nullptr) return;
  sum_sq = BlockSum(sum_sq, scratch);
  const float inv = rsqrtf(sum_sq / dim + eps);
  const uint2* wt = reinterpret_cast<const uint2*>(weight);
  uint2* o = reinterpret_cast<uint2*>(out + row * dim);
#pragma unroll
  for (int k = 0; k < kNormCache; ++k) {
    const int i = threadIdx.x + k * kNormThreads;
    if (i < vecs) o[i] = NormScalePack4(x[k], inv, wt[i]);
  }
}

__global__ void SiluMulKernel(const bf16* __restrict__ gate_up, bf16* __restrict__ out,
                              int64_t rows, int inter) {
  WaitForPreviousKernel();
  const int64_t total = rows * inter;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / inter;
    const int64_t c = i - r * inter;
    const float g = __bfloat162float(gate_up[r * 2 * inter + c]);
    const float u = __bfloat162float(gate_up[r * 2 * inter + inter + c]);
    out[i] = __float2bfloat16(g / (1.0f + __expf(-g)) * u);
  }
}

// Vectorized variant: 8 elements per thread (inter % 8 == 0).
__global__ void SiluMulKernel8(const bf16* __restrict__ gate_up, bf16* __restrict__ out,
                               int64_t rows, int inter) {
  WaitForPreviousKernel();
  const int vecs = inter / 8;
  const int64_t total = rows * vecs;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / vecs;
    const int64_t c = i - r * vecs;
    const uint4* row = reinterpret_cast<const uint4*>(gate_up + r * 2 * inter);
    float g[8], u[8], o[8];
    Unpack8(row[c], g);
    Unpack8(row[vecs + c], u);
#pragma unroll
    for (int j = 0; j < 8; ++j) o[j] = g[j] / (1.0f + __expf(-g[j])) * u[j];
    reinterpret_cast<uint4*>(out + r * inter)[c] = Pack8(o);
  }
}

__global__ void EmbeddingKernel(const bf16* __restrict__ table, const int32_t* __restrict__ ids,
                                float* __restrict__ out, int hidden) {
  WaitForPreviousKernel();
  const int64_t t = blockIdx.x;
  const bf16* row = table + static_cast<int64_t>(ids[t]) * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
    out[t * hidden + i] = __bfloat162float(row[i]);
  }
}

__global__ void F32ToBF16Kernel(const float* __restrict__ src, bf16* __restrict__ dst, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = __float2bfloat16(src[i]);
  }
}

__global__ void BF16ToF32Kernel(const bf16* __restrict__ src, float* __restrict__ dst, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = __bfloat162float(src[i]);
  }
}

__global__ void F16ToBF16Kernel(const __half* __restrict__ src, bf16* __restrict__ dst, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = __float2bfloat16(__half2float(src[i]));
  }
}

__global__ void GatherRowsKernel(const bf16* __restrict__ src, const int32_t* __restrict__ rows,
                                 bf16* __restrict__ dst, int dim) {
  WaitForPreviousKernel();
  const bf16* from = src + static_cast<int64_t>(rows[blockIdx.x]) * dim;
  bf16* to = dst + static_cast<int64_t>(blockIdx.x) * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) to[i] = from[i];
}

__device__ __forceinline__ uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__global__ void FillRandomKernel(bf16* __restrict__ dst, int64_t n, uint64_t seed, float center,
                                 float scale) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t h = SplitMix64(seed ^ SplitMix64(static_cast<uint64_t>(i)));
    const float u = static_cast<float>(h >> 40) * (2.0f / 16777216.0f) - 1.0f;
    dst[i] = __float2bfloat16(center + scale * u);
  }
}

unsigned GridFor(int64_t n, int threads) {
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks > 65536) blocks = 65536;
  if (blocks < 1) blocks = 1;
  return static_cast<unsigned>(blocks);
}

}  // namespace

absl::Status LaunchAddRmsNorm(float* residual, const bf16* delta, const bf16* bias,
                              const bf16* weight, bf16* out, int64_t rows, int dim, float eps,
                              LaunchStream stream) {
  if (rows < 0 || dim <= 0 || rows > 0x7fffffff) {
    return absl::InvalidArgumentError("LaunchAddRmsNorm: bad shape");
  }
  if (rows == 0) return absl::OkStatus();
  const auto aligned = [](const void* p, uintptr_t a) {
    return (reinterpret_cast<uintptr_t>(p) & (a - 1)) == 0;
  };
  if (dim % 4 == 0 && dim / 4 <= kNormCache * kNormThreads && aligned(residual, 16) &&
      aligned(delta, 8) && aligned(bias, 8) && aligned(weight, 8) && aligned(out, 8)) {
    LaunchDependent(AddRmsNormKernel4, static_cast<unsigned>(rows), kNormThreads, 0, stream,
                    residual, delta, bias, weight, out, dim, eps);
  } else {
    LaunchDependent(AddRmsNormKernel, static_cast<unsigned>(rows), kNormThreads, 0, stream,
                    residual, delta, bias, weight, out, dim, eps);
  }
  return LaunchStatus("AddRmsNormKernel");
}

absl::Status LaunchSiluMul(const bf16* gate_up, bf16* out, int64_t rows, int inter,
                           LaunchStream stream) {
  if (rows < 0 || inter <= 0) return absl::InvalidArgumentError("LaunchSiluMul: bad shape");
  if (rows == 0) return absl::OkStatus();
  if (inter % 8 == 0) {
    LaunchDependent(SiluMulKernel8, GridFor(rows * inter / 8, 256), 256, 0, stream, gate_up, out,
                    rows, inter);
  } else {
    LaunchDependent(SiluMulKernel, GridFor(rows * inter, 256), 256, 0, stream, gate_up, out, rows,
                    inter);
  }
  return LaunchStatus("SiluMulKernel");
}

absl::Status LaunchEmbedding(const bf16* table, const int32_t* ids, float* out, int64_t n,
                             int hidden, LaunchStream stream) {
  if (n < 0 || hidden <= 0 || n > 0x7fffffff) {
    return absl::InvalidArgumentError("LaunchEmbedding: bad shape");
  }
  if (n == 0) return absl::OkStatus();
  LaunchDependent(EmbeddingKernel, static_cast<unsigned>(n), 256, 0, stream, table, ids, out,
                  hidden);
  return LaunchStatus("EmbeddingKernel");
}

absl::Status LaunchF32ToBF16(const float* src, bf16* dst, int64_t n, LaunchStream stream) {
  if (n <= 0) return absl::OkStatus();
  F32ToBF16Kernel<<<GridFor(n, 256), 256, 0, stream>>>(src, dst, n);
  return LaunchStatus("F32ToBF16Kernel");
}

absl::Status LaunchBF16ToF32(const bf16* src, float* dst, int64_t n, LaunchStream stream) {
  if (n <= 0) return absl::OkStatus();
  BF16ToF32Kernel<<<GridFor(n, 256), 256, 0, stream>>>(src, dst, n);
  return LaunchStatus("BF16ToF32Kernel");
}

absl::Status LaunchGatherRows(const bf16* src, const int32_t* rows, bf16* dst, int num_rows,
                              int dim, LaunchStream stream) {
  if (num_rows < 0 || dim <= 0) return absl::InvalidArgumentError("LaunchGatherRows: bad shape");
  if (num_rows == 0) return absl::OkStatus();
  LaunchDependent(GatherRowsKernel, num_rows, 256, 0, stream, src, rows, dst, dim);
  return LaunchStatus("GatherRowsKernel");
}

absl::Status LaunchFillRandom(bf16* dst, int64_t n, uint64_t seed, float center, float scale,
                              LaunchStream stream) {
  if (n <= 0) return absl::OkStatus();
  FillRandomKernel<<<GridFor(n, 256), 256, 0, stream>>>(dst, n, seed, center, scale);
  return LaunchStatus("FillRandomKernel");
}

absl::Status LaunchF16ToBF16(const uint16_t* src, bf16* dst, int64_t n, LaunchStream stream) {
  if (n <= 0) return absl::OkStatus();
  F16ToBF16Kernel<<<GridFor(n, 256), 256, 0, stream>>>(reinterpret_cast<const __half*>(src), dst,
                                                       n);
  return LaunchStatus("F16ToBF16Kernel");
}

}  // namespace ringserve::cuda
