#include "stage/model/kv_cache.h"

#include <cmath>
#include <random>
#include <set>

#include "common/dtype.h"
#include "gtest/gtest.h"
#include "stage/model/kv_cache_scales.h"
#include "stage/model/testing/safetensors_writer.h"

namespace ringserve {
namespace {

// Every (layer, block, K/V) plane is a distinct, in-bounds region of the pool: writing through
// every view touches each float exactly once.
TEST(PagedKvCacheTest, LayerViewsTileThePoolWithoutOverlap) {
  PagedKvCache cache(
      {.num_layers = 3, .num_blocks = 5, .block_size = 4, .num_kv_heads = 2, .head_dim = 8});
  EXPECT_EQ(cache.block_values(), 3 * 2 * 4 * 2 * 8);
  EXPECT_EQ(cache.bytes(), 5 * cache.block_values() * 4);
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

// An fp8 pool: one byte per value; WriteKv stores e4m3(x / scale) per layer's scales, and
// PagedAttention over it equals PagedAttention over an fp32 pool holding the decoded values
// (code * scale), bit for bit.
TEST(PagedKvCacheTest, Fp8PoolStoresScaledCodesAndAttendsToTheirValues) {
  const PagedKvCache::Options shape{
      .num_layers = 2, .num_blocks = 6, .block_size = 4, .num_kv_heads = 2, .head_dim = 8};
  PagedKvCache::Options fp8_options = shape;
  fp8_options.dtype = KvCacheDtype::kFp8E4m3;
  fp8_options.k_scales = {1.0f, 0.5f};
  fp8_options.v_scales = {1.0f, 0.125f};
  PagedKvCache fp8(fp8_options), fp32(shape);
  EXPECT_EQ(fp8.element_bytes(), 1);
  EXPECT_EQ(fp8.bytes() * 4, fp32.bytes());
  EXPECT_TRUE(fp8.data().empty());
  EXPECT_EQ(fp8.codes().size(), static_cast<size_t>(6 * fp8.block_values()));

  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  const int tokens = 11, heads = 4, row = 2 * 8;
  std::vector<float> k(tokens * row), v(tokens * row), q(tokens * heads * 8);
  for (float& x : k) x = normal(rng);
  for (float& x : v) x = normal(rng);
  for (float& x : q) x = normal(rng);
  const std::vector<int32_t> table = {5, 2, 0};
  const cpu::KvLayerView view = fp8.Layer(1);
  EXPECT_EQ(view.k, nullptr);
  EXPECT_EQ(view.k_scale, 0.5f);
  EXPECT_EQ(view.v_scale, 0.125f);
  cpu::WriteKv(view, table, 0, tokens, k.data(), v.data());
  // The decoded values, written to the fp32 pool.
  std::vector<float> k_decoded(k.size()), v_decoded(v.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k_decoded[i] = Fp8E4M3ToFloat(FloatToFp8E4M3(k[i] / 0.5f)) * 0.5f;
    v_decoded[i] = Fp8E4M3ToFloat(FloatToFp8E4M3(v[i] / 0.125f)) * 0.125f;
    EXPECT_LE(std::fabs(k_decoded[i] - k[i]), std::fabs(k[i]) / 16 + 0.5f / 1024) << i;
  }
  cpu::WriteKv(fp32.Layer(1), table, 0, tokens, k_decoded.data(), v_decoded.data());
  // Layer 0 stays untouched (zero codes).
  const int64_t plane = 4 * row;
  for (int64_t i = 0; i < plane; ++i) EXPECT_EQ(fp8.codes()[5 * fp8.block_values() + i], 0);
  std::vector<float> want(q.size()), got(q.size());
  cpu::PagedAttention(q.data(), tokens, heads, fp32.Layer(1), table, 0, 0.35f, want.data());
  cpu::PagedAttention(q.data(), tokens, heads, view, table, 0, 0.35f, got.data());
  EXPECT_EQ(got, want);
}

// Per-layer K/V scales from a compressed-tensors kv_cache_scheme checkpoint; 1.0 where a layer
// has none; a lone scale, a per-head scale or a non-positive one is refused by name.
TEST(KvCacheScalesTest, ReadsPerLayerScalesAndRefusesWhatItCannotUse) {
  testing::TempDir dir;
  const auto write = [&](std::vector<testing::TensorToWrite> tensors) {
    tensors.push_back(
        {.name = "model.embed_tokens.weight", .shape = {2, 2}, .values = {1, 2, 3, 4}});
    return testing::WriteFile(dir.path() + "/model.safetensors",
                              testing::SafetensorsBytes(tensors));
  };
  ASSERT_TRUE(write({{.name = "model.layers.1.self_attn.k_scale", .shape = {}, .values = {0.5f}},
                     {.name = "model.layers.1.self_attn.v_scale", .shape = {1}, .values = {0.25f}}})
                  .ok());
  auto weights = SafetensorsModel::Open(dir.path());
  ASSERT_TRUE(weights.ok()) << weights.status();
  auto scales = LoadKvCacheScales(**weights, {0, 3});
  ASSERT_TRUE(scales.ok()) << scales.status();
  EXPECT_EQ(scales->k, (std::vector<float>{1.0f, 0.5f, 1.0f}));
  EXPECT_EQ(scales->v, (std::vector<float>{1.0f, 0.25f, 1.0f}));
  EXPECT_TRUE(scales->from_checkpoint);
  auto none = LoadKvCacheScales(**weights, {2, 3});
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->from_checkpoint);

  struct Bad {
    std::vector<testing::TensorToWrite> tensors;
    std::string fragment;
  };
  const Bad bad[] = {
      {{{.name = "model.layers.0.self_attn.k_scale", .shape = {1}, .values = {0.5f}}},
       "model.layers.0.self_attn.k_scale: the checkpoint has this KV cache scale but not "
       "model.layers.0.self_attn.v_scale"},
      {{{.name = "model.layers.0.self_attn.k_scale", .shape = {2}, .values = {0.5f, 1.0f}},
        {.name = "model.layers.0.self_attn.v_scale", .shape = {1}, .values = {0.5f}}},
       "only one KV cache scale per layer"},
      {{{.name = "model.layers.0.self_attn.k_scale", .shape = {1}, .values = {0.5f}},
        {.name = "model.layers.0.self_attn.v_scale", .shape = {1}, .values = {-1.0f}}},
       "model.layers.0.self_attn.v_scale: KV cache scale -1 is not positive and finite"},
  };
  for (const Bad& b : bad) {
    ASSERT_TRUE(write(b.tensors).ok());
    auto reopened = SafetensorsModel::Open(dir.path());
    ASSERT_TRUE(reopened.ok());
    auto refused = LoadKvCacheScales(**reopened, {0, 1});
    ASSERT_FALSE(refused.ok()) << b.fragment;
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(refused.status().message().find(b.fragment), std::string::npos) << refused.status();
  }
}

}  // namespace
}  // namespace ringserve
