// Device-side decoding of the quantized layout of quant_gemv.h, shared by the kernels that read
// it (quant_gemv.cu, moe_quant.cu): one 16-byte chunk of codes to floats, a row's group scale and
// zero point, and the dot product of 8 decoded values with 8 bf16 activations. Not for host code.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/quant_gemv.h"

namespace ringserve::cuda {
namespace quant_decode {

template <QuantFormat F>
constexpr int kChunk = (F == QuantFormat::kInt4 || F == QuantFormat::kFp4) ? 32 : 16;
template <QuantFormat F>
constexpr bool kInteger = F == QuantFormat::kInt4 || F == QuantFormat::kInt8;
// The fp16 forms of e4m3 and e2m1 below are the value times 2^-8 and 2^-14.
template <QuantFormat F>
constexpr float kPostScale = F == QuantFormat::kFp8 ? 256.0f
                                                    : (F == QuantFormat::kFp4 ? 16384.0f : 1.0f);

__device__ __forceinline__ float2 HalfPair(uint32_t bits) {
  __half2 h;
  memcpy(&h, &bits, 4);
  return __half22float2(h);
}

__device__ __forceinline__ float2 IntPair(uint32_t bits, __half2 bias) {
  __half2 h;
  memcpy(&h, &bits, 4);
  return __half22float2(__hsub2(h, bias));
}

// The chunk's 16 bytes as values in column order, before the group scale (integers minus zero).
template <QuantFormat F>
__device__ __forceinline__ void Decode(const uint4& q, float zero, float* v) {
  const uint32_t words[4] = {q.x, q.y, q.z, q.w};
  if constexpr (F == QuantFormat::kInt4) {
    const __half2 bias = __float2half2_rn(1024.0f + zero);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {  // nibbles i and i + 4 of the word
        const float2 f = IntPair(((words[w] >> (4 * i)) & 0x000f000fu) | 0x64006400u, bias);
        v[8 * w + i] = f.x;
        v[8 * w + i + 4] = f.y;
      }
    }
  } else if constexpr (F == QuantFormat::kInt8) {
    const __half2 bias = __float2half2_rn(1024.0f + zero);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {  // bytes i and i + 2
        const float2 f = IntPair(((words[w] >> (8 * i)) & 0x00ff00ffu) | 0x64006400u, bias);
        v[4 * w + i] = f.x;
        v[4 * w + i + 2] = f.y;
      }
    }
  } else if constexpr (F == QuantFormat::kFp8) {
#pragma unroll
    for (int w = 0; w < 4; ++w) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const uint32_t b = words[w] >> (8 * i);
        const float2 f = HalfPair(((b & 0x007f007fu) << 7) | ((b & 0x00800080u) << 8));
        v[4 * w + i] = f.x;
        v[4 * w + i + 2] = f.y;
      }
    }
  } else {
#pragma unroll
    for (int w = 0; w < 4; ++w) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t b = words[w] >> (4 * i);
        const float2 f = HalfPair(((b & 0x00070007u) << 9) | ((b & 0x00080008u) << 12));
        v[8 * w + i] = f.x;
        v[8 * w + i + 4] = f.y;
      }
    }
  }
}

template <QuantFormat F>
__device__ __forceinline__ void GroupScale(const QuantMatrixView& w, int row, int col0,
                                           float* scale, float* zero) {
  const int groups = (w.cols + w.group_cols - 1) / w.group_cols;
  const int64_t at = static_cast<int64_t>(row) * groups + col0 / w.group_cols;
  if constexpr (kInteger<F>) {
    const float2 sz = reinterpret_cast<const float2*>(w.scales)[at];
    *scale = sz.x;
    *zero = sz.y;
  } else {
    *scale = w.scales[at] * kPostScale<F>;
    *zero = 0;
  }
}

__device__ __forceinline__ float Dot8(const float* v, uint4 xs) {
  const uint32_t u[4] = {xs.x, xs.y, xs.z, xs.w};
  float s = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    s = fmaf(v[2 * i], __uint_as_float(u[i] << 16), s);
    s = fmaf(v[2 * i + 1], __uint_as_float(u[i] & 0xffff0000u), s);
  }
  return s;
}

}  // namespace quant_decode
}  // namespace ringserve::cuda
