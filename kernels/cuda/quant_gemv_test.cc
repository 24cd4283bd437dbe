// The quantized linear kernels (quant_gemv.h) against a CPU reference on random data: every
// format, matrices quantized on the host (stage/model/quant/packed_matrix.h), then
//   - LaunchQuantDequantize equals the host's values rounded to bf16, bit for bit;
//   - LaunchQuantGemv equals the fp64 product of the host values and x within bf16 rounding.
// With RS_QUANT_BENCH=1 it also times the kernels at the Llama-3.1-8B layer shapes against the
// bf16 GEMV / cuBLASLt (printed; no assertion).
#include "kernels/cuda/quant_gemv.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>

#include "common/dtype.h"
#include "gtest/gtest.h"
#include "kernels/cuda/fp8_block_gemm.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/quant_mma.h"
#include "kernels/cuda/test_util.h"
#include "stage/model/quant/packed_matrix.h"

namespace ringserve::cuda {
namespace {

using quant::PackedFormat;
using testing::DownloadBf16;
using testing::Upload;
using testing::UploadBf16;

const PackedFormat kFormats[] = {PackedFormat::kInt4, PackedFormat::kInt8, PackedFormat::kFp8,
                                 PackedFormat::kFp4};

struct DeviceMatrix {
  DeviceBuffer codes, scales;
  QuantMatrixView view;
};

DeviceMatrix ToDevice(const quant::PackedMatrix& m) {
  DeviceMatrix d;
  std::vector<float> scales;
  for (size_t g = 0; g < m.scales.size(); ++g) {
    scales.push_back(m.scales[g]);
    if (quant::IsIntegerFormat(m.format)) scales.push_back(m.zeros[g]);
  }
  d.codes = Upload(m.codes);
  d.scales = Upload(scales);
  d.view = {.format = static_cast<QuantFormat>(m.format),
            .rows = static_cast<int>(m.rows),
            .cols = static_cast<int>(m.cols),
            .group_cols = static_cast<int>(m.group_cols),
            .codes = d.codes.as<uint8_t>(),
            .scales = d.scales.as<float>()};
  return d;
}

quant::PackedMatrix RandomPacked(PackedFormat f, int64_t rows, int64_t cols, int64_t group,
                                 uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.05f);
  std::vector<float> w(rows * cols);
  for (float& x : w) x = d(rng);
  return quant::QuantizeMatrix(w, rows, cols, f, group);
}

// A quantized linear kernel: y [m, w.rows] = x [m, w.cols] W^T, bf16, device.
using QuantLinearLaunch = absl::Status (*)(const bf16* x, const QuantMatrixView& w, bf16* y, int m,
                                           LaunchStream stream);

// Runs `launch` on `w` and random bf16 x of `m` rows (seeded by m) into a poisoned y, and checks
// y against the fp64 product of the host's values within bf16 rounding. A failed launch or the
// first element out of tolerance is a fatal failure: callers wrap the call in
// ASSERT_NO_FATAL_FAILURE.
void ExpectMatchesHostProduct(QuantLinearLaunch launch, const quant::PackedMatrix& w, int m) {
  const int rows = static_cast<int>(w.rows);
  const int cols = static_cast<int>(w.cols);
  DeviceMatrix d = ToDevice(w);
  std::mt19937 rng(m);
  const std::vector<float> x = testing::RandomBf16Values(rng, size_t{1} * m * cols);
  DeviceBuffer dx = UploadBf16(x), dy;
  RS_ASSERT_OK(dy.Allocate(size_t{1} * m * rows * 2));
  testing::Poison(dy);
  RS_ASSERT_OK(launch(dx.as<bf16>(), d.view, dy.as<bf16>(), m, nullptr));
  const std::vector<float> got = DownloadBf16(dy, size_t{1} * m * rows);
  const std::vector<float> values = quant::UnpackMatrix(w);
  for (int r = 0; r < m; ++r) {
    for (int o = 0; o < rows; ++o) {
      double want = 0, mag = 0;
      for (int c = 0; c < cols; ++c) {
        want += double{values[o * cols + c]} * x[r * cols + c];
        mag += std::fabs(double{values[o * cols + c]} * x[r * cols + c]);
      }
      ASSERT_NEAR(got[r * rows + o], want, 1e-5 * mag + 4e-3 * std::fabs(want))
          << "row " << r << " out " << o;
    }
  }
}

TEST(QuantGemvTest, DequantizeMatchesHostValuesRoundedToBf16) {
  RS_SKIP_WITHOUT_GPU();
  for (PackedFormat f : kFormats) {
    SCOPED_TRACE(quant::PackedFormatName(f));
    const quant::PackedMatrix m = RandomPacked(f, 37, 192, 64, 1);
    DeviceMatrix d = ToDevice(m);
    DeviceBuffer out;
    RS_ASSERT_OK(out.Allocate(37 * 192 * 2));
    RS_ASSERT_OK(LaunchQuantDequantize(d.view, out.as<bf16>(), nullptr));
    const std::vector<float> got = DownloadBf16(out, 37 * 192);
    const std::vector<float> want = quant::UnpackMatrix(m);
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i], BF16ToFloat(FloatToBF16(want[i]))) << "element " << i;
    }
  }
}

