// The fused decode-step MoE kernels against the launches they replace, bit for bit:
// LaunchMoeRouterLogitsAndRoute against LaunchMoeRouterLogits + LaunchMoeRoute (every scoring
// rule, 1 to kMoeFusedRouteTokens tokens, its ticket left at 0 so that a second launch routes
// again), and LaunchMoeDownCombine against LaunchMoeGroupedGemv (or LaunchMoeQuantGroupedGemv,
// every format) + LaunchMoeCombine (biases or not, a shared expert's output or not, into a
// residual or as bf16 rows); and the grouped GEMVs' row chunk (1, 4 or 8 rows per pass) changes
// no bit of their output; and the tensor-core grouped GEMV against the CUDA-core one.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/test_util.h"

namespace ringserve::cuda {
namespace {

using testing::Download;
using testing::DownloadBf16;
using testing::RandomBf16Values;
using testing::Upload;
using testing::UploadBf16;

// Device buffers of one step's routing (MoeRouting's outputs) for `tokens` x `top_k` entries.
struct RoutingBuffers {
  RoutingBuffers(int tokens, int experts, int top_k) {
    const int rows = tokens * top_k;
    const std::vector<std::pair<DeviceBuffer*, int64_t>> sizes = {
        {&logits, tokens * experts},
        {&ids, rows},
        {&weights, rows},
        {&counts, experts},
        {&offsets, experts + 1},
        {&row_token, rows},
        {&entry_row, rows},
        {&tiles, 2 * MoeMaxTiles(rows, experts)},
        {&num_tiles, 1},
        {&active, experts},
        {&touched, 1}};
    for (const auto& [buf, n] : sizes) {
      EXPECT_TRUE(buf->Allocate(n * 4).ok());
      EXPECT_EQ(cudaMemset(buf->get(), 0xff, buf->bytes()), cudaSuccess);
    }
  }
  MoeRouting View(int tokens, const float* correction_bias) {
    return {.logits = logits.as<float>(),
            .correction_bias = correction_bias,
            .expert_ids = ids.as<int32_t>(),
            .weights = weights.as<float>(),
            .counts = counts.as<int32_t>(),
            .offsets = offsets.as<int32_t>(),
            .row_token = row_token.as<int32_t>(),
            .entry_row = entry_row.as<int32_t>(),
            .tiles = tiles.as<int32_t>(),
            .num_tiles = num_tiles.as<int32_t>(),
            .active = active.as<int32_t>(),
            .experts_touched = touched.as<int32_t>(),
            .tokens = tokens};
  }
  DeviceBuffer logits, ids, weights, counts, offsets, row_token, entry_row, tiles, num_tiles,
      active, touched;
};

// Routes `tokens` tokens of random logits into r (LaunchMoeRoute).
void RouteRandomLogits(std::mt19937& rng, const RouterOptions& o, int tokens, RoutingBuffers& r) {
  DeviceBuffer logits = Upload(RandomBf16Values(rng, int64_t{tokens} * o.num_experts, 2.0f));
  ASSERT_EQ(cudaMemcpy(r.logits.get(), logits.get(), int64_t{tokens} * o.num_experts * 4,
                       cudaMemcpyDeviceToDevice),
            cudaSuccess);
  RS_ASSERT_OK(LaunchMoeRoute(o, r.View(tokens, nullptr), nullptr));
}

template <typename T>
void ExpectSameBits(const DeviceBuffer& a, const DeviceBuffer& b, int n, const char* what) {
  const std::vector<T> x = Download<T>(a, n), y = Download<T>(b, n);
  EXPECT_EQ(0, std::memcmp(x.data(), y.data(), n * sizeof(T))) << what;
}

TEST(CudaMoeFusedRouteTest, MatchesLogitsThenRouteBitForBit) {
  RS_SKIP_WITHOUT_GPU();
  std::mt19937 rng(7);
  const int hidden = 256;
  const std::vector<RouterOptions> cases = {
      {.scoring = RouterScoring::kSoftmaxTopK,
       .num_experts = 128,
       .top_k = 8,
       .norm_topk_prob = true},
      {.scoring = RouterScoring::kSoftmaxTopK, .num_experts = 60, .top_k = 4},
      {.scoring = RouterScoring::kTopKSoftmax, .num_experts = 32, .top_k = 4},
      {.scoring = RouterScoring::kSigmoidGroupedTopK,
       .num_experts = 256,
       .top_k = 8,
       .norm_topk_prob = true,
       .n_group = 8,
       .topk_group = 4,
       .routed_scaling_factor = 2.5f},
      {.scoring = RouterScoring::kSoftmaxTopK, .num_experts = 512, .top_k = 10},
  };
  for (const RouterOptions& o : cases) {
    for (int tokens : {1, 3, kMoeFusedRouteTokens}) {
      SCOPED_TRACE(::testing::Message() << o.num_experts << " experts, " << tokens << " tokens");
      const int e = o.num_experts, rows = tokens * o.top_k;
      DeviceBuffer x = UploadBf16(RandomBf16Values(rng, int64_t{tokens} * hidden));
      DeviceBuffer router = Upload(RandomBf16Values(rng, int64_t{e} * hidden, 0.3f));
      DeviceBuffer bias = Upload(RandomBf16Values(rng, e, 0.1f));
      DeviceBuffer correction = Upload(RandomBf16Values(rng, e, 0.1f));
      const float* cb =
          o.scoring == RouterScoring::kSigmoidGroupedTopK ? correction.as<float>() : nullptr;
      RoutingBuffers two(tokens, e, o.top_k), one(tokens, e, o.top_k);
      RS_ASSERT_OK(LaunchMoeRouterLogits(x.as<bf16>(), router.as<float>(), bias.as<float>(),
                                         two.logits.as<float>(), tokens, e, hidden, nullptr));
      RS_ASSERT_OK(LaunchMoeRoute(o, two.View(tokens, cb), nullptr));
      DeviceBuffer ticket = Upload(std::vector<int32_t>{0});
      for (int launch = 0; launch < 2; ++launch) {
        RS_ASSERT_OK(LaunchMoeRouterLogitsAndRoute(
            x.as<bf16>(), router.as<float>(), bias.as<float>(), hidden, o, one.View(tokens, cb),
            ticket.as<int32_t>(), nullptr));
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_EQ(Download<int32_t>(ticket, 1)[0], 0) << "ticket left set";
      }
      ExpectSameBits<float>(one.logits, two.logits, tokens * e, "logits");
      ExpectSameBits<int32_t>(one.ids, two.ids, rows, "expert ids");
      ExpectSameBits<float>(one.weights, two.weights, rows, "weights");
      ExpectSameBits<int32_t>(one.offsets, two.offsets, e + 1, "offsets");
      ExpectSameBits<int32_t>(one.active, two.active, e, "active");
      ExpectSameBits<int32_t>(one.touched, two.touched, 1, "touched");
      // Rows within an expert are in atomic order: compare the row sets through row_token.
      const auto entry = Download<int32_t>(one.entry_row, rows);
      const auto token = Download<int32_t>(one.row_token, rows);
      for (int i = 0; i < rows; ++i) EXPECT_EQ(token[entry[i]], i / o.top_k) << i;
    }
  }
  RoutingBuffers r(9, 16, 2);
  DeviceBuffer ticket = Upload(std::vector<int32_t>{0});
  EXPECT_FALSE(LaunchMoeRouterLogitsAndRoute(nullptr, nullptr, nullptr, 256,
                                             {.num_experts = 16, .top_k = 2}, r.View(9, nullptr),
                                             ticket.as<int32_t>(), nullptr)
                   .ok());
}

// Random quantized weights [rows, cols] in `format`, groups of 32 columns (codes as drawn, e4m3
// NaN codes cleared; integer zero points mid-range).
struct RandomQuantWeights {
  RandomQuantWeights(std::mt19937& rng, QuantFormat format, int rows, int cols) {
    const bool four_bit = format == QuantFormat::kInt4 || format == QuantFormat::kFp4;
    const bool integer = format == QuantFormat::kInt4 || format == QuantFormat::kInt8;
    std::vector<uint8_t> c(int64_t{rows} * cols / (four_bit ? 2 : 1));
    for (uint8_t& b : c) {
      b = static_cast<uint8_t>(rng());
      if (format == QuantFormat::kFp8 && (b & 0x7f) == 0x7f) b = 0;
    }
    std::uniform_real_distribution<float> scale(0.001f, 0.02f);
    std::vector<float> s;
    for (int i = 0; i < rows * (cols / 32); ++i) {
      s.push_back(scale(rng));
      if (integer) s.push_back(format == QuantFormat::kInt4 ? 8.0f : 128.0f);
    }
    codes = Upload(c);
    scales = Upload(s);
    view = {.format = format,
            .rows = rows,
            .cols = cols,
            .group_cols = 32,
            .codes = codes.as<uint8_t>(),
            .scales = scales.as<float>()};
  }
  DeviceBuffer codes, scales;
  QuantMatrixView view;
};

TEST(CudaMoeDownCombineTest, MatchesGroupedGemvThenCombineBitForBit) {
  RS_SKIP_WITHOUT_GPU();
  std::mt19937 rng(11);
  const int experts = 16, top_k = 6, n = 97, k = 96;
  const RouterOptions o{.num_experts = experts, .top_k = top_k, .norm_topk_prob = true};
  DeviceBuffer w = UploadBf16(RandomBf16Values(rng, int64_t{experts} * n * k, 0.2f));
  DeviceBuffer bias = UploadBf16(RandomBf16Values(rng, int64_t{experts} * n, 0.2f));
  // -1: bf16 weights; else QuantFormat.
  for (int format = -1; format <= static_cast<int>(QuantFormat::kFp4); ++format) {
    const std::optional<RandomQuantWeights> q =
        format < 0 ? std::nullopt
                   : std::optional<RandomQuantWeights>(
                         std::in_place, rng, static_cast<QuantFormat>(format), experts * n, k);
    for (int tokens = 1; tokens <= kMoeDownCombineTokens; ++tokens) {
      const int rows = tokens * top_k;
      RoutingBuffers r(tokens, experts, top_k);
      ASSERT_NO_FATAL_FAILURE(RouteRandomLogits(rng, o, tokens, r));
      DeviceBuffer act = UploadBf16(RandomBf16Values(rng, int64_t{rows} * k));
      DeviceBuffer shared = UploadBf16(RandomBf16Values(rng, int64_t{tokens} * n));
      const std::vector<float> start = RandomBf16Values(rng, int64_t{tokens} * n);
      for (int variant = 0; variant < 4; ++variant) {
        const bool with_bias = variant & 1, to_residual = variant & 2;
        SCOPED_TRACE(::testing::Message()
                     << "format " << format << ", " << tokens << " tokens, variant " << variant);
        DeviceBuffer expert_out, out_two, out_one;
        ASSERT_TRUE(expert_out.Allocate(int64_t{rows} * n * 2).ok());
        ASSERT_TRUE(out_two.Allocate(int64_t{tokens} * n * 2).ok());
        ASSERT_TRUE(out_one.Allocate(int64_t{tokens} * n * 2).ok());
        DeviceBuffer res_two = Upload(start), res_one = Upload(start);
        const bf16* b = with_bias ? bias.as<bf16>() : nullptr;
        const bf16* so = with_bias ? nullptr : shared.as<bf16>();
        const MoeGroupedLinear down{.x = act.as<bf16>(),
                                    .offsets = r.offsets.as<int32_t>(),
                                    .rows = rows,
                                    .groups = experts,
                                    .w = q ? nullptr : w.as<bf16>(),
                                    .bias = b,
                                    .n = n,
                                    .k = k,
                                    .out = expert_out.get()};
        RS_ASSERT_OK(q ? LaunchMoeQuantGroupedGemv(down, q->view, nullptr)
                       : LaunchMoeGroupedGemv(down, nullptr));
        {  // The GEMVs' row chunk (MoeGemvRowChunk of the step's tokens) changes no bit.
          DeviceBuffer chunked;
          ASSERT_TRUE(chunked.Allocate(expert_out.bytes()).ok());
          MoeGroupedLinear by_tokens = down;
          by_tokens.max_group_rows = tokens;
          by_tokens.out = chunked.get();
          RS_ASSERT_OK(q ? LaunchMoeQuantGroupedGemv(by_tokens, q->view, nullptr)
                         : LaunchMoeGroupedGemv(by_tokens, nullptr));
          ExpectSameBits<uint16_t>(chunked, expert_out, rows * n, "row chunk");
        }
        RS_ASSERT_OK(LaunchMoeCombine({.weights = r.weights.as<float>(),
                                       .entry_row = r.entry_row.as<int32_t>(),
                                       .expert_out = expert_out.as<bf16>(),
                                       .shared_out = so,
                                       .residual = to_residual ? res_two.as<float>() : nullptr,
                                       .out = to_residual ? nullptr : out_two.as<bf16>(),
                                       .tokens = tokens,
                                       .top_k = top_k,
                                       .hidden = n},
                                      nullptr));
        RS_ASSERT_OK(LaunchMoeDownCombine({.act = act.as<bf16>(),
                                           .expert_ids = r.ids.as<int32_t>(),
                                           .weights = r.weights.as<float>(),
                                           .entry_row = r.entry_row.as<int32_t>(),
                                           .w = q ? nullptr : w.as<bf16>(),
                                           .quant = q ? &q->view : nullptr,
                                           .bias = b,
                                           .n = n,
                                           .k = k,
                                           .shared_out = so,
                                           .residual = to_residual ? res_one.as<float>() : nullptr,
                                           .out = to_residual ? nullptr : out_one.as<bf16>(),
                                           .tokens = tokens,
                                           .top_k = top_k},
                                          nullptr));
        if (to_residual) {
          ExpectSameBits<float>(res_one, res_two, tokens * n, "residual");
          EXPECT_NE(Download<float>(res_one, tokens * n), start) << "nothing added";
        } else {
          ExpectSameBits<uint16_t>(out_one, out_two, tokens * n, "bf16 rows");
        }
      }
    }
  }
  EXPECT_FALSE(LaunchMoeDownCombine({.n = 8, .k = 12, .out = nullptr, .top_k = 2}, nullptr).ok());
}

// LaunchMoeGroupedMma against LaunchMoeGroupedGemv: the same sums in another order. Partial
// column tiles (n = 97), 1 to 4 row tiles per pass and several passes (groups of more than 32
// rows at 100 tokens), gathered rows through the active list, biases, gated or not.
TEST(CudaMoeGroupedMmaTest, MatchesGroupedGemv) {
  RS_SKIP_WITHOUT_GPU();
  std::mt19937 rng(5);
  const int experts = 6, top_k = 2, n = 97, k = 96;
  const RouterOptions o{.num_experts = experts, .top_k = top_k, .norm_topk_prob = true};
  DeviceBuffer w = UploadBf16(RandomBf16Values(rng, int64_t{experts} * 2 * n * k, 0.2f));
  DeviceBuffer bias = UploadBf16(RandomBf16Values(rng, int64_t{experts} * 2 * n, 0.2f));
  for (const int tokens : {1, 5, 12, 24, 100}) {
    const int rows = tokens * top_k;
    RoutingBuffers r(tokens, experts, top_k);
    ASSERT_NO_FATAL_FAILURE(RouteRandomLogits(rng, o, tokens, r));
    DeviceBuffer x = UploadBf16(RandomBf16Values(rng, int64_t{tokens} * k));
    for (int variant = 0; variant < 4; ++variant) {
      const bool gated = variant & 1, with_bias = variant & 2;
      SCOPED_TRACE(::testing::Message() << tokens << " tokens, variant " << variant);
      MoeGroupedLinear a{.x = x.as<bf16>(),
                         .row_token = r.row_token.as<int32_t>(),
                         .offsets = r.offsets.as<int32_t>(),
                         .rows = rows,
                         .groups = experts,
                         .active = r.active.as<int32_t>(),
                         .max_active = rows,
                         .w = w.as<bf16>(),
                         .bias = with_bias ? bias.as<bf16>() : nullptr,
                         .n = n,
                         .k = k,
                         .out_f32 = !gated,
                         .max_group_rows = tokens};
      if (gated) a.act = {.kind = MoeActivation::kSiluMul};
      ASSERT_TRUE(MoeGroupedMmaSupported(a));
      DeviceBuffer by_gemv, by_mma;
      for (DeviceBuffer* out : {&by_gemv, &by_mma}) {  // NaN until written
        ASSERT_TRUE(out->Allocate(int64_t{rows} * n * 4).ok());
        ASSERT_EQ(cudaMemset(out->get(), 0xff, out->bytes()), cudaSuccess);
      }
      a.out = by_gemv.get();
      RS_ASSERT_OK(LaunchMoeGroupedGemv(a, nullptr));
      a.out = by_mma.get();
      RS_ASSERT_OK(LaunchMoeGroupedMma(a, nullptr));
      std::vector<float> want, got;
      if (gated) {
        want = DownloadBf16(by_gemv, int64_t{rows} * n);
        got = DownloadBf16(by_mma, int64_t{rows} * n);
      } else {
        want = Download<float>(by_gemv, int64_t{rows} * n);
        got = Download<float>(by_mma, int64_t{rows} * n);
      }
      // fp32 sums in another order; gated, the gate and up values are rounded to bf16 first,
      // where one ulp (2^-8) can flip.
      const float rel = gated ? 0.02f : 1e-5f, abs = gated ? 0.01f : 1e-4f;
      int bad = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        if (!std::isfinite(got[i]) ||
            !(std::fabs(got[i] - want[i]) <= abs + rel * std::fabs(want[i]))) {
          if (++bad <= 5) ADD_FAILURE() << "element " << i << ": " << got[i] << " vs " << want[i];
        }
      }
      EXPECT_EQ(bad, 0);
    }
  }
  MoeGroupedLinear odd{.x = nullptr, .w = nullptr, .n = 8, .k = 40};
  EXPECT_FALSE(MoeGroupedMmaSupported(odd));
}

}  // namespace
}  // namespace ringserve::cuda
