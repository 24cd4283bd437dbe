// Device-side addressing of the paged KV cache (rope.h's KvCacheLayer: per block
// [num_kv_heads, block_size, head_dim] bf16), shared by the QKV prepare and attention kernels.
#pragma once

#include <cstdint>

#include "kernels/cuda/rope.h"

namespace ringserve::cuda {

// Element offset of position `pos` of cache block `block`, kv head `kvh`, in c.k or c.v, with
// rows of `d` elements (the kernels pass their compile-time head dim where they have one).
__device__ __forceinline__ int64_t CacheRowOffset(const KvCacheLayer& c, int block, int pos,
                                                  int kvh, int d) {
  return ((static_cast<int64_t>(block) * c.num_kv_heads + kvh) * c.block_size + pos) * d;
}

// A sequence's key index -> its cache row through the sequence's block table row; a shift
// instead of a divide when block_size is a power of two. Make one per kernel (not per key).
struct PagedKeys {
  int block_shift;  // log2(block_size), or -1

  __device__ explicit PagedKeys(int block_size) {
    block_shift = (block_size & (block_size - 1)) == 0 ? __ffs(block_size) - 1 : -1;
  }

  __device__ __forceinline__ int64_t Offset(const KvCacheLayer& c, const int32_t* table, int key,
                                            int kvh, int d) const {
    const int blk = block_shift >= 0 ? key >> block_shift : key / c.block_size;
    return CacheRowOffset(c, table[blk], key - blk * c.block_size, kvh, d);
  }
};

}  // namespace ringserve::cuda
