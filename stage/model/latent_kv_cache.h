// The paged KV cache of a CPU slice with multi-head latent attention (DeepSeek-V2/V3): per
// token and layer only the normalized latent [kv_lora_rank] and the rotated rope key
// [qk_rope_head_dim], shared by every head (576 values a layer for DeepSeek-V3 instead of
// 2 * 128 heads * 160). Block ids are assigned by the coordinator, as for PagedKvCache. Layout of
// block b, fp32, host:
//   [num_layers][block_size][latent_dim + rope_dim]   (latent first, then the rope key)
// Not thread-safe (owned by one ModelSlice).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace ringserve {

// One layer's view across all blocks: position slot s of block b starts at
// data + b * block_stride + s * row_dim().
struct LatentKvLayerView {
  float* data = nullptr;
  int64_t block_stride = 0;
  int block_size = 0;
  int latent_dim = 0;
  int rope_dim = 0;

  int row_dim() const { return latent_dim + rope_dim; }
  // The row of `position` in a sequence whose blocks are `block_table` (which must cover it).
  float* Row(std::span<const int32_t> block_table, int32_t position) const {
    return data + block_table[position / block_size] * block_stride +
           static_cast<int64_t>(position % block_size) * row_dim();
  }
};

class LatentKvCache {
 public:
  struct Options {
    int num_layers = 0;  // layers of the slice (local indices 0..num_layers-1)
    int num_blocks = 0;
    int block_size = 0;  // positions per block
    int latent_dim = 0;  // kv_lora_rank
    int rope_dim = 0;    // qk_rope_head_dim
  };

  // Allocates num_blocks * block_floats() zeroed floats. Options must be positive.
  explicit LatentKvCache(const Options& options);

  LatentKvLayerView Layer(int layer);

  const Options& options() const { return options_; }
  // Floats per block (all layers).
  int64_t block_floats() const;
  // Bytes one token takes in one layer (fp32 here; a bf16 cache takes half).
  int64_t bytes_per_token_layer() const {
    return static_cast<int64_t>(options_.latent_dim + options_.rope_dim) * sizeof(float);
  }
  int64_t bytes() const { return static_cast<int64_t>(data_.size() * sizeof(float)); }
  std::span<const float> data() const { return data_; }

 private:
  Options options_;
  std::vector<float> data_;
};

}  // namespace ringserve
