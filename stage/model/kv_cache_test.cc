#include "stage/model/kv_cache.h"

#include <set>

#include "gtest/gtest.h"

namespace ringserve {
namespace {

// Every (layer, block, K/V) plane is a distinct, in-bounds region of the pool: writing through
// every view touches each float exactly once.
TEST(PagedKvCacheTest, LayerViewsTileThePoolWithoutOverlap) {
  PagedKvCache cache(
      {.num_layers = 3, .num_blocks = 5, .block_size = 4, .num_kv_heads = 2, .head_dim = 8});
  EXPECT_EQ(cache.block_floats(), 3 * 2 * 4 * 2 * 8);
  EXPECT_EQ(cache.bytes(), 5 * cache.block_floats() * 4);
  const float* base = cache.data().data();
  std::set<int64_t> seen;
  const int64_t plane = 4 * 2 * 8;
  for (int layer = 0; layer < 3; ++layer) {
    const cpu::KvLayerView view = cache.Layer(layer);
    EXPECT_EQ(view.block_size, 4);
    EXPECT_EQ(view.num_kv_heads, 2);
    EXPECT_EQ(view.head_dim, 8);
    for (int block = 0; block < 5; ++block) {
      for (const float* p : {view.k, view.v}) {
        for (int64_t i = 0; i < plane; ++i) {
          const int64_t index = p + block * view.block_stride + i - base;
          ASSERT_GE(index, 0);
          ASSERT_LT(index, static_cast<int64_t>(cache.data().size()));
          EXPECT_TRUE(seen.insert(index).second) << "layer " << layer << " block " << block;
        }
      }
    }
  }
  EXPECT_EQ(seen.size(), cache.data().size());
}

}  // namespace
}  // namespace ringserve
