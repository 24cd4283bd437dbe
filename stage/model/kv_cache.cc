#include "stage/model/kv_cache.h"

namespace ringserve {

PagedKvCache::PagedKvCache(const Options& options)
    : options_(options), data_(static_cast<size_t>(options.num_blocks * block_floats()), 0.0f) {}

int64_t PagedKvCache::block_floats() const {
  return static_cast<int64_t>(options_.num_layers) * 2 * options_.block_size *
         options_.num_kv_heads * options_.head_dim;
}

cpu::KvLayerView PagedKvCache::Layer(int layer) {
  const int64_t plane =
      static_cast<int64_t>(options_.block_size) * options_.num_kv_heads * options_.head_dim;
  float* k = data_.data() + static_cast<int64_t>(layer) * 2 * plane;
  return cpu::KvLayerView{.k = k,
                          .v = k + plane,
                          .block_stride = block_floats(),
                          .block_size = options_.block_size,
                          .num_kv_heads = options_.num_kv_heads,
                          .head_dim = options_.head_dim};
}

}  // namespace ringserve
