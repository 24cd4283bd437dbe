// Device-side reads and writes of the paged KV cache's elements (rope.h's KvCacheLayer), for
// both element types: bf16 (k, v) and float8_e4m3fn codes (k8, v8; value = code * k_scale or
// code * v_scale, ring/kv_cache_dtype.h). The attention kernels are templated on the element
// type KvT (bf16 or uint8_t for e4m3) and read through these helpers; the writers (QKV prepare,
// the GEMV that folds it in, the decode kernel's newest key) store through StoreKvPair.
//
// e4m3 -> bf16 is exact (3 mantissa bits, exponents 2^-9..2^8); the scales are applied outside
// the tiles (folded into the softmax scale for K, into the output for V), so an fp8 tile is
// exactly the stored codes and the MMAs see the same values as the CPU reference's codes.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/rope.h"

namespace ringserve::cuda {

// Whether KvT is the e4m3 element type.
template <typename KvT>
inline constexpr bool kKvFp8 = sizeof(KvT) == 1;

// The layer's keys / values as KvT.
template <typename KvT>
__device__ __forceinline__ const KvT* KvKeys(const KvCacheLayer& c) {
  if constexpr (kKvFp8<KvT>) {
    return c.k8;
  } else {
    return c.k;
  }
}
template <typename KvT>
__device__ __forceinline__ const KvT* KvValues(const KvCacheLayer& c) {
  if constexpr (kKvFp8<KvT>) {
    return c.v8;
  } else {
    return c.v;
  }
}

// Two e4m3 codes (low byte first) -> two bf16 packed in a word, exactly.
__device__ __forceinline__ uint32_t E4m3x2ToBf16x2(uint16_t codes) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(codes), __NV_E4M3);
  const float2 f = __half22float2(__half2(h));
  const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
  return *reinterpret_cast<const uint32_t*>(&b);
}

// 16 e4m3 codes -> 16 bf16 (two 16-byte chunks, lo = codes 0..7, hi = codes 8..15).
__device__ __forceinline__ void E4m3x16ToBf16(const uint4& codes, uint4& lo, uint4& hi) {
  const uint32_t w[4] = {codes.x, codes.y, codes.z, codes.w};
  uint32_t out[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    out[2 * i] = E4m3x2ToBf16x2(static_cast<uint16_t>(w[i] & 0xffffu));
    out[2 * i + 1] = E4m3x2ToBf16x2(static_cast<uint16_t>(w[i] >> 16));
  }
  lo = make_uint4(out[0], out[1], out[2], out[3]);
  hi = make_uint4(out[4], out[5], out[6], out[7]);
}

// Eight consecutive cached values, as one load (16 bytes of bf16 or 8 bytes of e4m3) and as
// floats: the CUDA-core decode kernel's unit.
template <typename KvT>
struct KvRow8;

template <>
struct KvRow8<bf16> {
  using Raw = uint4;
  __device__ __forceinline__ static Raw Zero() { return make_uint4(0, 0, 0, 0); }
  __device__ __forceinline__ static Raw Load(const bf16* p) { return LoadStreaming(p); }
  __device__ __forceinline__ static void Unpack(const Raw& r, float* out) { Unpack8(r, out); }
};

template <>
struct KvRow8<uint8_t> {
  using Raw = uint2;
  __device__ __forceinline__ static Raw Zero() { return make_uint2(0, 0); }
  __device__ __forceinline__ static Raw Load(const uint8_t* p) {
    uint2 r;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];"
                 : "=r"(r.x), "=r"(r.y)
                 : "l"(p));
    return r;
  }
  __device__ __forceinline__ static void Unpack(const Raw& r, float* out) {
    const uint32_t w[2] = {r.x, r.y};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const __half2_raw raw = __nv_cvt_fp8x2_to_halfraw2(
            static_cast<__nv_fp8x2_storage_t>((w[i] >> (16 * h)) & 0xffffu), __NV_E4M3);
        const float2 f = __half22float2(__half2(raw));
        out[4 * i + 2 * h] = f.x;
        out[4 * i + 2 * h + 1] = f.y;
      }
    }
  }
};

// Expands an fp8 tile staged in shared memory (rows of 128 codes, 128 bytes each, row after row
// from `staged`) into bf16 chunks in place: every thread of the `threads` taking part first
// reads its kChunks 16-byte chunks of codes (chunk i = tid + threads * u: row i / 8, codes
// 16 (i % 8) ..), then — after `barrier()`, since the bf16 tile overlaps the staged codes —
// writes them as bf16 chunks 2 (i % 8) and 2 (i % 8) + 1 of the row to dst_chunk(row, chunk).
// The caller synchronizes before the tile is read.
template <int kChunks, typename DstChunk, typename Barrier>
__device__ __forceinline__ void ExpandFp8Tile(const unsigned char* staged, int tid, int threads,
                                              DstChunk dst_chunk, Barrier barrier) {
  uint4 codes[kChunks];
#pragma unroll
  for (int u = 0; u < kChunks; ++u) {
    codes[u] = reinterpret_cast<const uint4*>(staged)[tid + threads * u];
  }
  barrier();
#pragma unroll
  for (int u = 0; u < kChunks; ++u) {
    const int i = tid + threads * u;
    uint4 lo, hi;
    E4m3x16ToBf16(codes[u], lo, hi);
    *reinterpret_cast<uint4*>(dst_chunk(i >> 3, 2 * (i & 7))) = lo;
    *reinterpret_cast<uint4*>(dst_chunk(i >> 3, 2 * (i & 7) + 1)) = hi;
  }
}

// Stores x1 and x2 at elements j and j2 of a K (is_v false) or V cache row starting at element
// `offset` of the layer: bf16, or e4m3 of x / scale rounded to nearest even and saturated (as
// the CPU reference's FloatToFp8E4M3).
__device__ __forceinline__ void StoreKvPair(const KvCacheLayer& c, bool is_v, int64_t offset, int j,
                                            int j2, float x1, float x2) {
  if (c.k8 != nullptr) {
    const float scale = is_v ? c.v_scale : c.k_scale;
    uint8_t* row = (is_v ? c.v8 : c.k8) + offset;
    row[j] = __nv_cvt_float_to_fp8(__fdiv_rn(x1, scale), __NV_SATFINITE, __NV_E4M3);
    row[j2] = __nv_cvt_float_to_fp8(__fdiv_rn(x2, scale), __NV_SATFINITE, __NV_E4M3);
    return;
  }
  bf16* row = (is_v ? c.v : c.k) + offset;
  row[j] = __float2bfloat16(x1);
  row[j2] = __float2bfloat16(x2);
}

}  // namespace ringserve::cuda
