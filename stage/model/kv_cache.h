// The paged KV cache of one CPU model slice: a pool of blocks, each holding K and V of
// `block_size` consecutive positions for every layer of the slice. Block ids are assigned by the
// coordinator (see model_slice.h); this class only stores. Layout of block b, host:
//   [num_layers][2 (K, V)][block_size][num_kv_heads][head_dim]
// in fp32 (dtype auto), or in float8_e4m3fn codes (dtype fp8_e4m3: one byte per value, scaled by
// the layer's k_scales / v_scales entry; ops.h's KvLayerView says how they are written and read).
// Not thread-safe (owned by one ModelSlice).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/cpu/ops.h"
#include "ring/kv_cache_dtype.h"

namespace ringserve {

class PagedKvCache {
 public:
  struct Options {
    int num_layers = 0;  // layers of the slice (local indices 0..num_layers-1)
    int num_blocks = 0;
    int block_size = 0;  // positions per block
    int num_kv_heads = 0;
    int head_dim = 0;
    KvCacheDtype dtype = KvCacheDtype::kAuto;
    // fp8_e4m3: per local layer, the K and V scales; empty = 1.0 for every layer.
    std::vector<float> k_scales = {};
    std::vector<float> v_scales = {};
  };

  // Allocates num_blocks * block_values() zeroed values. Options must be positive; scales, when
  // given, one per layer.
  explicit PagedKvCache(const Options& options);

  // The K/V view of local layer `layer` (0 <= layer < num_layers) across all blocks.
  cpu::KvLayerView Layer(int layer);

  const Options& options() const { return options_; }
  int num_blocks() const { return options_.num_blocks; }
  int block_size() const { return options_.block_size; }
  // Values per block (all layers, K and V).
  int64_t block_values() const;
  // Bytes of one cached value (4 for fp32, 1 for fp8_e4m3).
  int64_t element_bytes() const { return KvCacheElementBytes(options_.dtype, sizeof(float)); }
  int64_t bytes() const { return options_.num_blocks * block_values() * element_bytes(); }
  // The whole pool, block after block (for tests and debugging): fp32 values (empty for fp8),
  // or e4m3 codes (empty for fp32).
  std::span<const float> data() const { return data_; }
  std::span<const uint8_t> codes() const { return codes_; }

 private:
  Options options_;
  std::vector<float> data_;
  std::vector<uint8_t> codes_;
};

}  // namespace ringserve
