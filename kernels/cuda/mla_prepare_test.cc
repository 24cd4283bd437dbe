// The MLA data path kernels (mla_prepare.h) against fp32 references of the same formulas on random
// bf16 inputs: the latent cache row (norm, both rope layouts, YaRN factor, bias, a skipped slot),
// the absorbed query and the value up-projection, with token counts that leave a partial tile.
// Tolerance (relative L2) 1e-2: fp32 math, bf16 outputs.
#include "kernels/cuda/mla_prepare.h"

#include <cmath>
#include <random>

#include "gtest/gtest.h"
#include "kernels/cuda/test_util.h"

namespace ringserve::cuda {
namespace {

using testing::Download;
using testing::DownloadBf16;
using testing::Poison;
using testing::RandomBf16Values;
using testing::RelL2;
using testing::Upload;
using testing::UploadBf16;

std::vector<float> InvFreq() {
  std::vector<float> f(kMlaRopeDim / 2);
  for (int i = 0; i < kMlaRopeDim / 2; ++i) f[i] = std::pow(10000.0f, -2.0f * i / kMlaRopeDim);
  return f;
}

// x[kMlaRopeDim] rotated in place, as cpu_mla_attention's RotateMlaRope.
void Rotate(float* x, int position, const std::vector<float>& inv_freq, float factor,
            bool interleave) {
  for (int i = 0; i < kMlaRopeDim / 2; ++i) {
    const int a = interleave ? 2 * i : i, b = interleave ? 2 * i + 1 : i + kMlaRopeDim / 2;
    const double angle = static_cast<double>(position) * inv_freq[i];
    const float cs = static_cast<float>(std::cos(angle)) * factor;
    const float sn = static_cast<float>(std::sin(angle)) * factor;
    const float xa = x[a], xb = x[b];
    x[a] = xa * cs - xb * sn;
    x[b] = xb * cs + xa * sn;
  }
}

class MlaPrepareTest : public ::testing::TestWithParam<bool> {};  // rope interleave

TEST_P(MlaPrepareTest, StoreLatentWritesTheNormedLatentAndTheRotatedKey) {
  RS_SKIP_WITHOUT_GPU();
  const bool interleave = GetParam();
  std::mt19937 rng(1);
  const int tokens = 5, block_size = 4, blocks = 6;
  const std::vector<float> kv_a = RandomBf16Values(rng, tokens * kMlaRowDim);
  const std::vector<float> bias = RandomBf16Values(rng, kMlaRowDim, 0.1f);
  std::vector<float> norm = RandomBf16Values(rng, kMlaLatentDim, 0.1f);
  for (float& w : norm) w = BF16ToFloat(FloatToBF16(w + 1.0f));
  const std::vector<int32_t> positions = {0, 7, 100, 4095, 31};
  const std::vector<int32_t> slots = {5, 22, -1, 0, 9};  // token 2 is padding
  const std::vector<float> inv_freq = InvFreq();
  const float factor = 0.93f;

  DeviceBuffer d_cache;
  ASSERT_TRUE(d_cache.Allocate(blocks * block_size * kMlaRowDim * 2).ok());
  Poison(d_cache);
  DeviceBuffer d_kv_a = UploadBf16(kv_a), d_bias = UploadBf16(bias), d_norm = UploadBf16(norm);
  DeviceBuffer d_pos = Upload(positions), d_slots = Upload(slots), d_freq = Upload(inv_freq);
  RS_ASSERT_OK(LaunchMlaStoreLatent({.kv_a = static_cast<const bf16*>(d_kv_a.get()),
                                     .kv_a_bias = static_cast<const bf16*>(d_bias.get()),
                                     .norm = static_cast<const bf16*>(d_norm.get()),
                                     .rope = {.positions = static_cast<const int32_t*>(d_pos.get()),
                                              .inv_freq = static_cast<const float*>(d_freq.get()),
                                              .factor = factor,
                                              .interleave = interleave},
                                     .slots = static_cast<const int32_t*>(d_slots.get()),
                                     .cache = {.data = static_cast<bf16*>(d_cache.get()),
                                               .block_stride = block_size * kMlaRowDim,
                                               .block_size = block_size},
                                     .num_tokens = tokens},
                                    nullptr));
  const std::vector<float> cache = DownloadBf16(d_cache, blocks * block_size * kMlaRowDim);
  for (int t = 0; t < tokens; ++t) {
    if (slots[t] < 0) continue;
    std::vector<float> want(kMlaRowDim);
    double sq = 0;
    for (int c = 0; c < kMlaRowDim; ++c) want[c] = kv_a[t * kMlaRowDim + c] + bias[c];
    for (int c = 0; c < kMlaLatentDim; ++c) sq += want[c] * want[c];
    const float inv = 1.0f / std::sqrt(static_cast<float>(sq / kMlaLatentDim) + 1e-6f);
    for (int c = 0; c < kMlaLatentDim; ++c) want[c] *= inv * norm[c];
    Rotate(want.data() + kMlaLatentDim, positions[t], inv_freq, factor, interleave);
    const std::vector<float> got(cache.begin() + slots[t] * kMlaRowDim,
                                 cache.begin() + (slots[t] + 1) * kMlaRowDim);
    EXPECT_LT(RelL2(got, want), 1e-2) << "token " << t;
  }
  // The padding token's slot (none) and untouched slots keep the poison.
  EXPECT_TRUE(std::isnan(cache[1 * kMlaRowDim]));
}

TEST_P(MlaPrepareTest, AbsorbedQueryAndValueUpProjection) {
  RS_SKIP_WITHOUT_GPU();
  const bool interleave = GetParam();
  std::mt19937 rng(2);
  const int tokens = 11, heads = 3, nope = 128, v = 128, qk = nope + kMlaRopeDim;
  const std::vector<float> q = RandomBf16Values(rng, tokens * heads * qk);
  const std::vector<float> kv_b =
      RandomBf16Values(rng, static_cast<size_t>(heads) * (nope + v) * kMlaLatentDim, 0.05f);
  const std::vector<float> latent = RandomBf16Values(rng, tokens * heads * kMlaLatentDim);
  std::vector<int32_t> positions(tokens);
  for (int t = 0; t < tokens; ++t) positions[t] = 37 * t + 3;
  const std::vector<float> inv_freq = InvFreq();

  DeviceBuffer d_q = UploadBf16(q), d_kv_b = UploadBf16(kv_b), d_lat = UploadBf16(latent);
  DeviceBuffer d_pos = Upload(positions), d_freq = Upload(inv_freq);
  DeviceBuffer d_q_out, d_v_out;
  ASSERT_TRUE(d_q_out.Allocate(tokens * heads * kMlaRowDim * 2).ok());
  ASSERT_TRUE(d_v_out.Allocate(tokens * heads * v * 2).ok());
  Poison(d_q_out);
  Poison(d_v_out);
  const MlaRope rope{.positions = static_cast<const int32_t*>(d_pos.get()),
                     .inv_freq = static_cast<const float*>(d_freq.get()),
                     .factor = 1.0f,
                     .interleave = interleave};
  RS_ASSERT_OK(LaunchMlaAbsorbQuery({.q = static_cast<const bf16*>(d_q.get()),
                                     .kv_b = static_cast<const bf16*>(d_kv_b.get()),
                                     .rope = rope,
                                     .q_out = static_cast<bf16*>(d_q_out.get()),
                                     .num_tokens = tokens,
                                     .num_heads = heads,
                                     .nope = nope,
                                     .v = v},
                                    nullptr));
  RS_ASSERT_OK(LaunchMlaUpProjectValue({.latent_out = static_cast<const bf16*>(d_lat.get()),
                                        .kv_b = static_cast<const bf16*>(d_kv_b.get()),
                                        .out = static_cast<bf16*>(d_v_out.get()),
                                        .num_tokens = tokens,
                                        .num_heads = heads,
                                        .nope = nope,
                                        .v = v},
                                       nullptr));
  std::vector<float> want_q(tokens * heads * kMlaRowDim), want_v(tokens * heads * v);
  for (int t = 0; t < tokens; ++t) {
    for (int h = 0; h < heads; ++h) {
      const float* qh = q.data() + (t * heads + h) * qk;
      float* out = want_q.data() + (t * heads + h) * kMlaRowDim;
      for (int c = 0; c < kMlaLatentDim; ++c) {
        double s = 0;
        for (int r = 0; r < nope; ++r) {
          s += static_cast<double>(qh[r]) *
               kv_b[(static_cast<size_t>(h) * (nope + v) + r) * kMlaLatentDim + c];
        }
        out[c] = static_cast<float>(s);
      }
      for (int r = 0; r < kMlaRopeDim; ++r) out[kMlaLatentDim + r] = qh[nope + r];
      Rotate(out + kMlaLatentDim, positions[t], inv_freq, 1.0f, interleave);
      const float* lat = latent.data() + (t * heads + h) * kMlaLatentDim;
      for (int j = 0; j < v; ++j) {
        double s = 0;
        for (int c = 0; c < kMlaLatentDim; ++c) {
          s += static_cast<double>(lat[c]) *
               kv_b[(static_cast<size_t>(h) * (nope + v) + nope + j) * kMlaLatentDim + c];
        }
        want_v[(t * heads + h) * v + j] = static_cast<float>(s);
      }
    }
  }
  EXPECT_LT(RelL2(DownloadBf16(d_q_out, want_q.size()), want_q), 1e-2);
  EXPECT_LT(RelL2(DownloadBf16(d_v_out, want_v.size()), want_v), 1e-2);
}

INSTANTIATE_TEST_SUITE_P(Rope, MlaPrepareTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Interleaved" : "Half"; });

}  // namespace
}  // namespace ringserve::cuda
