// Absorbed MLA decode (mla_decode.h) against an fp32 reference of the same formula on random
// bf16 queries and latent caches, shuffled block tables and mixed context lengths (1 key, a
// partial tile, several tiles and several splits, an empty entry), with head counts that leave
// the last head tile partial; both kernels (the wgmma one where the device is compute capability
// 9.0 and the build has its sm_90a code). Tolerance (relative L2) 2e-2: probabilities are rounded
// to bf16 for the tensor-core P.V product.
#include "kernels/cuda/mla_decode.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "gtest/gtest.h"
#include "kernels/cuda/device_info.h"
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

struct Case {
  int num_heads = 20;
  int block_size = 16;
  std::vector<int32_t> context_lens = {};
  int num_splits = 1;
  int partition = 1024;
  // Block table row of each entry (empty: entry e uses row e); rows = the largest + 1.
  std::vector<int32_t> table_rows = {};
  MlaDecodeKernel kernel = MlaDecodeKernel::kMmaSync;
};

// The kernels this device and build run: mma.sync always, wgmma on compute capability 9.0.
std::vector<MlaDecodeKernel> KernelsHere() {
  std::vector<MlaDecodeKernel> kernels = {MlaDecodeKernel::kMmaSync};
  const absl::StatusOr<DeviceInfo> device = QueryDeviceInfo(0);
  if (device.ok() && device->compute_capability == 90 &&
      CompiledKernelsOfThisBuild().sm90a_prefill) {
    kernels.push_back(MlaDecodeKernel::kWgmmaSm90);
  }
  return kernels;
}
const char* Name(MlaDecodeKernel k) {
  return k == MlaDecodeKernel::kWgmmaSm90 ? "wgmma" : "mma.sync";
}

void RunCase(const Case& c, unsigned seed) {
  std::mt19937 rng(seed);
  const int entries = static_cast<int>(c.context_lens.size());
  const int max_ctx = *std::max_element(c.context_lens.begin(), c.context_lens.end());
  const int max_blocks = std::max(1, (max_ctx + c.block_size - 1) / c.block_size);
  std::vector<int32_t> row_of(entries);
  std::iota(row_of.begin(), row_of.end(), 0);
  if (!c.table_rows.empty()) row_of = c.table_rows;
  const int rows = *std::max_element(row_of.begin(), row_of.end()) + 1;
  const int num_blocks = rows * max_blocks + 3;
  std::vector<int32_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> tables(static_cast<size_t>(rows) * max_blocks);
  for (size_t i = 0; i < tables.size(); ++i) tables[i] = ids[i];
  const int64_t block_stride = static_cast<int64_t>(c.block_size) * kMlaRowDim;
  const std::vector<float> cache =
      RandomBf16Values(rng, static_cast<size_t>(num_blocks) * block_stride);
  const std::vector<float> q =
      RandomBf16Values(rng, static_cast<size_t>(entries) * c.num_heads * kMlaRowDim, 0.5f);
  const float scale = 0.11f;

  // Reference: softmax(scale * q . row) over the entry's rows, times the rows' latents.
  std::vector<float> want(static_cast<size_t>(entries) * c.num_heads * kMlaLatentDim, 0.0f);
  for (int e = 0; e < entries; ++e) {
    const int ctx = c.context_lens[e];
    for (int h = 0; h < c.num_heads; ++h) {
      const float* qh = q.data() + (static_cast<size_t>(e) * c.num_heads + h) * kMlaRowDim;
      std::vector<double> s(ctx);
      double mx = -1e300;
      for (int t = 0; t < ctx; ++t) {
        const float* row = cache.data() +
                           tables[row_of[e] * max_blocks + t / c.block_size] * block_stride +
                           static_cast<int64_t>(t % c.block_size) * kMlaRowDim;
        double dot = 0;
        for (int d = 0; d < kMlaRowDim; ++d) dot += static_cast<double>(qh[d]) * row[d];
        s[t] = dot * scale;
        mx = std::max(mx, s[t]);
      }
      double sum = 0;
      for (int t = 0; t < ctx; ++t) sum += s[t] = std::exp(s[t] - mx);
      float* out = want.data() + (static_cast<size_t>(e) * c.num_heads + h) * kMlaLatentDim;
      for (int t = 0; t < ctx; ++t) {
        const float* row = cache.data() +
                           tables[row_of[e] * max_blocks + t / c.block_size] * block_stride +
                           static_cast<int64_t>(t % c.block_size) * kMlaRowDim;
        for (int d = 0; d < kMlaLatentDim; ++d) out[d] += static_cast<float>(s[t] / sum) * row[d];
      }
    }
  }

  DeviceBuffer d_cache = UploadBf16(cache), d_q = UploadBf16(q);
  DeviceBuffer d_lens = Upload(c.context_lens), d_tables = Upload(tables), d_rows = Upload(row_of);
  DeviceBuffer d_out;
  ASSERT_TRUE(d_out.Allocate(want.size() * 2).ok());
  Poison(d_out);
  DeviceBuffer d_ws;
  const int64_t ws_floats = MlaDecodeWorkspaceFloats(entries, c.num_heads, c.num_splits);
  if (ws_floats > 0) {
    ASSERT_TRUE(d_ws.Allocate(ws_floats * sizeof(float)).ok());
  }
  const MlaCacheLayer layer{.data = static_cast<bf16*>(d_cache.get()),
                            .block_stride = block_stride,
                            .block_size = c.block_size};
  const MlaDecodeBatch batch{
      .context_lens = static_cast<const int32_t*>(d_lens.get()),
      .table_rows = c.table_rows.empty() ? nullptr : static_cast<const int32_t*>(d_rows.get()),
      .block_tables = static_cast<const int32_t*>(d_tables.get()),
      .max_blocks = max_blocks,
      .num_entries = entries,
      .num_splits = c.num_splits,
      .partition = c.partition,
      .workspace = static_cast<float*>(d_ws.get()),
      .kernel = MlaDecodeKernelFor(c.kernel, c.num_heads)};
  RS_ASSERT_OK(LaunchMlaDecode(c.num_heads, scale, layer, static_cast<const bf16*>(d_q.get()),
                               static_cast<bf16*>(d_out.get()), batch, nullptr));
  const std::vector<float> got = DownloadBf16(d_out, want.size());
  for (int e = 0; e < entries; ++e) {
    if (c.context_lens[e] == 0) continue;  // nothing written
    const size_t n = static_cast<size_t>(c.num_heads) * kMlaLatentDim;
    const std::vector<float> g(got.begin() + e * n, got.begin() + (e + 1) * n);
    const std::vector<float> w(want.begin() + e * n, want.begin() + (e + 1) * n);
    EXPECT_LT(RelL2(g, w), 2e-2) << Name(batch.kernel) << " entry " << e << " context "
                                 << c.context_lens[e] << " splits " << c.num_splits;
  }
}

