// Every CUDA op against the CPU reference (kernels/cpu) on fresh random inputs. Inputs are
// bf16-representable so both sides see the same values; tolerances are relative L2 errors:
// bf16 outputs 1e-2 (one bf16 rounding is ~4e-3), fp32 outputs 1e-4.
#include "kernels/cpu/ops.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <random>

#include "gtest/gtest.h"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/graph_edges.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/test_util.h"
#include "stage/sampling/sampler.h"

namespace ringserve::cuda {
namespace {

using testing::Download;
using testing::DownloadBf16;
using testing::Poison;
using testing::RandomBf16Values;
using testing::RelL2;
using testing::Upload;
using testing::UploadBf16;

constexpr double kBf16Tol = 1e-2;
constexpr double kF32Tol = 1e-4;

// Random bf16-representable x [m, k] and w [n, k], and the CPU's x . w^T.
struct MatMulCase {
  std::vector<float> x, w, want;
};
MatMulCase RandomMatMul(std::mt19937& rng, int m, int n, int k) {
  MatMulCase c{RandomBf16Values(rng, static_cast<size_t>(m) * k),
               RandomBf16Values(rng, static_cast<size_t>(n) * k, 0.05f),
               std::vector<float>(static_cast<size_t>(m) * n)};
  cpu::MatMul(c.x.data(), c.w.data(), nullptr, m, k, n, c.want.data());
  return c;
}

TEST(CudaGemmTest, MatchesCpuMatMulForDecodeAndPrefillShapes) {
  RS_SKIP_WITHOUT_GPU();
  auto runner_or = GemmRunner::Create();
  ASSERT_TRUE(runner_or.ok()) << runner_or.status();
  GemmRunner& runner = **runner_or;
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const int n = 200, k = 2120;  // 265 16-byte vectors per row: the GEMV loop runs 3 times
  for (int m : {1, 2, 3, 4, 7, 8, 33, 130}) {
    SCOPED_TRACE(::testing::Message() << "m " << m);
    const auto [x, w, want] = RandomMatMul(rng, m, n, k);
    DeviceBuffer dx = UploadBf16(x), dw = UploadBf16(w);
    DeviceBuffer dy_bf16, dy_f32;
    ASSERT_TRUE(dy_bf16.Allocate(want.size() * 2).ok());
    ASSERT_TRUE(dy_f32.Allocate(want.size() * 4).ok());
    // Both paths: our GEMV (small m) and cuBLASLt.
    for (int path = 0; path < 2; ++path) {
      if (path == 0 && m > kGemvMaxRows) continue;
      Poison(dy_bf16);
      Poison(dy_f32);
      auto run = [&](void* y, OutType out) {
        return path == 0
                   ? LaunchGemv(dx.as<bf16>(), dw.as<bf16>(), y, out, m, n, k, nullptr)
                   : runner.LinearCublas(dx.as<bf16>(), dw.as<bf16>(), y, out, m, n, k, nullptr);
      };
      RS_ASSERT_OK(run(dy_bf16.get(), OutType::kBF16));
      RS_ASSERT_OK(run(dy_f32.get(), OutType::kF32));
      EXPECT_LT(RelL2(DownloadBf16(dy_bf16, want.size()), want), kBf16Tol) << "path " << path;
      EXPECT_LT(RelL2(Download<float>(dy_f32, want.size()), want), kF32Tol) << "path " << path;
    }
  }
}

// Tuning picks among cuBLASLt's candidates, the GEMV and (asked for) the skinny GEMM by timing
// them; whatever it picks must compute the same product, and the plan says it was tuned. A
// capturing stream is refused.
TEST(CudaGemmTest, TunedPlansMatchCpuAndTuningRefusesCapture) {
  RS_SKIP_WITHOUT_GPU();
  auto runner_or =
      GemmRunner::Create({.gemv_max_rows = kGemvMaxRows, .skinny_max_rows = kSkinnyMaxRows});
  ASSERT_TRUE(runner_or.ok()) << runner_or.status();
  GemmRunner& runner = **runner_or;
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const int n = 200, k = 2120;  // 265 16-byte vectors per row: the GEMV loop runs 3 times
  for (int m : {1, 5, 32, 64}) {
    SCOPED_TRACE(::testing::Message() << "m " << m);
    const auto [x, w, want] = RandomMatMul(rng, m, n, k);
    DeviceBuffer dx = UploadBf16(x), dw = UploadBf16(w), dy;
    ASSERT_TRUE(dy.Allocate(want.size() * 4).ok());
    EXPECT_EQ(runner.PlanSummary(m, n, k, OutType::kF32), "none");
    RS_ASSERT_OK(
        runner.Tune(dx.as<bf16>(), dw.as<bf16>(), dy.get(), OutType::kF32, m, n, k, nullptr));
    EXPECT_NE(runner.PlanSummary(m, n, k, OutType::kF32).find("(tuned)"), std::string::npos);
    for (bool cublas : {false, true}) {
      Poison(dy);
      RS_ASSERT_OK(cublas ? runner.LinearCublas(dx.as<bf16>(), dw.as<bf16>(), dy.get(),
                                                OutType::kF32, m, n, k, nullptr)
                          : runner.Linear(dx.as<bf16>(), dw.as<bf16>(), dy.get(), OutType::kF32, m,
                                          n, k, nullptr));
      EXPECT_LT(RelL2(Download<float>(dy, want.size()), want), kF32Tol) << "cublas " << cublas;
    }
  }
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  DeviceBuffer scratch;
  ASSERT_TRUE(scratch.Allocate(1 << 20).ok());
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const absl::Status refused = runner.Tune(scratch.as<bf16>(), scratch.as<bf16>(), scratch.get(),
                                           OutType::kF32, 2, 64, 64, stream);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  if (graph) cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  // New options drop the tuned plans; bad ones are refused.
  RS_ASSERT_OK(runner.Reconfigure({.gemv_max_rows = 1}));
  EXPECT_EQ(runner.PlanSummary(1, n, k, OutType::kF32), "none");
  EXPECT_EQ(runner.options().skinny_max_rows, 0);
  EXPECT_EQ(runner.Reconfigure({.gemv_max_rows = kGemvMaxRows + 1}).code(),
            absl::StatusCode::kInvalidArgument);
}

// The skinny tensor-core GEMM at every token-tile size and over grids that cut the work list
// differently: n = 584 is 5 row blocks (the last 72 rows), k = 2120 is 34 stages (the last of 8
// values), 170 work items. 1 block: all whole row blocks; 2 (85 items a block): whole row blocks
// and one shared; 3 (57): a block with a shared head, a whole row block and a shared tail; 5
// (34): every block one row block; 7 (25); 170 and 1000 (one item a block): 34 sharers a row
// block. A second launch must give the same bits (the counters were left at zero).
TEST(CudaGemmTest, SkinnyGemmMatchesCpuForEveryGrid) {
  RS_SKIP_WITHOUT_GPU();
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const int n = 584, k = 2120;
  DeviceBuffer ws_buffer;
  SkinnyWorkspace ws;
  RS_ASSERT_OK(AllocateSkinnyWorkspace(size_t{16} << 20, &ws_buffer, &ws));
  for (int m : {1, 8, 9, 31, 33, 64}) {
    const auto [x, w, want] = RandomMatMul(rng, m, n, k);
    DeviceBuffer dx = UploadBf16(x), dw = UploadBf16(w), dy_bf16, dy_f32;
    ASSERT_TRUE(dy_bf16.Allocate(want.size() * 2).ok());
    ASSERT_TRUE(dy_f32.Allocate(want.size() * 4).ok());
    for (int blocks : {1, 2, 3, 5, 7, 170, 1000}) {
      SCOPED_TRACE(::testing::Message() << "m " << m << " blocks " << blocks);
      auto run = [&](DeviceBuffer& y, OutType out) {
        Poison(y);
        return LaunchSkinnyGemm(dx.as<bf16>(), dw.as<bf16>(), y.get(), out, m, n, k, blocks, ws,
                                nullptr);
      };
      RS_ASSERT_OK(run(dy_f32, OutType::kF32));
      const std::vector<float> first = Download<float>(dy_f32, want.size());
      EXPECT_LT(RelL2(first, want), kF32Tol);
      RS_ASSERT_OK(run(dy_f32, OutType::kF32));
      EXPECT_EQ(Download<float>(dy_f32, want.size()), first);
      RS_ASSERT_OK(run(dy_bf16, OutType::kBF16));
      EXPECT_LT(RelL2(DownloadBf16(dy_bf16, want.size()), want), kBf16Tol);
    }
  }
  const auto refused = [&](int m, int k_arg, int blocks, const SkinnyWorkspace& space) {
    return LaunchSkinnyGemm(nullptr, nullptr, nullptr, OutType::kF32, m, n, k_arg, blocks, space,
                            nullptr)
               .code() == absl::StatusCode::kInvalidArgument;
  };
  EXPECT_TRUE(refused(0, k, 1, ws));
  EXPECT_TRUE(refused(kSkinnyMaxRows + 1, k, 1, ws));
  EXPECT_TRUE(refused(4, 2121, 1, ws));  // k not a multiple of 8
  EXPECT_TRUE(refused(4, k, 0, ws));
  SkinnyWorkspace small = ws;
  small.partial_floats = SkinnyPartialFloats(4, n, k, 7) - 1;
  EXPECT_TRUE(refused(4, k, 7, small));
  EXPECT_TRUE(refused(4, k, 7, SkinnyWorkspace{}));
}

// The CPU's bf16(silu(g) * u) for g, u = bf16(x . w^T) over w's gate rows [0, inter) and up rows
// [inter, 2 inter): what the gate_up GEMM plus SiLU-mul (or the fused GEMV) must produce.
std::vector<float> CpuGateUpSilu(const std::vector<float>& x, const std::vector<float>& w, int m,
                                 int inter, int k) {
  std::vector<float> gate_up(static_cast<size_t>(m) * 2 * inter),
      act(static_cast<size_t>(m) * inter);
  cpu::MatMul(x.data(), w.data(), nullptr, m, k, 2 * inter, gate_up.data());
  for (float& v : gate_up) v = BF16ToFloat(FloatToBF16(v));
  for (int r = 0; r < m; ++r) {
    cpu::SiluMul(gate_up.data() + r * 2 * inter, gate_up.data() + r * 2 * inter + inter, inter,
                 act.data() + r * inter);
  }
  return act;
}

TEST(CudaGemmTest, GemvFusedGateUpSiluMatchesCpu) {
  RS_SKIP_WITHOUT_GPU();
  std::mt19937 rng(10);
  const int inter = 72, k = 1032;  // 129 vectors: a second, partial loop iteration
  for (int m : {1, 4, 8}) {
    const auto x = RandomBf16Values(rng, static_cast<size_t>(m) * k, 1.0f);
    const auto w = RandomBf16Values(rng, static_cast<size_t>(2) * inter * k, 0.2f);
    const std::vector<float> want = CpuGateUpSilu(x, w, m, inter, k);
    DeviceBuffer dx = UploadBf16(x), dw = UploadBf16(w), dy;
    ASSERT_TRUE(dy.Allocate(want.size() * 2).ok());
    Poison(dy);
    RS_ASSERT_OK(
        LaunchGemvGateUpSilu(dx.as<bf16>(), dw.as<bf16>(), dy.as<bf16>(), m, inter, k, nullptr));
    EXPECT_LT(RelL2(DownloadBf16(dy, want.size()), want), kBf16Tol) << "m " << m;
  }
}

// The decode-layer fusions (gemv.h) against the CPU's separate ops: RMSNorm (rounded to bf16)
// then the product, and the product (rounded to bf16) plus bias added to the residual. n = 75
// leaves warps past the last column in the last block (they still help normalize x).
TEST(CudaGemmTest, GemvWithFusedNormAndResidualAddMatchesCpu) {
  RS_SKIP_WITHOUT_GPU();
  std::mt19937 rng(14);
  const int n = 75, k = 1032;  // 129 vectors: a second, partial loop iteration
  const float eps = 1e-5f;
  for (int m : {1, 3, 8}) {
    SCOPED_TRACE(::testing::Message() << "m " << m);
    const auto residual = RandomBf16Values(rng, static_cast<size_t>(m) * k, 2.0f);
    const auto norm_weight = RandomBf16Values(rng, k);
    std::vector<float> normed(residual.size());
    cpu::RmsNorm(residual.data(), norm_weight.data(), m, k, eps, normed.data());
    for (float& v : normed) v = BF16ToFloat(FloatToBF16(v));
    DeviceBuffer dres = Upload(residual), dnorm = UploadBf16(norm_weight);
    const RmsNormedInput in{dres.as<float>(), dnorm.as<bf16>(), eps};

    const auto [x, w, want] = RandomMatMul(rng, m, n, k);
    DeviceBuffer dw = UploadBf16(w), dy;
    ASSERT_TRUE(dy.Allocate(static_cast<size_t>(m) * n * 2).ok());
    std::vector<float> want_normed(static_cast<size_t>(m) * n);
    cpu::MatMul(normed.data(), w.data(), nullptr, m, k, n, want_normed.data());
    Poison(dy);
    RS_ASSERT_OK(LaunchGemvNormed(in, dw.as<bf16>(), dy.as<bf16>(), m, n, k, nullptr));
    EXPECT_LT(RelL2(DownloadBf16(dy, want_normed.size()), want_normed), kBf16Tol);

    const auto w_gate_up = RandomBf16Values(rng, static_cast<size_t>(2) * n * k, 0.2f);
    const std::vector<float> want_act = CpuGateUpSilu(normed, w_gate_up, m, n, k);
    DeviceBuffer dgu = UploadBf16(w_gate_up);
    Poison(dy);
    RS_ASSERT_OK(LaunchGemvGateUpSiluNormed(in, dgu.as<bf16>(), dy.as<bf16>(), m, n, k, nullptr));
    EXPECT_LT(RelL2(DownloadBf16(dy, want_act.size()), want_act), kBf16Tol);

    // residual[m, n] += bf16(x . w^T) + bias.
    const auto stream = RandomBf16Values(rng, static_cast<size_t>(m) * n);
    const auto bias = RandomBf16Values(rng, n);
    DeviceBuffer dx = UploadBf16(x), dstream = Upload(stream), dbias = UploadBf16(bias);
    for (const bool with_bias : {true, false}) {
      RS_ASSERT_OK(LaunchGemvAddResidual(dx.as<bf16>(), dw.as<bf16>(),
                                         with_bias ? dbias.as<bf16>() : nullptr,
                                         dstream.as<float>(), m, n, k, nullptr));
    }
    std::vector<float> want_stream = stream;
    for (int r = 0; r < m; ++r) {
      for (int j = 0; j < n; ++j) {
        const float delta = BF16ToFloat(FloatToBF16(want[r * n + j]));
        want_stream[r * n + j] += delta + bias[j];
        want_stream[r * n + j] += delta;
      }
    }
    // A GPU and a CPU dot product may round to neighbouring bf16 values (~2e-4 here per such
    // element); a missing add or bias is an error of order 1.
    EXPECT_LT(RelL2(Download<float>(dstream, want_stream.size()), want_stream), 1e-3);
  }
  // k >= 8192 splits each column's k over two warps (gemv.cu): an odd vector count (1025) and a
  // partial last block (75 columns).
  for (int m : {1, 5}) {
    SCOPED_TRACE(::testing::Message() << "split k, m " << m);
    const int long_k = 8200;
    const auto [x, w, want] = RandomMatMul(rng, m, n, long_k);
    const auto stream = RandomBf16Values(rng, static_cast<size_t>(m) * n);
    DeviceBuffer dx = UploadBf16(x), dw = UploadBf16(w), dstream = Upload(stream);
    RS_ASSERT_OK(LaunchGemvAddResidual(dx.as<bf16>(), dw.as<bf16>(), nullptr, dstream.as<float>(),
                                       m, n, long_k, nullptr));
    std::vector<float> want_stream = stream;
    for (size_t i = 0; i < want_stream.size(); ++i) {
      want_stream[i] += BF16ToFloat(FloatToBF16(want[i]));
    }
    // Even if every bf16 rounding landed on the neighbouring value: < 2^-8; half of k missing
    // would be an error of order 1.
    EXPECT_LT(RelL2(Download<float>(dstream, want_stream.size()), want_stream), 5e-3);
  }
  // 8 rows of 4096 values are 64 KiB of shared memory: refused, not launched.
  EXPECT_FALSE(GemvNormedInputFits(8, 4096));
  EXPECT_TRUE(GemvNormedInputFits(1, 4096));
  const absl::Status refused = LaunchGemvNormed({}, nullptr, nullptr, 8, 64, 4096, nullptr);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
}

// The q/k/v projection with its rotation and K/V store in one kernel stores exactly what the
// normalizing GEMV followed by the QKV prepare kernel stores (both checked against the CPU above).
TEST(CudaGemmTest, GemvQkvRopeMatchesNormedGemvThenPrepare) {
  RS_SKIP_WITHOUT_GPU();
  std::mt19937 rng(15);
  struct Case {
    int head_dim, heads, kv_heads, m;
    bool bias;
  };
  for (const Case& cs : {Case{16, 4, 2, 1, false}, Case{16, 4, 2, 8, true},
                         Case{128, 4, 1, 3, true}, Case{64, 2, 2, 5, false}}) {
    SCOPED_TRACE(::testing::Message() << "head_dim " << cs.head_dim << " m " << cs.m);
    const int m = cs.m, k = 264, d = cs.head_dim, block_size = 4, num_blocks = 4;
    const int width = (cs.heads + 2 * cs.kv_heads) * d;
    const auto residual = RandomBf16Values(rng, static_cast<size_t>(m) * k, 2.0f);
    const auto norm_weight = RandomBf16Values(rng, k);
    const auto w = RandomBf16Values(rng, static_cast<size_t>(width) * k, 0.2f);
    const auto bias = RandomBf16Values(rng, width);
    std::vector<int32_t> positions(m), slots(m);
    for (int r = 0; r < m; ++r) {
      positions[r] = 37 * r + 5;
      slots[r] = r == 1 ? -1 : (3 * r + 2) % (num_blocks * block_size);  // row 1: padding
    }
    std::vector<float> inv_freq = cpu::RopeInvFreq(d, 500000.0);
    DeviceBuffer dres = Upload(residual), dnorm = UploadBf16(norm_weight), dw = UploadBf16(w),
                 dbias = UploadBf16(bias), dpos = Upload(positions), dslots = Upload(slots),
                 dinv = Upload(inv_freq), dqkv;
    ASSERT_TRUE(dqkv.Allocate(static_cast<size_t>(m) * width * 2).ok());
    const size_t q_elems = static_cast<size_t>(m) * cs.heads * d;
    const size_t cache_elems = static_cast<size_t>(num_blocks) * cs.kv_heads * block_size * d;
    DeviceBuffer q[2], kc[2], vc[2];
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(q[i].Allocate(q_elems * 2).ok());
      ASSERT_TRUE(kc[i].Allocate(cache_elems * 2).ok());
      ASSERT_TRUE(vc[i].Allocate(cache_elems * 2).ok());
      Poison(q[i]);
      Poison(kc[i]);
      Poison(vc[i]);
    }
    const auto cache = [&](int i) {
      return KvCacheLayer{.k = kc[i].as<bf16>(),
                          .v = vc[i].as<bf16>(),
                          .num_kv_heads = cs.kv_heads,
                          .block_size = block_size,
                          .head_dim = d};
    };
    const RmsNormedInput in{dres.as<float>(), dnorm.as<bf16>(), 1e-5f};
    const bf16* b = cs.bias ? dbias.as<bf16>() : nullptr;
    RS_ASSERT_OK(LaunchGemvNormed(in, dw.as<bf16>(), dqkv.as<bf16>(), m, width, k, nullptr));
    RS_ASSERT_OK(LaunchQkvPrepare({.qkv = dqkv.as<bf16>(),
                                   .bias = b,
                                   .positions = dpos.as<int32_t>(),
                                   .inv_freq = dinv.as<float>(),
                                   .slots = dslots.as<int32_t>(),
                                   .q_out = q[0].as<bf16>(),
                                   .cache = cache(0),
                                   .num_tokens = m,
                                   .num_heads = cs.heads},
                                  nullptr));
    RS_ASSERT_OK(LaunchGemvNormedQkvRope(in, dw.as<bf16>(),
                                         {.bias = b,
                                          .positions = dpos.as<int32_t>(),
                                          .inv_freq = dinv.as<float>(),
                                          .slots = dslots.as<int32_t>(),
                                          .q_out = q[1].as<bf16>(),
                                          .cache = cache(1),
                                          .num_heads = cs.heads},
                                         m, k, nullptr));
    EXPECT_EQ(Download<uint16_t>(q[1], q_elems), Download<uint16_t>(q[0], q_elems));
    EXPECT_EQ(Download<uint16_t>(kc[1], cache_elems), Download<uint16_t>(kc[0], cache_elems));
    EXPECT_EQ(Download<uint16_t>(vc[1], cache_elems), Download<uint16_t>(vc[0], cache_elems));
  }
  const absl::Status refused = LaunchGemvNormedQkvRope(
      {}, nullptr, {.cache = {.num_kv_heads = 1, .block_size = 4, .head_dim = 12}, .num_heads = 1},
      1, 64, nullptr);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
}

// A graph of cuBLASLt GEMM -> SiLU-mul (a programmatic dependent): the edge out of the GEMM moves
// to launch completion, and the SiLU-mul still reads the GEMM's finished output.
TEST(CudaGraphEdgesTest, DependentAfterGemmLaunchesEarlyAndReadsItsOutput) {
  RS_SKIP_WITHOUT_GPU();
  auto runner_or = GemmRunner::Create({.gemv_max_rows = 0});
  ASSERT_TRUE(runner_or.ok()) << runner_or.status();
  std::mt19937 rng(12);
  const int m = 32, inter = 1024, k = 4096;  // a GEMM long enough to still run at the launch
  const auto x = RandomBf16Values(rng, static_cast<size_t>(m) * k, 1.0f);
  const auto w = RandomBf16Values(rng, static_cast<size_t>(2) * inter * k, 0.05f);
  const std::vector<float> want = CpuGateUpSilu(x, w, m, inter, k);
  DeviceBuffer dx = UploadBf16(x), dw = UploadBf16(w), dgu, dy;
  ASSERT_TRUE(dgu.Allocate(static_cast<size_t>(m) * 2 * inter * 2).ok());
  ASSERT_TRUE(dy.Allocate(want.size() * 2).ok());
  int device = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  const absl::StatusOr<KernelPlan> plan =
      SelectKernelsForDevice(device, {.head_dim = 128, .num_heads = 32, .num_kv_heads = 8}, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  const bool dependent = plan->dependent_launch;
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  for (int run = 0; run < 3; ++run) {
    Poison(dgu);
    Poison(dy);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    RS_ASSERT_OK((*runner_or)
                     ->Linear(dx.as<bf16>(), dw.as<bf16>(), dgu.get(), OutType::kBF16, m, 2 * inter,
                              k, stream));
    // A programmatic dependent where the device runs sm_90 code (the selector's rule).
    RS_ASSERT_OK(
        LaunchSiluMul(dgu.as<bf16>(), dy.as<bf16>(), m, inter, LaunchStream(stream, dependent)));
    cudaGraph_t graph = nullptr;
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    // The rewrite runs only where the plan asks for early launch (sm_90 code on sm_90): an
    // sm_80-only build on a Hopper GPU still sees cuBLASLt's own programmatic edges, which its
    // plan leaves alone.
    if (plan->early_graph_launch) {
      int changed = -1;
      RS_ASSERT_OK(LaunchDependentsAtPredecessorStart(graph, &changed));
      EXPECT_EQ(changed, 1);
    }
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    cudaGraphDestroy(graph);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    cudaGraphExecDestroy(exec);
    EXPECT_LT(RelL2(DownloadBf16(dy, want.size()), want), kBf16Tol) << "run " << run;
  }
  cudaStreamDestroy(stream);
}

TEST(CudaElementwiseTest, AddRmsNormMatchesCpu) {
  RS_SKIP_WITHOUT_GPU();
  std::mt19937 rng(11);
  for (int dim : {64, 4096, 5000, 5002, 9216}) {  // vectorized and scalar kernels
    const int rows = 5;
    auto residual = RandomBf16Values(rng, rows * dim);
    const auto delta = RandomBf16Values(rng, rows * dim);
    const auto bias = RandomBf16Values(rng, dim);
    const auto weight = RandomBf16Values(rng, dim);
    DeviceBuffer dres = Upload(residual), ddelta = UploadBf16(delta), dbias = UploadBf16(bias),
                 dw = UploadBf16(weight), dout;
    ASSERT_TRUE(dout.Allocate(rows * dim * 2).ok());
    Poison(dout);
    RS_ASSERT_OK(LaunchAddRmsNorm(dres.as<float>(), ddelta.as<bf16>(), dbias.as<bf16>(),
                                  dw.as<bf16>(), dout.as<bf16>(), rows, dim, 1e-5f, nullptr));
    for (int r = 0; r < rows; ++r) {
      cpu::Add(residual.data() + r * dim, delta.data() + r * dim, dim);
      cpu::Add(residual.data() + r * dim, bias.data(), dim);
    }
    std::vector<float> want(rows * dim);
    cpu::RmsNorm(residual.data(), weight.data(), rows, dim, 1e-5f, want.data());
    EXPECT_LT(RelL2(Download<float>(dres, rows * dim), residual), 1e-6) << "dim " << dim;
    EXPECT_LT(RelL2(DownloadBf16(dout, rows * dim), want), kBf16Tol) << "dim " << dim;
  }
}

TEST(CudaElementwiseTest, SiluMulMatchesCpu) {
  RS_SKIP_WITHOUT_GPU();
  std::mt19937 rng(12);
  for (int inter : {160, 1001}) {
    const int rows = 7;
    const auto gate_up = RandomBf16Values(rng, rows * 2 * inter, 2.0f);
    std::vector<float> gate(rows * inter), up(rows * inter), want(rows * inter);
    for (int r = 0; r < rows; ++r) {
      std::copy_n(gate_up.begin() + r * 2 * inter, inter, gate.begin() + r * inter);
      std::copy_n(gate_up.begin() + r * 2 * inter + inter, inter, up.begin() + r * inter);
    }
    cpu::SiluMul(gate.data(), up.data(), rows * inter, want.data());
    DeviceBuffer din = UploadBf16(gate_up), dout;
    ASSERT_TRUE(dout.Allocate(rows * inter * 2).ok());
    Poison(dout);
    RS_ASSERT_OK(LaunchSiluMul(din.as<bf16>(), dout.as<bf16>(), rows, inter, nullptr));
    EXPECT_LT(RelL2(DownloadBf16(dout, rows * inter), want), kBf16Tol) << "inter " << inter;
  }
}

TEST(CudaElementwiseTest, EmbeddingAndConversionsMatchCpu) {
  RS_SKIP_WITHOUT_GPU();
  std::mt19937 rng(13);
  const int vocab = 300, hidden = 72;
  const auto table = RandomBf16Values(rng, vocab * hidden);
  const std::vector<int32_t> ids = {5, 0, 299, 5, 17};
  std::vector<float> want(ids.size() * hidden);
  cpu::Embed(table.data(), hidden, ids.data(), ids.size(), want.data());
  DeviceBuffer dt = UploadBf16(table), dids = Upload(ids), dout;
  ASSERT_TRUE(dout.Allocate(want.size() * 4).ok());
  Poison(dout);
  RS_ASSERT_OK(LaunchEmbedding(dt.as<bf16>(), dids.as<int32_t>(), dout.as<float>(), ids.size(),
                               hidden, nullptr));
  EXPECT_EQ(Download<float>(dout, want.size()), want);

  std::vector<float> f(1000);
  std::uniform_real_distribution<float> dist(-100, 100);
  for (float& v : f) v = dist(rng);
  DeviceBuffer df = Upload(f), db, dback;
  ASSERT_TRUE(db.Allocate(f.size() * 2).ok());
  ASSERT_TRUE(dback.Allocate(f.size() * 4).ok());
  RS_ASSERT_OK(LaunchF32ToBF16(df.as<float>(), db.as<bf16>(), f.size(), nullptr));
  RS_ASSERT_OK(LaunchBF16ToF32(db.as<bf16>(), dback.as<float>(), f.size(), nullptr));
  const auto bits = Download<uint16_t>(db, f.size());
  for (size_t i = 0; i < f.size(); ++i) ASSERT_EQ(bits[i], FloatToBF16(f[i])) << i;
  const auto back = Download<float>(dback, f.size());
  for (size_t i = 0; i < f.size(); ++i) ASSERT_EQ(back[i], BF16ToFloat(bits[i])) << i;
}

// Bias + q/k norm + llama3 RoPE + cache store, against cpu::MatMul-free composition of
// cpu::RmsNorm and cpu::ApplyRope, for head_dim 128 and 16.
TEST(CudaRopeTest, QkvPrepareMatchesCpuNormRopeAndStoresCache) {
  RS_SKIP_WITHOUT_GPU();
  std::mt19937 rng(14);
  struct Case {
    int head_dim, heads, kv_heads;
    bool bias, norm;
    int rotary = 0;  // partial rotary (GLM-4.5) when 0 < rotary < head_dim
  };
  for (const Case& cs :
       {Case{128, 8, 2, true, true}, Case{16, 4, 1, false, false}, Case{64, 4, 4, true, false},
        Case{16, 4, 2, true, true, 8}, Case{128, 8, 2, true, false, 64}, Case{8, 4, 2, true, false},
        Case{256, 2, 1, false, true, 96}}) {
    SCOPED_TRACE(::testing::Message() << "head_dim " << cs.head_dim << " rotary " << cs.rotary);
    const bool partial = cs.rotary > 0 && cs.rotary < cs.head_dim;
    const int tokens = 6, d = cs.head_dim, block_size = 4, num_blocks = 8;
    const int width = (cs.heads + 2 * cs.kv_heads) * d;
    const auto qkv = RandomBf16Values(rng, tokens * width);
    const auto bias = RandomBf16Values(rng, width);
    const auto qn = RandomBf16Values(rng, d), kn = RandomBf16Values(rng, d);
    const std::vector<int32_t> positions = {0, 1, 2, 700, 9000, 31};
    const std::vector<int32_t> slots = {5, 6, 7, 30, -1, 0};
    std::vector<float> inv_freq = cpu::RopeInvFreq(partial ? cs.rotary : d, 500000.0);
    cpu::ApplyLlama3RopeScaling(inv_freq, 8.0, 1.0, 4.0, 8192);

    // CPU: split, bias, norm, rope.
    std::vector<float> q(tokens * cs.heads * d), k(tokens * cs.kv_heads * d),
        v(tokens * cs.kv_heads * d);
    for (int t = 0; t < tokens; ++t) {
      for (int i = 0; i < width; ++i) {
        const float x = qkv[t * width + i] + (cs.bias ? bias[i] : 0.0f);
        if (i < cs.heads * d) {
          q[t * cs.heads * d + i] = x;
        } else if (i < (cs.heads + cs.kv_heads) * d) {
          k[t * cs.kv_heads * d + i - cs.heads * d] = x;
        } else {
          v[t * cs.kv_heads * d + i - (cs.heads + cs.kv_heads) * d] = x;
        }
      }
    }
    if (cs.norm) {
      cpu::RmsNorm(q.data(), qn.data(), tokens * cs.heads, d, 1e-6f, q.data());
      cpu::RmsNorm(k.data(), kn.data(), tokens * cs.kv_heads, d, 1e-6f, k.data());
    }
    if (partial) {
      cpu::ApplyPartialRope(q.data(), tokens, cs.heads, d, cs.rotary, positions.data(),
                            inv_freq.data());
      cpu::ApplyPartialRope(k.data(), tokens, cs.kv_heads, d, cs.rotary, positions.data(),
                            inv_freq.data());
    } else {
      cpu::ApplyRope(q.data(), tokens, cs.heads, d, positions.data(), inv_freq.data());
      cpu::ApplyRope(k.data(), tokens, cs.kv_heads, d, positions.data(), inv_freq.data());
    }

    DeviceBuffer dqkv = UploadBf16(qkv), dbias = UploadBf16(bias), dqn = UploadBf16(qn),
                 dkn = UploadBf16(kn), dpos = Upload(positions), dslots = Upload(slots),
                 dinv = Upload(inv_freq), dq, dk, dv;
    const size_t cache_elems = static_cast<size_t>(num_blocks) * cs.kv_heads * block_size * d;
    ASSERT_TRUE(dq.Allocate(q.size() * 2).ok());
    ASSERT_TRUE(dk.Allocate(cache_elems * 2).ok());
    ASSERT_TRUE(dv.Allocate(cache_elems * 2).ok());
    Poison(dq);
    Poison(dk);
    Poison(dv);
    QkvPrepareArgs args{
        .qkv = dqkv.as<bf16>(),
        .bias = cs.bias ? dbias.as<bf16>() : nullptr,
        .q_norm = cs.norm ? dqn.as<bf16>() : nullptr,
        .k_norm = cs.norm ? dkn.as<bf16>() : nullptr,
        .norm_eps = 1e-6f,
        .positions = dpos.as<int32_t>(),
        .inv_freq = dinv.as<float>(),
        .slots = dslots.as<int32_t>(),
        .q_out = dq.as<bf16>(),
        .cache = {.k = dk.as<bf16>(),
                  .v = dv.as<bf16>(),
                  .num_kv_heads = cs.kv_heads,
                  .block_size = block_size,
                  .head_dim = d},
        .num_tokens = tokens,
        .num_heads = cs.heads,
        .rotary_dim = cs.rotary,
    };
    RS_ASSERT_OK(LaunchQkvPrepare(args, nullptr));
    EXPECT_LT(RelL2(DownloadBf16(dq, q.size()), q), kBf16Tol);
    const auto kc = DownloadBf16(dk, cache_elems), vc = DownloadBf16(dv, cache_elems);
    std::vector<float> got_k, want_k, got_v, want_v;
    for (int t = 0; t < tokens; ++t) {
      if (slots[t] < 0) continue;
      const int block = slots[t] / block_size, off = slots[t] % block_size;
      for (int h = 0; h < cs.kv_heads; ++h) {
        for (int i = 0; i < d; ++i) {
          const size_t at =
              ((static_cast<size_t>(block) * cs.kv_heads + h) * block_size + off) * d + i;
          got_k.push_back(kc[at]);
          got_v.push_back(vc[at]);
          want_k.push_back(k[(t * cs.kv_heads + h) * d + i]);
          want_v.push_back(v[(t * cs.kv_heads + h) * d + i]);
        }
      }
    }
    EXPECT_LT(RelL2(got_k, want_k), kBf16Tol);
    EXPECT_LT(RelL2(got_v, want_v), kBf16Tol);
  }
}

TEST(CudaSamplingTest, ArgmaxMatchesCpuGreedyIncludingTiesAndNan) {
  RS_SKIP_WITHOUT_GPU();
  std::mt19937 rng(15);
  const int vocab = 5003, rows = 6;
  std::vector<float> logits(rows * vocab);
  std::normal_distribution<float> dist(0, 3);
  for (float& v : logits) v = dist(rng);
  logits[1 * vocab + 10] = 50;  // tie: lowest id wins
  logits[1 * vocab + 4000] = 50;
  logits[2 * vocab + 7] = std::numeric_limits<float>::quiet_NaN();
  logits[2 * vocab + 3000] = 40;
  std::fill_n(logits.begin() + 3 * vocab, vocab, -std::numeric_limits<float>::infinity());
  logits[4 * vocab + vocab - 1] = 99;
  DeviceBuffer dl = Upload(logits), dt;
  ASSERT_TRUE(dt.Allocate(rows * 4).ok());
  RS_ASSERT_OK(LaunchArgmax(dl.as<float>(), rows, vocab, dt.as<int32_t>(), nullptr));
  const auto got = Download<int32_t>(dt, rows);
  for (int r = 0; r < rows; ++r) {
    EXPECT_EQ(got[r], GreedyToken(std::span<const float>(logits.data() + r * vocab, vocab)))
        << "row " << r;
  }
  EXPECT_EQ(got[1], 10);
  EXPECT_EQ(got[3], 0);
}

}  // namespace
}  // namespace ringserve::cuda