TEST(QuantGemvTest, GemvMatchesCpuReference) {
  RS_SKIP_WITHOUT_GPU();
  struct Shape {
    int rows, cols, group;
  };
  for (PackedFormat f : kFormats) {
    for (const Shape s : {Shape{100, 256, 64}, Shape{45, 512, 512}, Shape{300, 1024, 128}}) {
      for (int m : {1, 3, 8}) {
        SCOPED_TRACE(::testing::Message() << quant::PackedFormatName(f) << " " << s.rows << "x"
                                          << s.cols << " group " << s.group << " m " << m);
        const quant::PackedMatrix w = RandomPacked(f, s.rows, s.cols, s.group, s.rows + m);
        ASSERT_NO_FATAL_FAILURE(ExpectMatchesHostProduct(LaunchQuantGemv, w, m));
      }
    }
  }
}

// The tensor-core kernel against the fp64 product of the host values: every format, both block
// widths (groups of 128/64 columns take 16-byte lanes; 32 for 4-bit and 16 for 8-bit codes take
// 4-byte lanes), row counts off the 16-row tiles, and token counts across both tile shapes.
// The kernel shapes LaunchQuantMma can take (quant_mma.h: QuantMmaShape), set through its
// benchmark override.
struct MmaVariant {
  const char* warps;
  const char* split;
  const char* large;
};
const MmaVariant kMmaVariants[] = {{"8", "contiguous", "groups"},
                                   {"8", "interleaved", "groups"},
                                   {"4", "contiguous", "groups"},
                                   {"4", "interleaved", "groups"},
                                   {"8", "interleaved", "tiles"}};
constexpr int kNumMmaVariants = 5;
void UseMmaVariant(const MmaVariant& v) {
  setenv("RS_QUANT_MMA_WARPS", v.warps, 1);
  setenv("RS_QUANT_MMA_SPLIT", v.split, 1);
  setenv("RS_QUANT_MMA_LARGE", v.large, 1);
}
void UseDefaultMma() {
  unsetenv("RS_QUANT_MMA_WARPS");
  unsetenv("RS_QUANT_MMA_SPLIT");
  unsetenv("RS_QUANT_MMA_LARGE");
}

TEST(QuantMmaTest, MatchesCpuReference) {
  RS_SKIP_WITHOUT_GPU();
  struct Shape {
    int rows, cols, group;
  };
  for (const MmaVariant& variant : kMmaVariants) {
    UseMmaVariant(variant);
    for (PackedFormat f : kFormats) {
      const int narrow = quant::PackedChunk(f);
      for (const Shape s : {Shape{100, 256, 128}, Shape{45, 512, 512}, Shape{300, 1024, 128},
                            Shape{40, 384, narrow}, Shape{24, 768, 64}}) {
        for (int m : {1, 3, 8, 9, 32, 45}) {
          SCOPED_TRACE(::testing::Message()
                       << quant::PackedFormatName(f) << " " << s.rows << "x" << s.cols << " group "
                       << s.group << " m " << m << " warps " << variant.warps << " "
                       << variant.split << " " << variant.large);
          const quant::PackedMatrix w = RandomPacked(f, s.rows, s.cols, s.group, s.rows + m);
          ASSERT_NO_FATAL_FAILURE(ExpectMatchesHostProduct(LaunchQuantMma, w, m));
        }
      }
    }
  }
  UseDefaultMma();
}

