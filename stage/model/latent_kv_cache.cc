#include "stage/model/latent_kv_cache.h"

namespace ringserve {

LatentKvCache::LatentKvCache(const Options& options)
    : options_(options), data_(static_cast<size_t>(options.num_blocks * block_floats()), 0.0f) {}

int64_t LatentKvCache::block_floats() const {
  return static_cast<int64_t>(options_.num_layers) * options_.block_size *
         (options_.latent_dim + options_.rope_dim);
}

LatentKvLayerView LatentKvCache::Layer(int layer) {
  const int64_t plane =
      static_cast<int64_t>(options_.block_size) * (options_.latent_dim + options_.rope_dim);
  return LatentKvLayerView{.data = data_.data() + layer * plane,
                           .block_stride = block_floats(),
                           .block_size = options_.block_size,
                           .latent_dim = options_.latent_dim,
                           .rope_dim = options_.rope_dim};
}

}  // namespace ringserve