TEST(MlaDecodeTest, OneSplitMatchesTheReference) {
  RS_SKIP_WITHOUT_GPU();
  RunCase({.num_heads = 20, .block_size = 16, .context_lens = {1, 33, 300, 0, 64}}, 1);
}

TEST(MlaDecodeTest, SplitsMergeToTheReference) {
  RS_SKIP_WITHOUT_GPU();
  RunCase({.num_heads = 20,
           .block_size = 16,
           .context_lens = {300, 33, 1, 0, 257},
           .num_splits = 3,
           .partition = 128},
          2);
}

TEST(MlaDecodeTest, DeepseekV3HeadsWithBlocksOf64) {
  RS_SKIP_WITHOUT_GPU();
  for (const MlaDecodeKernel k : KernelsHere()) {
    // Splits of 352 keys: the wgmma kernel's 64-key tiles straddle the split boundaries.
    RunCase({.num_heads = 128,
             .block_size = 64,
             .context_lens = {700, 5},
             .num_splits = 2,
             .partition = 352,
             .kernel = k},
            3);
    RunCase({.num_heads = 128, .block_size = 16, .context_lens = {1, 64, 65, 0, 1000}, .kernel = k},
            5);
  }
}

// A head count that fills one 64-head tile and part of a second (and three 16-head tiles and
// part of a fourth), through splits and without.
TEST(MlaDecodeTest, PartialHeadTiles) {
  RS_SKIP_WITHOUT_GPU();
  for (const MlaDecodeKernel k : KernelsHere()) {
    RunCase({.num_heads = 80, .block_size = 32, .context_lens = {129, 3, 31}, .kernel = k}, 6);
    RunCase({.num_heads = 80,
             .block_size = 32,
             .context_lens = {129, 3, 600},
             .num_splits = 4,
             .partition = 160,
             .kernel = k},
            7);
  }
}

