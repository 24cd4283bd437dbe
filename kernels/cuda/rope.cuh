// Device-side pieces of the attention input stage shared by QkvPrepareKernel (rope.cu) and the
// GEMV that folds it in (gemv.cu): the rotation of one "rotate half" pair and where a token's
// head goes (q_out, or the K/V cache in its element type) — so both store the same values in
// the same places.
#pragma once

#include <cstdint>

#include "kernels/cuda/kv_cache_access.cuh"
#include "kernels/cuda/paged_cache.cuh"
#include "kernels/cuda/rope.h"

namespace ringserve::cuda {

// (x1, x2) = (x1 cos - x2 sin, x2 cos + x1 sin) at angle position * inv_freq, fp32. Every
// product rounded on its own (__fmul_rn is never contracted into an FMA): left to the compiler,
// which product fuses with the add depends on the kernel it is inlined into, and the decode
// attention's Q tile then differed from the QKV prepare's q in the last bit (seen on an H200).
__device__ __forceinline__ void RotatePair(float& x1, float& x2, int position, float inv_freq) {
  float s, c;
  sincosf(__fmul_rn(static_cast<float>(position), inv_freq), &s, &c);
  const float r1 = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
  const float r2 = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
  x1 = r1;
  x2 = r2;
}

// Stores (x1, x2) at elements j and j2 of head `head` (q heads, then k heads, then v heads) of
// token t: its q_out row ([tokens, num_heads, d] bf16) or its K/V cache row at slots[t] (in the
// cache's element type, kv_cache_access.cuh); nothing for K/V of a negative slot.
__device__ __forceinline__ void StoreHeadPair(bf16* q_out, int num_heads, const KvCacheLayer& cache,
                                              const int32_t* slots, int t, int head, int j, int j2,
                                              float x1, float x2) {
  const int d = cache.head_dim;
  if (head < num_heads) {
    bf16* row = q_out + (static_cast<int64_t>(t) * num_heads + head) * d;
    row[j] = __float2bfloat16(x1);
    row[j2] = __float2bfloat16(x2);
    return;
  }
  const int slot = slots[t];
  if (slot < 0) return;
  const bool is_v = head >= num_heads + cache.num_kv_heads;
  const int kvh = head - num_heads - (is_v ? cache.num_kv_heads : 0);
  const int block = slot / cache.block_size;
  StoreKvPair(cache, is_v, CacheRowOffset(cache, block, slot - block * cache.block_size, kvh, d), j,
              j2, x1, x2);
}

// Pair (j, j + d / 2) of head `head` of token t, (x1, x2) = the projection's bf16 values: bias
// added and rotated unless a v head — QkvPrepareKernel's values without q/k norms.
__device__ __forceinline__ void BiasAndRotatePair(const QkvStore& o, int t, int head, int j,
                                                  float& x1, float& x2) {
  const int half = o.cache.head_dim / 2, c = head * o.cache.head_dim + j;
  if (o.bias != nullptr) {
    x1 += __bfloat162float(o.bias[c]);
    x2 += __bfloat162float(o.bias[c + half]);
  }
  if (head < o.num_heads + o.cache.num_kv_heads) RotatePair(x1, x2, o.positions[t], o.inv_freq[j]);
}

// BiasAndRotatePair, then stored to the pair's q_out or cache row (none for a negative slot).
__device__ __forceinline__ void StoreQkvPair(const QkvStore& o, int t, int head, int j, float x1,
                                             float x2) {
  const int half = o.cache.head_dim / 2;
  BiasAndRotatePair(o, t, head, j, x1, x2);
  StoreHeadPair(o.q_out, o.num_heads, o.cache, o.slots, t, head, j, j + half, x1, x2);
}

}  // namespace ringserve::cuda
