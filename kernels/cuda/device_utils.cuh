// Device-side helpers shared by the .cu files (not for host code).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace ringserve::cuda {

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
// `scratch` holds at least 32 floats; the call contains __syncthreads().
__device__ __forceinline__ float BlockSum(float v, float* scratch) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  v = WarpSum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int num_warps = blockDim.x >> 5;
  v = lane < num_warps ? scratch[lane] : 0.0f;
  return WarpSum(v);
}

// 4 bf16 packed in 8 bytes -> 4 floats.
__device__ __forceinline__ void Unpack4(const uint2& packed, float* out) {
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&packed);
  const float2 a = __bfloat1622float2(pairs[0]);
  const float2 b = __bfloat1622float2(pairs[1]);
  out[0] = a.x;
  out[1] = a.y;
  out[2] = b.x;
  out[3] = b.y;
}

// RMSNorm pieces shared by the norm kernel (elementwise.cu) and the GEMVs that normalize their
// input (gemv.cu), so both round alike: the squares of 4 residual values, and
// bf16(x * inv * weight) of 4 values with their 4 bf16 weights packed in 8 bytes.
__device__ __forceinline__ float SumSquares4(const float4& x) {
  return x.x * x.x + x.y * x.y + x.z * x.z + x.w * x.w;
}
__device__ __forceinline__ uint2 NormScalePack4(const float4& x, float inv, const uint2& weight) {
  float w[4];
  Unpack4(weight, w);
  uint2 packed;
  __nv_bfloat162* pairs = reinterpret_cast<__nv_bfloat162*>(&packed);
  pairs[0] = __floats2bfloat162_rn(x.x * inv * w[0], x.y * inv * w[1]);
  pairs[1] = __floats2bfloat162_rn(x.z * inv * w[2], x.w * inv * w[3]);
  return packed;
}

// 8 bf16 packed in 16 bytes <-> 8 floats.
__device__ __forceinline__ void Unpack8(const uint4& packed, float* out) {
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&packed);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 f = __bfloat1622float2(pairs[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

__device__ __forceinline__ uint4 Pack8(const float* in) {
  uint4 packed;
  __nv_bfloat162* pairs = reinterpret_cast<__nv_bfloat162*>(&packed);
#pragma unroll
  for (int i = 0; i < 4; ++i) pairs[i] = __floats2bfloat162_rn(in[2 * i], in[2 * i + 1]);
  return packed;
}

__device__ __forceinline__ uint4 LoadStreaming(const void* ptr) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(ptr));
  return v;
}

// Shared-memory address of a generic pointer into shared memory (for PTX operands).
__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy in the background; valid == false writes 16 zero bytes.
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, bool valid) {
  const int src_size = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SmemAddr(dst)), "l"(src),
               "r"(src_size));
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Two floats -> bf16x2 in one 32-bit register (lo in the low half), as mma fragments hold them.
__device__ __forceinline__ uint32_t PackBF16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

}  // namespace ringserve::cuda