// The splits each kernel's plan chooses, run as planned (one entry at 4k keys, 8 at 1k).
TEST(MlaDecodeTest, PlannedSplitsMatchTheReference) {
  RS_SKIP_WITHOUT_GPU();
  for (const MlaDecodeKernel k : KernelsHere()) {
    for (const int entries : {1, 8}) {
      const int ctx = entries == 1 ? 4096 : 1024;
      const MlaSplitPlan plan = PlanMlaDecodeSplits(entries, 128, ctx, 132, k);
      RunCase({.num_heads = 128,
               .block_size = 64,
               .context_lens = std::vector<int32_t>(entries, ctx),
               .num_splits = plan.num_splits,
               .partition = plan.partition,
               .kernel = k},
              8 + entries);
    }
  }
}

// A prefill chunk over the compressed cache: one entry per query token of one sequence at
// positions 40..46 (causal contexts 41..47), all through the sequence's table row 1, beside a
// decode entry of another sequence (row 0).
TEST(MlaDecodeTest, PrefillChunkAsOneEntryPerQueryToken) {
  RS_SKIP_WITHOUT_GPU();
  RunCase({.num_heads = 16,
           .block_size = 16,
           .context_lens = {41, 42, 43, 44, 45, 46, 47, 90},
           .num_splits = 2,
           .partition = 64,
           .table_rows = {1, 1, 1, 1, 1, 1, 1, 0}},
          4);
}

TEST(MlaDecodeTest, SplitPlanCoversTheContextAndRefusesBadPartitions) {
  const MlaSplitPlan one = PlanMlaDecodeSplits(1, 128, 32768, 132);
  EXPECT_GT(one.num_splits, 1);
  EXPECT_GE(one.num_splits * one.partition, 32768);
  EXPECT_EQ(one.partition % 32, 0);
  const MlaSplitPlan many = PlanMlaDecodeSplits(32, 128, 32768, 132);
  EXPECT_GE(many.num_splits * many.partition, 32768);
  const MlaSplitPlan tiny = PlanMlaDecodeSplits(1, 128, 10, 132);
  EXPECT_EQ(tiny.num_splits, 1);
  // The wgmma kernel: one CTA an SM, the workspace bound, and the split count that fills the SMs.
  const MlaDecodeKernel wgmma = MlaDecodeKernel::kWgmmaSm90;
  for (const int entries : {1, 2, 8, 32, 48, 64, 100, 300}) {
    for (const int ctx : {1, 100, 4096, 32768}) {
      const MlaSplitPlan p = PlanMlaDecodeSplits(entries, 128, ctx, 132, wgmma);
      EXPECT_GE(p.num_splits * p.partition, ctx) << entries << " x " << ctx;
      EXPECT_LT((p.num_splits - 1) * p.partition, ctx) << entries << " x " << ctx;
      EXPECT_EQ(p.partition % 64, 0);
      if (p.num_splits > 1) {
        EXPECT_LE(entries * p.num_splits * 128, kMlaWorkspaceRowsPerSm * 132)
            << entries << " x " << ctx;
      }
    }
  }
  EXPECT_EQ(PlanMlaDecodeSplits(32, 128, 32768, 132, wgmma).num_splits, 2);  // 128 CTAs
  EXPECT_EQ(PlanMlaDecodeSplits(1, 128, 32768, 132, wgmma).num_splits, 64);  // 512 keys each
  EXPECT_EQ(PlanMlaDecodeSplits(1, 128, 4096, 132, wgmma).num_splits, 16);   // 256 keys each
  EXPECT_EQ(PlanMlaDecodeSplits(1, 128, 128, 132, wgmma).num_splits, 1);
  // Fewer heads than a wgmma tile: the mma.sync kernel and its plan.
  EXPECT_EQ(MlaDecodeKernelFor(wgmma, 16), MlaDecodeKernel::kMmaSync);
  EXPECT_EQ(MlaDecodeKernelFor(wgmma, 128), wgmma);
  EXPECT_EQ(PlanMlaDecodeSplits(4, 16, 4096, 132, wgmma).partition,
            PlanMlaDecodeSplits(4, 16, 4096, 132).partition);
  RS_SKIP_WITHOUT_GPU();
  const MlaDecodeBatch bad{.num_entries = 1, .partition = 48};
  EXPECT_FALSE(LaunchMlaDecode(16, 1.0f, {.block_size = 16}, nullptr, nullptr, bad, nullptr).ok());
  const MlaDecodeBatch few_heads{.num_entries = 1, .partition = 64, .kernel = wgmma};
  EXPECT_FALSE(
      LaunchMlaDecode(16, 1.0f, {.block_size = 16}, nullptr, nullptr, few_heads, nullptr).ok());
}

}  // namespace
}  // namespace ringserve::cuda