TEST(QuantMmaTest, RefusesBadArguments) {
  RS_SKIP_WITHOUT_GPU();
  const quant::PackedMatrix w = RandomPacked(PackedFormat::kInt8, 8, 64, 64, 3);
  DeviceMatrix d = ToDevice(w);
  DeviceBuffer x, y;
  RS_ASSERT_OK(x.Allocate(65 * 64 * 2));
  RS_ASSERT_OK(y.Allocate(65 * 8 * 2));
  EXPECT_EQ(LaunchQuantMma(x.as<bf16>(), d.view, y.as<bf16>(), 0, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      LaunchQuantMma(x.as<bf16>(), d.view, y.as<bf16>(), kQuantMmaMaxRows + 1, nullptr).code(),
      absl::StatusCode::kInvalidArgument);
  QuantMatrixView bad = d.view;
  bad.cols = 72;  // not a multiple of 16
  EXPECT_EQ(LaunchQuantMma(x.as<bf16>(), bad, y.as<bf16>(), 1, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LaunchQuantMma(x.as<bf16>() + 1, d.view, y.as<bf16>(), 1, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(QuantGemvTest, RefusesUnsupportedShapes) {
  RS_SKIP_WITHOUT_GPU();
  const quant::PackedMatrix w = RandomPacked(PackedFormat::kInt4, 8, 64, 32, 2);
  DeviceMatrix d = ToDevice(w);
  QuantMatrixView bad = d.view;
  bad.group_cols = 16;  // below the 32 values of one load
  EXPECT_EQ(LaunchQuantGemv(nullptr, bad, nullptr, 1, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LaunchQuantGemv(nullptr, d.view, nullptr, 9, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

// Host form of LaunchQuantizeFp8Groups: codes [m, k], scales [k / 128, m].
void QuantizeGroupsOnHost(const std::vector<float>& x, int m, int k, std::vector<uint8_t>* codes,
                          std::vector<float>* scales) {
  codes->assign(size_t{1} * m * k, 0);
  scales->assign(size_t{1} * m * (k / 128), 0.0f);
  for (int t = 0; t < m; ++t) {
    for (int g = 0; g < k / 128; ++g) {
      float amax = 0;
      for (int c = g * 128; c < (g + 1) * 128; ++c) amax = std::max(amax, std::fabs(x[t * k + c]));
      const float scale = amax > 0 ? amax / 448.0f : 1.0f;
      (*scales)[g * m + t] = scale;
      for (int c = g * 128; c < (g + 1) * 128; ++c) {
        (*codes)[t * k + c] = quant::NearestE4m3(x[t * k + c] / scale);
      }
    }
  }
}

TEST(Fp8BlockGemmTest, QuantizeGroupsMatchesHost) {
  RS_SKIP_WITHOUT_GPU();
  const int m = 37, k = 384;
  std::mt19937 rng(5);
  std::vector<float> x = testing::RandomBf16Values(rng, size_t{1} * m * k, 3.0f);
  for (int c = 128; c < 256; ++c) x[2 * k + c] = 0;  // an all-zero group
  DeviceBuffer dx = UploadBf16(x), codes, scales;
  RS_ASSERT_OK(codes.Allocate(m * k));
  RS_ASSERT_OK(scales.Allocate(m * (k / 128) * 4));
  RS_ASSERT_OK(LaunchQuantizeFp8Groups(dx.as<bf16>(), codes.as<uint8_t>(), scales.as<float>(), m, k,
                                       nullptr));
  std::vector<uint8_t> got_codes(m * k), want_codes;
  std::vector<float> got_scales(m * (k / 128)), want_scales;
  ASSERT_EQ(cudaMemcpy(got_codes.data(), codes.get(), got_codes.size(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  ASSERT_EQ(
      cudaMemcpy(got_scales.data(), scales.get(), got_scales.size() * 4, cudaMemcpyDeviceToHost),
      cudaSuccess);
  QuantizeGroupsOnHost(x, m, k, &want_codes, &want_scales);
  EXPECT_EQ(got_scales, want_scales);
  for (size_t i = 0; i < got_codes.size(); ++i) {
    // +0 and -0 are both exact zeros.
    if ((got_codes[i] & 0x7f) == 0 && (want_codes[i] & 0x7f) == 0) continue;
    ASSERT_EQ(got_codes[i], want_codes[i]) << "element " << i << " value " << x[i];
  }
  EXPECT_EQ(LaunchQuantizeFp8Groups(dx.as<bf16>(), codes.as<uint8_t>(), scales.as<float>(), m, 100,
                                    nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// The FP8 block-scaled GEMM (cuBLASLt's or the wgmma kernel; Hopper only) against the fp64 product
// of the quantized activations and the block-scaled weights, and within the quantization's bound
// (2^-4 of each product) of the product with the unquantized activations.
void CheckFp8GemmAgainstHost(Fp8BlockGemm& gemm, int m, int n, int k) {
  SCOPED_TRACE(::testing::Message() << "m " << m << " n " << n << " k " << k);
  std::mt19937 rng(7);
  std::vector<uint8_t> w_codes(size_t{1} * n * k);
  std::uniform_int_distribution<int> byte(0, 255);
  for (uint8_t& c : w_codes) {
    c = static_cast<uint8_t>(byte(rng));
    if ((c & 0x7f) == 0x7f) c = 0x10;  // no NaN
  }
  const int64_t stride = Fp8BlockScaleStride(k);
  const int row_blocks = (n + 127) / 128;
  std::vector<float> block_scales(row_blocks * stride, 0.0f), row_scales(size_t{1} * n * (k / 128));
  std::uniform_real_distribution<float> unit(0.5f, 2.0f);
  for (int rb = 0; rb < row_blocks; ++rb) {
    for (int kb = 0; kb < k / 128; ++kb) block_scales[rb * stride + kb] = 1e-3f * unit(rng);
  }
  for (int o = 0; o < n; ++o) {
    for (int kb = 0; kb < k / 128; ++kb)
      row_scales[kb * n + o] = block_scales[(o / 128) * stride + kb];
  }
  const std::vector<float> x = testing::RandomBf16Values(rng, size_t{1} * m * k);
  std::vector<uint8_t> x_codes;
  std::vector<float> x_scales;
  QuantizeGroupsOnHost(x, m, k, &x_codes, &x_scales);
  DeviceBuffer dw = Upload(w_codes), dbs = Upload(block_scales), drs = Upload(row_scales);
  DeviceBuffer dx = UploadBf16(x);
  DeviceBuffer dxc, dxs, dy;
  RS_ASSERT_OK(dxc.Allocate(m * k));
  RS_ASSERT_OK(dxs.Allocate(m * (k / 128) * 4));
  RS_ASSERT_OK(dy.Allocate(m * n * 2));
  testing::Poison(dy);
  RS_ASSERT_OK(
      LaunchQuantizeFp8Groups(dx.as<bf16>(), dxc.as<uint8_t>(), dxs.as<float>(), m, k, nullptr));
  // The per-row scales alone, then with the block scales (cuBLASLt's block mode where it has it).
  for (const bool block : {false, true}) {
    testing::Poison(dy);
    RS_ASSERT_OK(gemm.Linear(dxc.as<uint8_t>(), dxs.as<float>(), dw.as<uint8_t>(), drs.as<float>(),
                             block ? dbs.as<float>() : nullptr, dy.as<bf16>(), m, n, k, nullptr));
    std::printf("FP8 GEMM with %s scales\n", gemm.last_mode());
    const std::vector<float> got = DownloadBf16(dy, size_t{1} * m * n);
    for (int t = 0; t < m; ++t) {
      for (int o = 0; o < n; ++o) {
        double want = 0, unquantized = 0, mag = 0;
        for (int c = 0; c < k; ++c) {
          const double wv = double{Fp8E4M3ToFloat(w_codes[o * k + c])} *
                            block_scales[(o / 128) * stride + c / 128];
          const double xq =
              double{Fp8E4M3ToFloat(x_codes[t * k + c])} * x_scales[(c / 128) * m + t];
          want += wv * xq;
          unquantized += wv * x[t * k + c];
          mag += std::fabs(wv * x[t * k + c]);
        }
        // Hopper's fp8 MMAs keep about 14 bits of a group's sum (DeepSeek-V3's report measured
        // it; the kernels promote every 128 columns): 5e-4 of the magnitude, far below what a
        // wrong scale or column would move (a group's share, ~1/4 of it here).
        ASSERT_NEAR(got[t * n + o], want, 5e-4 * mag + 4e-3 * std::fabs(want))
            << "token " << t << " out " << o;
        ASSERT_NEAR(got[t * n + o], unquantized, 0.0625 * mag + 4e-3 * std::fabs(unquantized));
      }
    }
  }
}

TEST(Fp8BlockGemmTest, MatchesHostReference) {
  RS_SKIP_WITHOUT_GPU();
  auto gemm = Fp8BlockGemm::Create();
  RS_ASSERT_OK(gemm.status());
  if (!(*gemm)->Supported(200, 384, 512)) GTEST_SKIP() << "no FP8 block-scaled GEMM on this device";
  CheckFp8GemmAgainstHost(**gemm, 200, 384, 512);
  // Partial row and column tiles (the wgmma kernel's bounds), where the shape runs.
  if ((*gemm)->Supported(36, 132, 256)) CheckFp8GemmAgainstHost(**gemm, 36, 132, 256);
}

// Llama-3.1-8B layer: qkv, o, gate/up, down.
TEST(QuantGemvBench, Llama8bLayerShapes) {
  RS_SKIP_WITHOUT_GPU();
  if (std::getenv("RS_QUANT_BENCH") == nullptr) GTEST_SKIP() << "RS_QUANT_BENCH unset";
  struct Shape {
    int rows, cols;
  };
  const Shape shapes[] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}};
  auto gemm = GemmRunner::Create();
  ASSERT_TRUE(gemm.ok());
  DeviceBuffer x, y, wb;
  RS_ASSERT_OK(x.Allocate(64 * 14336 * 2));
  RS_ASSERT_OK(y.Allocate(64 * 28672 * 4));
  RS_ASSERT_OK(wb.Allocate(int64_t{28672} * 4096 * 2));
  ASSERT_EQ(cudaMemset(x.get(), 0, x.bytes()), cudaSuccess);
  ASSERT_EQ(cudaMemset(wb.get(), 0, wb.bytes()), cudaSuccess);
  cudaEvent_t t0, t1;
  cudaEventCreate(&t0);
  cudaEventCreate(&t1);
  auto time_us = [&](auto&& launch) {
    for (int i = 0; i < 3; ++i) launch();
    cudaEventRecord(t0);
    constexpr int kReps = 20;
    for (int i = 0; i < kReps; ++i) launch();
    cudaEventRecord(t1);
    cudaEventSynchronize(t1);
    float ms = 0;
    cudaEventElapsedTime(&ms, t0, t1);
    return ms * 1000 / kReps;
  };
  for (int m : {1, 4, 8, 16, 32, 64}) {
    double bf16_us = 0;
    for (const Shape s : shapes) {
      bf16_us += time_us([&] {
        (void)(*gemm)->Linear(x.as<bf16>(), wb.as<bf16>(), y.get(), OutType::kBF16, m, s.rows,
                              s.cols, nullptr);
      });
    }
    std::printf("m %2d bf16 (GemmRunner): layer %.1f us, %.0f GB/s\n", m, bf16_us,
                2.0 * 218103808 / bf16_us / 1e3);
    for (PackedFormat f : kFormats) {
      const int64_t group = f == PackedFormat::kInt8 ? 4096 : (f == PackedFormat::kFp4 ? 32 : 128);
      // The CUDA-core GEMV (m <= 8) or dequantize + GEMM (above), and the tensor-core kernel.
      double us = 0, mma_us[kNumMmaVariants] = {}, bytes = 0;
      for (const Shape s : shapes) {
        const int64_t g = std::min<int64_t>(group, s.cols);
        quant::PackedMatrix w{.format = f, .rows = s.rows, .cols = s.cols, .group_cols = g};
        w.codes.assign(int64_t{s.rows} * s.cols * quant::PackedBits(f) / 8, 0x11);
        w.scales.assign(s.rows * w.groups(), 0.01f);
        if (quant::IsIntegerFormat(f)) w.zeros.assign(s.rows * w.groups(), 8.0f);
        DeviceMatrix d = ToDevice(w);
        bytes += d.codes.bytes() + d.scales.bytes();
        DeviceBuffer scratch;
        if (m > kQuantGemvMaxRows) RS_ASSERT_OK(scratch.Allocate(int64_t{s.rows} * s.cols * 2));
        us += time_us([&] {
          if (m <= kQuantGemvMaxRows) {
            (void)LaunchQuantGemv(x.as<bf16>(), d.view, y.as<bf16>(), m, nullptr);
          } else {
            (void)LaunchQuantDequantize(d.view, scratch.as<bf16>(), nullptr);
            (void)(*gemm)->Linear(x.as<bf16>(), scratch.as<bf16>(), y.get(), OutType::kBF16, m,
                                  s.rows, s.cols, nullptr);
          }
        });
        for (int v = 0; v < kNumMmaVariants; ++v) {
          UseMmaVariant(kMmaVariants[v]);
          mma_us[v] += time_us(
              [&] { (void)LaunchQuantMma(x.as<bf16>(), d.view, y.as<bf16>(), m, nullptr); });
        }
        UseDefaultMma();
      }
      std::printf("m %2d %s: %s %.1f us (%.2fx bf16); tensor-core", m,
                  std::string(quant::PackedFormatName(f)).c_str(),
                  m <= kQuantGemvMaxRows ? "gemv" : "dequant+gemm", us, bf16_us / us);
      for (int v = 0; v < kNumMmaVariants; ++v) {
        std::printf(" | %s %.3s %.1s %.1f us %.2fx %.0f GB/s", kMmaVariants[v].warps,
                    kMmaVariants[v].split, kMmaVariants[v].large, mma_us[v], bf16_us / mma_us[v],
                    bytes / mma_us[v] / 1e3);
      }
      std::printf(" of %.0f MB\n", bytes / 1e6);
    }
  }
  // Prefill at 8k tokens: bf16 GEMMs against the FP8 block-scaled GEMM with the activations'
  // quantization, and against dequantize + bf16 GEMM.
  auto fp8 = Fp8BlockGemm::Create();
  ASSERT_TRUE(fp8.ok());
  const int m = 8192;
  DeviceBuffer xp, yp, codes, scales, wq, wscales, scratch;
  RS_ASSERT_OK(xp.Allocate(int64_t{m} * 14336 * 2));
  RS_ASSERT_OK(yp.Allocate(int64_t{m} * 28672 * 2));
  RS_ASSERT_OK(codes.Allocate(int64_t{m} * 14336));
  RS_ASSERT_OK(scales.Allocate(int64_t{m} * 112 * 4));
  RS_ASSERT_OK(wq.Allocate(int64_t{28672} * 4096));
  RS_ASSERT_OK(wscales.Allocate(int64_t{28672} * 32 * 4));  // per row or per block
  RS_ASSERT_OK(scratch.Allocate(int64_t{28672} * 4096 * 2));
  ASSERT_EQ(cudaMemset(xp.get(), 0, xp.bytes()), cudaSuccess);
  ASSERT_EQ(cudaMemset(wq.get(), 0x11, wq.bytes()), cudaSuccess);
  ASSERT_EQ(cudaMemset(wscales.get(), 0, wscales.bytes()), cudaSuccess);
  double bf16_us = 0, fp8_us = 0, dequant_us = 0;
  for (const Shape s : shapes) {
    bf16_us += time_us([&] {
      (void)(*gemm)->Linear(xp.as<bf16>(), wb.as<bf16>(), yp.get(), OutType::kBF16, m, s.rows,
                            s.cols, nullptr);
    });
    if (!(*fp8)->Supported(m, s.rows, s.cols, /*block_scales=*/true)) {
      std::printf("prefill %d: no FP8 block-scaled GEMM for %dx%d\n", m, s.rows, s.cols);
      continue;
    }
    fp8_us += time_us([&] {
      (void)LaunchQuantizeFp8Groups(xp.as<bf16>(), codes.as<uint8_t>(), scales.as<float>(), m,
                                    s.cols, nullptr);
      (void)(*fp8)->Linear(codes.as<uint8_t>(), scales.as<float>(), wq.as<uint8_t>(),
                           wscales.as<float>(), wscales.as<float>(), yp.as<bf16>(), m, s.rows,
                           s.cols, nullptr);
    });
    const QuantMatrixView view{.format = QuantFormat::kFp8,
                               .rows = s.rows,
                               .cols = s.cols,
                               .group_cols = 128,
                               .codes = wq.as<uint8_t>(),
                               .scales = wscales.as<float>()};
    dequant_us += time_us([&] {
      (void)LaunchQuantDequantize(view, scratch.as<bf16>(), nullptr);
      (void)(*gemm)->Linear(xp.as<bf16>(), scratch.as<bf16>(), yp.get(), OutType::kBF16, m, s.rows,
                            s.cols, nullptr);
    });
  }
  std::printf(
      "prefill m %d: bf16 layer %.1f us; fp8 block-scaled (%s scales, with activation "
      "quantization) %.1f us (%.2fx bf16); fp8 dequantize + bf16 GEMM %.1f us\n",
      m, bf16_us, (*fp8)->last_mode(), fp8_us, bf16_us / fp8_us, dequant_us);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace ringserve::cuda
