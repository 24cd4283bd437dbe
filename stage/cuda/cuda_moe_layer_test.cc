// The GPU MoE kernels and layer against the CPU reference: routing (every scoring rule) against
// RouteTokens on random logits, exactly for the chosen experts and within fp32 rounding for
// the weights, plus the grouping's invariants; the grouped GEMV and tensor-core GEMM against a
// host product; the quantized grouped GEMV (every format) and the GEMM over group ranges of
// dequantized weights against a host product on the dequantized values; and whole MoE blocks of the
// golden fixtures (tests/fixtures/models) against CpuMoeForward on random bf16 rows (relative L2 <=
// 1e-2: bf16 weights and activations).
#include "stage/cuda/cuda_moe_layer.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/test_util.h"
#include "stage/cuda/cuda_quant_linear.h"
#include "stage/model/cpu_moe.h"
#include "stage/model/moe_router.h"
#include "stage/model/quant/packed_matrix.h"

namespace ringserve::cuda {
namespace {

using testing::RelL2;

template <typename T>
absl::StatusOr<DeviceBuffer> Upload(const std::vector<T>& host) {
  DeviceBuffer buffer;
  RS_RETURN_IF_ERROR(buffer.Allocate(std::max<size_t>(1, host.size() * sizeof(T))));
  RS_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(buffer.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return buffer;
}

template <typename T>
std::vector<T> Download(const DeviceBuffer& buffer, size_t n) {
  std::vector<T> host(n);
  EXPECT_EQ(cudaMemcpy(host.data(), buffer.get(), n * sizeof(T), cudaMemcpyDeviceToHost),
            cudaSuccess);
  return host;
}

std::vector<float> DownloadBf16(const DeviceBuffer& buffer, size_t n) {
  std::vector<float> out;
  for (const bf16 v : Download<bf16>(buffer, n)) out.push_back(__bfloat162float(v));
  return out;
}

// Whether this device and build run the Hopper grouped GEMM (compute capability 9.0, sm_90a code).
bool WgmmaHere() {
  const absl::StatusOr<DeviceInfo> device = QueryDeviceInfo(0);
  return device.ok() && device->compute_capability == 90 &&
         CompiledKernelsOfThisBuild().sm90a_prefill;
}

std::vector<bf16> ToBf16(const std::vector<float>& v) {
  std::vector<bf16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = __float2bfloat16(v[i]);
  return out;
}

std::vector<float> RoundBf16(std::vector<float> v) {
  for (float& x : v) x = __bfloat162float(__float2bfloat16(x));
  return v;
}

// Tensor cores from 4 rows an expert on average, never below 5 tokens.
TEST(CudaMoeLayerPolicyTest, TensorCoreGemvFromFourRowsAnExpert) {
  auto min_tokens = [](int experts, int top_k) {
    return CudaMoeLayer::DefaultMmaMinTokens({.num_experts = experts, .top_k = top_k});
  };
  EXPECT_EQ(min_tokens(128, 8), 64);  // Qwen3-30B-A3B, GLM-4.5-Air
  EXPECT_EQ(min_tokens(8, 2), 16);    // Mixtral
  EXPECT_EQ(min_tokens(60, 4), 60);   // Qwen1.5-MoE-A2.7B: 60 experts, top-4
  EXPECT_EQ(min_tokens(4, 2), 8);
  EXPECT_EQ(min_tokens(2, 2), 5);  // never below the fused down+combine's steps
  EXPECT_EQ(min_tokens(3, 2), 6);  // rounded up
}

// Random benchmark codes: over every byte value, the integer codes' values (code - zero point)
// sum to zero, so random quantized layers add no shared direction to the hidden states.
TEST(MakeRandomCodesUsableTest, IntegerCodesAreSymmetricAboutTheZeroPoint) {
  std::vector<uint8_t> bytes(256);
  for (int b = 0; b < 256; ++b) bytes[b] = static_cast<uint8_t>(b);
  std::vector<uint8_t> int8 = bytes, int4 = bytes;
  MakeRandomCodesUsable(quant::PackedFormat::kInt8, int8);
  MakeRandomCodesUsable(quant::PackedFormat::kInt4, int4);
  int sum8 = 0, sum4 = 0;
  for (int b = 0; b < 256; ++b) {
    sum8 += int8[b] - 128;
    sum4 += (int4[b] & 0x0f) - 8 + (int4[b] >> 4) - 8;
  }
  EXPECT_EQ(sum8, 0);
  EXPECT_EQ(sum4, 0);
}

// The gated GEMV's bf16 output in `out` ([rows, n]) against silu(bf16(gate)) * bf16(up) of the
// host product `want` ([rows, 2n]: gate columns, then up columns).
void ExpectGatedOutput(const DeviceBuffer& out, const std::vector<float>& want, int rows, int n) {
  const std::vector<bf16> act = Download<bf16>(out, int64_t{rows} * n);
  std::vector<float> got_act, want_act;
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < n; ++c) {
      const float g = __bfloat162float(__float2bfloat16(want[int64_t{r} * 2 * n + c]));
      const float u = __bfloat162float(__float2bfloat16(want[int64_t{r} * 2 * n + n + c]));
      want_act.push_back(g / (1.0f + std::exp(-g)) * u);
      got_act.push_back(__bfloat162float(act[int64_t{r} * n + c]));
    }
  }
  EXPECT_LT(RelL2(got_act, want_act), 1e-2);
}

struct RouteCase {
  std::string name;
  RouterOptions options;
  bool correction_bias = false;
};

std::vector<RouteCase> RouteCases() {
  return {
      {"softmax", {.scoring = RouterScoring::kSoftmaxTopK, .num_experts = 128, .top_k = 8}},
      {"softmax_norm",
       {.scoring = RouterScoring::kSoftmaxTopK,
        .num_experts = 60,
        .top_k = 4,
        .norm_topk_prob = true}},
      {"topk_softmax", {.scoring = RouterScoring::kTopKSoftmax, .num_experts = 32, .top_k = 4}},
      {"sigmoid_groups",
       {.scoring = RouterScoring::kSigmoidGroupedTopK,
        .num_experts = 256,
        .top_k = 8,
        .norm_topk_prob = true,
        .n_group = 8,
        .topk_group = 4,
        .routed_scaling_factor = 2.5f},
       true},
      {"sigmoid_one_group",
       {.scoring = RouterScoring::kSigmoidGroupedTopK,
        .num_experts = 128,
        .top_k = 8,
        .norm_topk_prob = true,
        .routed_scaling_factor = 1.0f},
       true},
  };
}

// Every rule, a small step (one-block router) and a large one (three kernels).
TEST(CudaMoeRouteTest, MatchesCpuRouterAndGroupsEveryEntry) {
  RS_SKIP_WITHOUT_GPU();
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (const RouteCase& rc : RouteCases()) {
    for (int tokens : {5, kMoeSmallRouteTokens, 300}) {
      SCOPED_TRACE(::testing::Message() << rc.name << ", " << tokens << " tokens");
      const RouterOptions& o = rc.options;
      ASSERT_TRUE(ValidateRouterOptions(o).ok());
      const int e = o.num_experts, k = o.top_k;
      std::vector<float> logits(tokens * e), bias;
      for (float& x : logits) x = normal(rng);
      if (rc.correction_bias) {
        for (int x = 0; x < e; ++x) bias.push_back(0.1f * normal(rng));
      }
      std::vector<int32_t> want_ids(tokens * k);
      std::vector<float> want_w(tokens * k);
      RouteTokens(o, logits, bias, tokens, want_ids, want_w);

      auto d_logits = Upload(logits);
      auto d_bias = Upload(bias);
      ASSERT_TRUE(d_logits.ok() && d_bias.ok());
      DeviceBuffer ids, w, counts, offsets, row_token, entry_row, tiles, num_tiles, touched, active;
      const int rows = tokens * k;
      const std::vector<std::pair<DeviceBuffer*, int64_t>> sizes = {
          {&ids, rows},      {&w, rows},         {&counts, e},
          {&offsets, e + 1}, {&row_token, rows}, {&entry_row, rows},
          {&num_tiles, 1},   {&touched, 1},      {&tiles, 2 * MoeMaxTiles(rows, e)},
          {&active, e}};
      for (const auto& [buf, n] : sizes) ASSERT_TRUE(buf->Allocate(n * 4).ok());
      const absl::Status launched =
          LaunchMoeRoute(o,
                         {.logits = d_logits->as<float>(),
                          .correction_bias = bias.empty() ? nullptr : d_bias->as<float>(),
                          .expert_ids = ids.as<int32_t>(),
                          .weights = w.as<float>(),
                          .counts = counts.as<int32_t>(),
                          .offsets = offsets.as<int32_t>(),
                          .row_token = row_token.as<int32_t>(),
                          .entry_row = entry_row.as<int32_t>(),
                          .tiles = tiles.as<int32_t>(),
                          .num_tiles = num_tiles.as<int32_t>(),
                          .active = active.as<int32_t>(),
                          .experts_touched = touched.as<int32_t>(),
                          .tokens = tokens},
                         nullptr);
      ASSERT_TRUE(launched.ok()) << launched;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_EQ(Download<int32_t>(ids, rows), want_ids);
      const std::vector<float> got_w = Download<float>(w, rows);
      for (int i = 0; i < rows; ++i) {
        EXPECT_NEAR(got_w[i], want_w[i], 1e-5f * std::max(1.0f, std::abs(want_w[i]))) << i;
      }
      // Grouping: expert e's rows hold exactly the tokens that chose e.
      const auto off = Download<int32_t>(offsets, e + 1);
      const auto tok = Download<int32_t>(row_token, rows);
      const auto at = Download<int32_t>(entry_row, rows);
      int used = 0;
      for (int x = 0; x < e; ++x) used += off[x + 1] > off[x];
      EXPECT_EQ(off[e], rows);
      EXPECT_EQ(Download<int32_t>(touched, 1)[0], used);
      std::vector<int32_t> want_active;
      for (int x = 0; x < e; ++x) {
        if (off[x + 1] > off[x]) want_active.push_back(x);
      }
      want_active.resize(e, -1);
      EXPECT_EQ(Download<int32_t>(active, e), want_active);
      for (int i = 0; i < rows; ++i) {
        const int r = at[i], x = want_ids[i];
        ASSERT_GE(r, off[x]);
        ASSERT_LT(r, off[x + 1]);
        EXPECT_EQ(tok[r], i / k);
      }
      std::vector<int32_t> sorted = at;
      std::sort(sorted.begin(), sorted.end());
      for (int i = 0; i < rows; ++i) ASSERT_EQ(sorted[i], i) << "rows not a permutation";
    }
  }
}

// The grouped projections against a host product on bf16 values: the GEMV (any k, with and
// without activation) and the tensor-core GEMM (k % 8 == 0) over the same random groups.
TEST(CudaMoeGroupedLinearTest, GemvAndGemmMatchHostProduct) {
  RS_SKIP_WITHOUT_GPU();
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  const int groups = 5, tokens = 150, n = 200, k = 136;
  // Group sizes 0, 1, 130 (two tiles), ..., over rows that gather random tokens.
  const std::vector<int32_t> offsets = {0, 0, 1, 131, 140, 300};
  const int rows = offsets.back();
  std::vector<int32_t> row_token(rows);
  for (int& t : row_token) t = static_cast<int>(rng() % tokens);
  const std::vector<float> x = RoundBf16([&] {
    std::vector<float> v(tokens * k);
    for (float& f : v) f = uni(rng);
    return v;
  }());
  const std::vector<float> w = RoundBf16([&] {
    std::vector<float> v(int64_t{groups} * 2 * n * k);
    for (float& f : v) f = 0.1f * uni(rng);
    return v;
  }());
  auto dx = Upload(ToBf16(x));
  auto dw = Upload(ToBf16(w));
  auto doff = Upload(offsets);
  auto dtok = Upload(row_token);
  ASSERT_TRUE(dx.ok() && dw.ok() && doff.ok() && dtok.ok());
  // The tile list as LaunchMoeRoute writes it.
  std::vector<int32_t> tiles;
  for (int g = 0; g < groups; ++g) {
    for (int r = offsets[g]; r < offsets[g + 1]; r += kMoeTileRows) {
      tiles.push_back(g);
      tiles.push_back(r);
    }
  }
  const std::vector<int32_t> num_tiles = {static_cast<int32_t>(tiles.size() / 2)};
  const int max_tiles = static_cast<int>(MoeMaxTiles(rows, groups));
  tiles.resize(2 * max_tiles, 0);
  auto dtiles = Upload(tiles);
  auto dnum = Upload(num_tiles);
  ASSERT_TRUE(dtiles.ok() && dnum.ok());
  DeviceBuffer out;
  ASSERT_TRUE(out.Allocate(int64_t{rows} * 2 * n * 4).ok());

  // Host: y[r, c] = x[tok[r]] . w[g(r), c] over 2n columns.
  std::vector<float> want(int64_t{rows} * 2 * n);
  for (int g = 0; g < groups; ++g) {
    for (int r = offsets[g]; r < offsets[g + 1]; ++r) {
      for (int c = 0; c < 2 * n; ++c) {
        double s = 0;
        for (int i = 0; i < k; ++i) {
          s += double{x[int64_t{row_token[r]} * k + i]} * w[(int64_t{g} * 2 * n + c) * k + i];
        }
        want[int64_t{r} * 2 * n + c] = static_cast<float>(s);
      }
    }
  }
  MoeGroupedLinear a{.x = dx->as<bf16>(),
                     .row_token = dtok->as<int32_t>(),
                     .offsets = doff->as<int32_t>(),
                     .groups = groups,
                     .active = nullptr,
                     .max_active = 0,
                     .w = dw->as<bf16>(),
                     .n = 2 * n,
                     .k = k,
                     .out = out.get(),
                     .out_f32 = true,
                     .act = {}};
  auto dactive = Upload(std::vector<int32_t>{1, 2, 3, 4, -1});  // group 0 has no rows
  ASSERT_TRUE(dactive.ok());
  // Passes: GEMV, GEMV over the active list, then the GEMM with each kernel this device runs
  // (fp32 out, then bf16 out).
  const int passes = WgmmaHere() ? 4 : 3;
  for (int pass = 0; pass < passes; ++pass) {
    const bool gemm = pass >= 2;
    a.gemm_kernel = pass == 3 ? MoeGemmKernel::kWgmmaSm90 : MoeGemmKernel::kWmma;
    SCOPED_TRACE(pass == 3   ? "gemm, wgmma"
                 : gemm      ? "gemm, wmma"
                 : pass == 1 ? "gemv over the active list"
                             : "gemv");
    a.active = pass == 1 ? dactive->as<int32_t>() : nullptr;
    a.max_active = pass == 1 ? 4 : 0;
    for (const bool f32 : {true, false}) {
      if (!f32 && !gemm) continue;
      a.out_f32 = f32;
      ASSERT_EQ(cudaMemset(out.get(), 0, out.bytes()), cudaSuccess);
      const absl::Status s = gemm ? LaunchMoeGroupedGemm(a, dtiles->as<int32_t>(),
                                                         dnum->as<int32_t>(), max_tiles, nullptr)
                                  : LaunchMoeGroupedGemv(a, nullptr);
      ASSERT_TRUE(s.ok()) << s;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      if (f32) {
        EXPECT_LT(RelL2(Download<float>(out, want.size()), want), 1e-5);
      } else {
        EXPECT_LT(RelL2(DownloadBf16(out, want.size()), want), 1e-2) << "bf16 out";
      }
    }
  }
  a.out_f32 = true;
  a.gemm_kernel = MoeGemmKernel::kWmma;
  // The gated GEMV: silu(bf16(gate)) * bf16(up) over n columns, bf16 out.
  a.active = nullptr;
  a.max_active = 0;
  a.n = n;
  a.out_f32 = false;
  a.act = {.kind = MoeActivation::kSiluMul};
  ASSERT_TRUE(LaunchMoeGroupedGemv(a, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ExpectGatedOutput(out, want, rows, n);
}

// Quantized expert weights [groups * 2n, k] (random, QuantizeMatrix's rule) in each format:
// LaunchMoeQuantGroupedGemv (plain, over the active list, gated) against the host product on the
// dequantized values, and LaunchMoeGroupedGemm over two group ranges dequantized on the device
// (QuantRowSlice + LaunchQuantDequantize, as CudaMoeLayer's larger steps run).
class CudaMoeQuantGroupedTest : public ::testing::TestWithParam<quant::PackedFormat> {};

TEST_P(CudaMoeQuantGroupedTest, GemvAndRangeGemmMatchHostProduct) {
  RS_SKIP_WITHOUT_GPU();
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  const int groups = 5, tokens = 40, n = 48, k = 160, group_cols = 32;
  const std::vector<int32_t> offsets = {0, 0, 3, 19, 21, 30};
  const int rows = offsets.back();
  std::vector<int32_t> row_token(rows);
  for (int& t : row_token) t = static_cast<int>(rng() % tokens);
  std::vector<float> x(tokens * k);
  for (float& f : x) f = uni(rng);
  x = RoundBf16(x);
  std::vector<float> w(int64_t{groups} * 2 * n * k);
  for (float& f : w) f = 0.1f * uni(rng);
  const quant::PackedMatrix packed =
      quant::QuantizeMatrix(w, groups * 2 * n, k, GetParam(), group_cols);
  const std::vector<float> wq = quant::UnpackMatrix(packed);  // the values the kernels must use
  auto dx = Upload(ToBf16(x));
  auto dcodes = Upload(packed.codes);
  auto dscales = Upload(DeviceScales(packed));
  auto doff = Upload(offsets);
  auto dtok = Upload(row_token);
  ASSERT_TRUE(dx.ok() && dcodes.ok() && dscales.ok() && doff.ok() && dtok.ok());
  const QuantMatrixView view{.format = static_cast<QuantFormat>(GetParam()),
                             .rows = groups * 2 * n,
                             .cols = k,
                             .group_cols = group_cols,
                             .codes = dcodes->as<uint8_t>(),
                             .scales = dscales->as<float>()};
  std::vector<float> want(int64_t{rows} * 2 * n);  // fp32 host product, 2n columns
  for (int g = 0; g < groups; ++g) {
    for (int r = offsets[g]; r < offsets[g + 1]; ++r) {
      for (int c = 0; c < 2 * n; ++c) {
        double sum = 0;
        for (int i = 0; i < k; ++i) {
          sum += double{x[int64_t{row_token[r]} * k + i]} * wq[(int64_t{g} * 2 * n + c) * k + i];
        }
        want[int64_t{r} * 2 * n + c] = static_cast<float>(sum);
      }
    }
  }
  DeviceBuffer out;
  ASSERT_TRUE(out.Allocate(int64_t{rows} * 2 * n * 4).ok());
  auto dactive = Upload(std::vector<int32_t>{1, 2, 3, 4, -1});  // group 0 has no rows
  ASSERT_TRUE(dactive.ok());
  MoeGroupedLinear a{.x = dx->as<bf16>(),
                     .row_token = dtok->as<int32_t>(),
                     .offsets = doff->as<int32_t>(),
                     .groups = groups,
                     .n = 2 * n,
                     .k = k,
                     .out = out.get(),
                     .out_f32 = true};
  for (const bool over_active : {false, true}) {
    SCOPED_TRACE(over_active ? "gemv over the active list" : "gemv");
    a.active = over_active ? dactive->as<int32_t>() : nullptr;
    a.max_active = over_active ? 4 : 0;
    ASSERT_EQ(cudaMemset(out.get(), 0, out.bytes()), cudaSuccess);
    const absl::Status s = LaunchMoeQuantGroupedGemv(a, view, nullptr);
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_LT(RelL2(Download<float>(out, want.size()), want), 1e-5);
  }
  // The grouped GEMM on ranges [0, 2) and [2, 5) of bf16 weights dequantized on the device.
  std::vector<int32_t> tiles;
  for (int g = 0; g < groups; ++g) {
    for (int r = offsets[g]; r < offsets[g + 1]; r += kMoeTileRows)
      tiles.insert(tiles.end(), {g, r});
  }
  const std::vector<int32_t> num_tiles = {static_cast<int32_t>(tiles.size() / 2)};
  const int max_tiles = static_cast<int>(MoeMaxTiles(rows, groups));
  tiles.resize(2 * max_tiles, 0);
  auto dtiles = Upload(tiles);
  auto dnum = Upload(num_tiles);
  DeviceBuffer scratch;
  ASSERT_TRUE(dtiles.ok() && dnum.ok() && scratch.Allocate(int64_t{3} * 2 * n * k * 2).ok());
  a.active = nullptr;
  a.max_active = 0;
  ASSERT_EQ(cudaMemset(out.get(), 0, out.bytes()), cudaSuccess);
  for (const auto& [begin, end] : {std::pair{0, 2}, std::pair{2, 5}}) {
    ASSERT_TRUE(
        LaunchQuantDequantize(QuantRowSlice(view, int64_t{begin} * 2 * n, (end - begin) * 2 * n),
                              scratch.as<bf16>(), nullptr)
            .ok());
    a.w = scratch.as<bf16>();
    a.group_begin = begin;
    a.group_end = end;
    ASSERT_TRUE(
        LaunchMoeGroupedGemm(a, dtiles->as<int32_t>(), dnum->as<int32_t>(), max_tiles, nullptr)
            .ok());
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // The GEMM reads the weights rounded to bf16 once.
  EXPECT_LT(RelL2(Download<float>(out, want.size()), want), 1e-2);
  // The gated GEMV: silu(bf16(gate)) * bf16(up) over n columns, bf16 out.
  a.w = nullptr;
  a.group_begin = 0;
  a.group_end = -1;
  a.n = n;
  a.out_f32 = false;
  a.act = {.kind = MoeActivation::kSiluMul};
  ASSERT_TRUE(LaunchMoeQuantGroupedGemv(a, view, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ExpectGatedOutput(out, want, rows, n);
  // A weight stack of the wrong height is refused.
  QuantMatrixView short_view = view;
  short_view.rows -= 2 * n;
  EXPECT_FALSE(LaunchMoeQuantGroupedGemv(a, short_view, nullptr).ok());
}

INSTANTIATE_TEST_SUITE_P(Formats, CudaMoeQuantGroupedTest,
                         ::testing::Values(quant::PackedFormat::kInt4, quant::PackedFormat::kInt8,
                                           quant::PackedFormat::kFp8, quant::PackedFormat::kFp4),
                         [](const ::testing::TestParamInfo<quant::PackedFormat>& info) {
                           return std::string(quant::PackedFormatName(info.param));
                         });

// The block of each fixture's first MoE layer on random rows, through the fused decode kernels
// (1 and 3 tokens: router logits and routing in one kernel, down projection and combine in
// one), the GEMV (8 tokens) and the tensor-core GEMM (40 tokens; 100 with the router on tensor
// cores too) paths, against
// CpuMoeForward on the same bf16 values.
class CudaMoeBlockTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaMoeBlockTest, MatchesCpuMoeForward) {
  RS_SKIP_WITHOUT_GPU();
  const char* root = std::getenv("RINGSERVE_SOURCE_DIR");
  const std::string dir = std::string(root ? root : ".") + "/tests/fixtures/models/" + GetParam();
  auto config = LoadModelConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  int layer = 0;
  while (!config->moe.IsMoeLayer(layer)) ++layer;
  auto weights = SafetensorsModel::Open(dir);
  ASSERT_TRUE(weights.ok()) << weights.status();
  auto cpu = LoadCpuMoeLayer(*config, layer, **weights, quant::QuantConfig{});
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto gpu = CudaMoeLayer::Create(*config);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  std::vector<DeviceBuffer> keep;
  const CudaMoeLayer::UploadFn upload = [&](const TensorSpec& spec, bf16* dst) -> absl::Status {
    RS_ASSIGN_OR_RETURN(std::vector<float> v, (*weights)->ReadFloat(spec.name, spec.shape));
    const std::vector<bf16> b = ToBf16(v);
    RS_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(dst, b.data(), b.size() * sizeof(bf16), cudaMemcpyHostToDevice));
    return absl::OkStatus();
  };
  ASSERT_TRUE((*gpu)->Load(*config, layer, **weights, upload, nullptr).ok());
  // The CPU reference on the GPU's bf16 weights.
  auto round_expert = [](CpuExpert& e) {
    for (auto* v : {&e.gate, &e.up, &e.down, &e.gate_bias, &e.up_bias, &e.down_bias}) {
      *v = RoundBf16(*v);
    }
  };
  for (CpuExpert& e : cpu->experts) round_expert(e);
  round_expert(cpu->shared);

  const int h = config->hidden_size;
  auto ws = CudaMoeWorkspace::Create(config->moe, h, 128, 1);
  ASSERT_TRUE(ws.ok()) << ws.status();
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // Above kMoeSmallRouteTokens tokens the router runs on bf16 copies of its weights.
  CpuMoeLayer cpu_bf16_router = *cpu;
  cpu_bf16_router.router = RoundBf16(cpu_bf16_router.router);
  cpu_bf16_router.router_bias = RoundBf16(cpu_bf16_router.router_bias);
  for (int tokens : {1, 3, 8, 40, 100}) {
    SCOPED_TRACE(::testing::Message() << tokens << " tokens");
    std::vector<float> x(tokens * h);
    for (float& v : x) v = normal(rng);
    x = RoundBf16(x);
    std::vector<float> want(tokens * h);
    CpuMoeForward(config->moe, h, tokens > kMoeSmallRouteTokens ? cpu_bf16_router : *cpu, x.data(),
                  tokens, want.data());
    auto dx = Upload(ToBf16(x));
    ASSERT_TRUE(dx.ok());
    // Both outputs: bf16 rows, and added into an fp32 residual of ones.
    DeviceBuffer out;
    ASSERT_TRUE(out.Allocate(tokens * h * 2).ok());
    ASSERT_TRUE(
        (*gpu)->Forward(dx->as<bf16>(), tokens, nullptr, out.as<bf16>(), **ws, 0, nullptr).ok());
    auto residual = Upload(std::vector<float>(tokens * h, 1.0f));
    ASSERT_TRUE(residual.ok());
    ASSERT_TRUE(
        (*gpu)
            ->Forward(dx->as<bf16>(), tokens, residual->as<float>(), nullptr, **ws, -1, nullptr)
            .ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> got;
    for (bf16 v : Download<bf16>(out, tokens * h)) got.push_back(__bfloat162float(v));
    EXPECT_LT(RelL2(got, want), 1e-2);
    std::vector<float> added = Download<float>(*residual, tokens * h);
    for (float& v : added) v -= 1.0f;
    EXPECT_LT(RelL2(added, want), 1e-2);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaMoeBlockTest,
                         ::testing::Values("qwen3_moe", "qwen2_moe", "mixtral", "glm4_moe",
                                           "gpt_oss"));

}  // namespace
}  // namespace ringserve::cuda
