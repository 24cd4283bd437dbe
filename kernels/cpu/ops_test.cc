#include "kernels/cpu/ops.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace ringserve::cpu {
namespace {

std::vector<float> Random(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

TEST(CpuOpsTest, RmsNormMatchesDefinition) {
  const std::vector<float> x = {1.0f, -2.0f, 3.0f, 4.0f, 0.5f, 0.5f, 0.5f, 0.5f};
  const std::vector<float> w = {1.0f, 2.0f, 0.5f, -1.0f};
  std::vector<float> y(8);
  RmsNorm(x.data(), w.data(), 2, 4, 1e-6f, y.data());
  const float inv0 = 1.0f / std::sqrt((1 + 4 + 9 + 16) / 4.0f + 1e-6f);
  EXPECT_NEAR(y[0], 1.0f * inv0 * 1.0f, 1e-6);
  EXPECT_NEAR(y[1], -2.0f * inv0 * 2.0f, 1e-6);
  EXPECT_NEAR(y[3], 4.0f * inv0 * -1.0f, 1e-6);
  const float inv1 = 1.0f / std::sqrt(0.25f + 1e-6f);
  EXPECT_NEAR(y[5], 0.5f * inv1 * 2.0f, 1e-6);
  // In place gives the same result.
  std::vector<float> z = x;
  RmsNorm(z.data(), w.data(), 2, 4, 1e-6f, z.data());
  EXPECT_EQ(z, y);
}

TEST(CpuOpsTest, MatMulMatchesNaiveForAllRowBlockings) {
  for (int rows : {1, 3, 4, 5, 9}) {
    const int in = 19, out = 7;  // `in` not a multiple of the lane count
    const std::vector<float> x = Random(rows * in, 1 + rows);
    const std::vector<float> w = Random(out * in, 2);
    const std::vector<float> b = Random(out, 3);
    std::vector<float> y(rows * out), y_nobias(rows * out);
    MatMul(x.data(), w.data(), b.data(), rows, in, out, y.data());
    MatMul(x.data(), w.data(), nullptr, rows, in, out, y_nobias.data());
    for (int r = 0; r < rows; ++r) {
      for (int n = 0; n < out; ++n) {
        double ref = 0;
        for (int k = 0; k < in; ++k) ref += static_cast<double>(x[r * in + k]) * w[n * in + k];
        EXPECT_NEAR(y_nobias[r * out + n], ref, 1e-5) << "rows=" << rows << " r=" << r;
        EXPECT_NEAR(y[r * out + n], ref + b[n], 1e-5) << "rows=" << rows << " r=" << r;
      }
    }
  }
}

TEST(CpuOpsTest, SiluMulAndAdd) {
  const std::vector<float> gate = {0.0f, 1.0f, -2.0f};
  const std::vector<float> up = {3.0f, 2.0f, 0.5f};
  std::vector<float> out(3);
  SiluMul(gate.data(), up.data(), 3, out.data());
  EXPECT_FLOAT_EQ(out[0], 0.0f);
  EXPECT_NEAR(out[1], 1.0f / (1.0f + std::exp(-1.0f)) * 2.0f, 1e-6);
  EXPECT_NEAR(out[2], -2.0f / (1.0f + std::exp(2.0f)) * 0.5f, 1e-6);
  std::vector<float> x = {1, 2, 3};
  Add(x.data(), up.data(), 3);
  EXPECT_EQ(x, (std::vector<float>{4, 4, 3.5f}));
}

TEST(CpuOpsTest, EmbedCopiesRows) {
  const std::vector<float> table = {0, 1, 10, 11, 20, 21};
  const std::vector<int32_t> ids = {2, 0, 2};
  std::vector<float> out(6);
  Embed(table.data(), 2, ids.data(), 3, out.data());
  EXPECT_EQ(out, (std::vector<float>{20, 21, 0, 1, 20, 21}));
}

TEST(CpuOpsTest, RopeInvFreqAndLlama3Bands) {
  std::vector<float> f = RopeInvFreq(8, 10000.0);
  ASSERT_EQ(f.size(), 4u);
  EXPECT_FLOAT_EQ(f[0], 1.0f);
  EXPECT_NEAR(f[1], 0.1f, 1e-7);
  EXPECT_NEAR(f[3], 0.001f, 1e-9);
  // original max 32, low 1, high 4: wavelengths > 32 scaled by 1/8, < 8 kept, between smoothed.
  std::vector<float> g = {1.0f, 0.5f, 0.25f, 0.01f};  // wavelengths 6.28, 12.6, 25.1, 628
  ApplyLlama3RopeScaling(g, 8.0, 1.0, 4.0, 32);
  EXPECT_FLOAT_EQ(g[0], 1.0f);
  EXPECT_NEAR(g[3], 0.01f / 8, 1e-9);
  const double smooth = (32 / (2 * M_PI / 0.5) - 1.0) / 3.0;
  EXPECT_NEAR(g[1], (1 - smooth) * 0.5 / 8 + smooth * 0.5, 1e-7);
  EXPECT_GT(g[2], 0.25f / 8);
  EXPECT_LT(g[2], 0.25f);
}

TEST(CpuOpsTest, RopeRotatesHalvesByPositionTimesFrequency) {
  // One token, one head, head_dim 4: pairs (x0, x2) and (x1, x3).
  std::vector<float> x = {1.0f, 2.0f, 3.0f, 4.0f};
  const std::vector<float> inv_freq = {0.5f, 0.25f};
  const int32_t position = 3;
  ApplyRope(x.data(), 1, 1, 4, &position, inv_freq.data());
  const float a0 = 1.5f, a1 = 0.75f;
  EXPECT_NEAR(x[0], 1 * std::cos(a0) - 3 * std::sin(a0), 1e-6);
  EXPECT_NEAR(x[2], 3 * std::cos(a0) + 1 * std::sin(a0), 1e-6);
  EXPECT_NEAR(x[1], 2 * std::cos(a1) - 4 * std::sin(a1), 1e-6);
  EXPECT_NEAR(x[3], 4 * std::cos(a1) + 2 * std::sin(a1), 1e-6);
  // Position 0 is the identity.
  std::vector<float> y = {1.0f, 2.0f, 3.0f, 4.0f};
  const int32_t zero = 0;
  ApplyRope(y.data(), 1, 1, 4, &zero, inv_freq.data());
  EXPECT_EQ(y, (std::vector<float>{1.0f, 2.0f, 3.0f, 4.0f}));
}

// Dense causal GQA attention, the textbook way, as the oracle for the paged version: a
// full-size score row with masked positions at -inf, and the sink as one more column.
std::vector<float> DenseAttention(const std::vector<float>& q, const std::vector<float>& k,
                                  const std::vector<float>& v, int tokens, int heads, int kv_heads,
                                  int d, float scale, int window = 0,
                                  const float* sinks = nullptr) {
  std::vector<float> out(q.size());
  for (int t = 0; t < tokens; ++t) {
    for (int h = 0; h < heads; ++h) {
      const int g = h / (heads / kv_heads);
      std::vector<double> s(t + 1);
      double m = sinks != nullptr ? sinks[h] : -1e30;
      for (int j = 0; j <= t; ++j) {
        double dot = 0;
        for (int i = 0; i < d; ++i) {
          dot += q[(t * heads + h) * d + i] * k[(j * kv_heads + g) * d + i];
        }
        s[j] = (window > 0 && j <= t - window) ? -INFINITY : dot * scale;
        m = std::max(m, s[j]);
      }
      double z = sinks != nullptr ? std::exp(sinks[h] - m) : 0.0;
      for (double& e : s) z += (e = std::exp(e - m));
      for (int i = 0; i < d; ++i) {
        double acc = 0;
        for (int j = 0; j <= t; ++j) acc += s[j] / z * v[(j * kv_heads + g) * d + i];
        out[(t * heads + h) * d + i] = static_cast<float>(acc);
      }
    }
  }
  return out;
}

TEST(CpuOpsTest, PagedAttentionMatchesDenseWithScatteredBlocksAndChunks) {
  const int tokens = 11, heads = 4, kv_heads = 2, d = 8, block_size = 3, num_blocks = 9;
  const float scale = 1.0f / std::sqrt(8.0f);
  const std::vector<float> q = Random(tokens * heads * d, 7);
  const std::vector<float> k = Random(tokens * kv_heads * d, 8);
  const std::vector<float> v = Random(tokens * kv_heads * d, 9);
  const std::vector<float> want = DenseAttention(q, k, v, tokens, heads, kv_heads, d, scale);

  // Two layers interleaved in the pool, like PagedKvCache; use layer 1.
  const int64_t plane = block_size * kv_heads * d;
  const int64_t block_stride = 2 * 2 * plane;
  std::vector<float> pool(num_blocks * block_stride, NAN);
  KvLayerView kv{.k = pool.data() + 2 * plane,
                 .v = pool.data() + 3 * plane,
                 .block_stride = block_stride,
                 .block_size = block_size,
                 .num_kv_heads = kv_heads,
                 .head_dim = d};
  const std::vector<int32_t> table = {7, 2, 5, 0};  // non-contiguous, out of order
  // Prefill 5 tokens, then 4, then decode 1 by 1: chunks straddle block boundaries.
  std::vector<float> got(q.size());
  const std::vector<std::pair<int, int>> chunks = {{0, 5}, {5, 4}, {9, 1}, {10, 1}};
  for (auto [start, n] : chunks) {
    WriteKv(kv, table, start, n, k.data() + start * kv_heads * d, v.data() + start * kv_heads * d);
    PagedAttention(q.data() + start * heads * d, n, heads, kv, table, start, scale,
                   got.data() + start * heads * d);
  }
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-5) << "i=" << i;
  // The other layer's planes and unused blocks were not touched.
  for (int b : {1, 3, 4, 6, 8}) {
    EXPECT_TRUE(std::isnan(pool[b * block_stride])) << "block " << b;
  }
  EXPECT_TRUE(std::isnan(pool[7 * block_stride]));  // layer 0 of a used block
}

// gpt-oss's attention: a window of 4 positions over 11 tokens (so early keys drop out) and a
// per-head sink logit in each softmax, through the same chunked, paged path.
TEST(CpuOpsTest, PagedAttentionWithSlidingWindowAndSinksMatchesDense) {
  const int tokens = 11, heads = 4, kv_heads = 2, d = 8, block_size = 3, window = 4;
  const float scale = 1.0f / std::sqrt(8.0f);
  const std::vector<float> q = Random(tokens * heads * d, 17);
  const std::vector<float> k = Random(tokens * kv_heads * d, 18);
  const std::vector<float> v = Random(tokens * kv_heads * d, 19);
  const std::vector<float> sinks = {0.5f, -1.0f, 2.0f, 0.0f};
  const std::vector<float> want =
      DenseAttention(q, k, v, tokens, heads, kv_heads, d, scale, window, sinks.data());
  const std::vector<float> full = DenseAttention(q, k, v, tokens, heads, kv_heads, d, scale);
  const int64_t plane = block_size * kv_heads * d;
  std::vector<float> pool(4 * 2 * plane);
  KvLayerView kv{.k = pool.data(),
                 .v = pool.data() + plane,
                 .block_stride = 2 * plane,
                 .block_size = block_size,
                 .num_kv_heads = kv_heads,
                 .head_dim = d};
  const std::vector<int32_t> table = {3, 1, 0, 2};
  std::vector<float> got(q.size());
  for (auto [start, n] : std::vector<std::pair<int, int>>{{0, 6}, {6, 4}, {10, 1}}) {
    WriteKv(kv, table, start, n, k.data() + start * kv_heads * d, v.data() + start * kv_heads * d);
    PagedAttention(q.data() + start * heads * d, n, heads, kv, table, start, scale,
                   AttentionVariant{.sliding_window = window, .sinks = sinks.data()},
                   got.data() + start * heads * d);
  }
  float differs = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-5) << "i=" << i;
    differs = std::max(differs, std::abs(want[i] - full[i]));
  }
  EXPECT_GT(differs, 1e-2) << "window and sinks did not change the result";
}

TEST(CpuOpsTest, PartialRopeRotatesOnlyTheFirstRotaryDims) {
  // head_dim 8, rotary_dim 4: pairs (x0, x2), (x1, x3); x4..x7 pass through.
  std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<float> inv_freq = {0.5f, 0.25f};
  const int32_t position = 3;
  ApplyPartialRope(x.data(), 1, 1, 8, 4, &position, inv_freq.data());
  EXPECT_NEAR(x[0], 1 * std::cos(1.5f) - 3 * std::sin(1.5f), 1e-6);
  EXPECT_NEAR(x[3], 4 * std::cos(0.75f) + 2 * std::sin(0.75f), 1e-6);
  EXPECT_EQ(std::vector<float>(x.begin() + 4, x.end()), (std::vector<float>{5, 6, 7, 8}));
}

}  // namespace
}  // namespace ringserve::cpu
