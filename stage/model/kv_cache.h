// The paged KV cache of one CPU model slice: a pool of blocks, each holding K and V of
// `block_size` consecutive positions for every layer of the slice. Block ids are assigned by the
// coordinator (see model_slice.h); this class only stores. Layout of block b, fp32, host:
//   [num_layers][2 (K, V)][block_size][num_kv_heads][head_dim]
// Not thread-safe (owned by one ModelSlice).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/cpu/ops.h"

namespace ringserve {

class PagedKvCache {
 public:
  struct Options {
    int num_layers = 0;  // layers of the slice (local indices 0..num_layers-1)
    int num_blocks = 0;
    int block_size = 0;  // positions per block
    int num_kv_heads = 0;
    int head_dim = 0;
  };

  // Allocates num_blocks * block_floats() zeroed floats. Options must be positive.
  explicit PagedKvCache(const Options& options);

  // The K/V view of local layer `layer` (0 <= layer < num_layers) across all blocks.
  cpu::KvLayerView Layer(int layer);

  const Options& options() const { return options_; }
  int num_blocks() const { return options_.num_blocks; }
  int block_size() const { return options_.block_size; }
  // Floats per block (all layers, K and V).
  int64_t block_floats() const;
  int64_t bytes() const { return static_cast<int64_t>(data_.size() * sizeof(float)); }
  // The whole pool, block after block (for tests and debugging).
  std::span<const float> data() const { return data_; }

 private:
  Options options_;
  std::vector<float> data_;
};

}  // namespace ringserve
