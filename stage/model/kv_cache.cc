#include "stage/model/kv_cache.h"

namespace ringserve {

PagedKvCache::PagedKvCache(const Options& options) : options_(options) {
  const size_t values = static_cast<size_t>(options.num_blocks * block_values());
  if (options.dtype == KvCacheDtype::kFp8E4m3) {
    codes_.assign(values, 0);
  } else {
    data_.assign(values, 0.0f);
  }
}

int64_t PagedKvCache::block_values() const {
  return static_cast<int64_t>(options_.num_layers) * 2 * options_.block_size *
         options_.num_kv_heads * options_.head_dim;
}

cpu::KvLayerView PagedKvCache::Layer(int layer) {
  const int64_t plane =
      static_cast<int64_t>(options_.block_size) * options_.num_kv_heads * options_.head_dim;
  cpu::KvLayerView view{.block_stride = block_values(),
                        .block_size = options_.block_size,
                        .num_kv_heads = options_.num_kv_heads,
                        .head_dim = options_.head_dim};
  const int64_t k_offset = static_cast<int64_t>(layer) * 2 * plane;
  if (options_.dtype == KvCacheDtype::kFp8E4m3) {
    view.k8 = codes_.data() + k_offset;
    view.v8 = view.k8 + plane;
    if (!options_.k_scales.empty()) view.k_scale = options_.k_scales[layer];
    if (!options_.v_scales.empty()) view.v_scale = options_.v_scales[layer];
  } else {
    view.k = data_.data() + k_offset;
    view.v = view.k + plane;
  }
  return view;
}

}  // namespace ringserve
