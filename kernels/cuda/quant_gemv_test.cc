// The quantized linear kernels (quant_gemv.h) against a CPU reference on random data: every
// format, matrices quantized on the host (stage/model/quant/packed_matrix.h), then
//   - LaunchQuantDequantize equals the host's values rounded to bf16, bit for bit;
//   - LaunchQuantGemv equals the fp64 product of the host values and x within bf16 rounding.
// With RS_QUANT_BENCH=1 it also times the kernels at the Llama-3.1-8B layer shapes against the
// bf16 GEMV / cuBLASLt (printed; no assertion).
#include "kernels/cuda/quant_gemv.h"

#include <cmath>
#include <cstdlib>
#include <random>

#include "gtest/gtest.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemv.h"
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
        DeviceMatrix d = ToDevice(w);
        std::mt19937 rng(m);
        const std::vector<float> x = testing::RandomBf16Values(rng, size_t{1} * m * s.cols);
        DeviceBuffer dx = UploadBf16(x), dy;
        RS_ASSERT_OK(dy.Allocate(size_t{1} * m * s.rows * 2));
        testing::Poison(dy);
        RS_ASSERT_OK(LaunchQuantGemv(dx.as<bf16>(), d.view, dy.as<bf16>(), m, nullptr));
        const std::vector<float> got = DownloadBf16(dy, size_t{1} * m * s.rows);
        const std::vector<float> values = quant::UnpackMatrix(w);
        for (int r = 0; r < m; ++r) {
          for (int o = 0; o < s.rows; ++o) {
            double want = 0, mag = 0;
            for (int c = 0; c < s.cols; ++c) {
              want += double{values[o * s.cols + c]} * x[r * s.cols + c];
              mag += std::fabs(double{values[o * s.cols + c]} * x[r * s.cols + c]);
            }
            ASSERT_NEAR(got[r * s.rows + o], want, 1e-5 * mag + 4e-3 * std::fabs(want))
                << "row " << r << " out " << o;
          }
        }
      }
    }
  }
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
  for (int m : {1, 8, 32}) {
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
      double us = 0, bytes = 0;
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
      }
      std::printf("m %2d %s: layer %.1f us (%.2fx bf16), %.0f GB/s of its %.0f MB\n", m,
                  std::string(quant::PackedFormatName(f)).c_str(), us, bf16_us / us,
                  bytes / us / 1e3, bytes / 1e6);
    }
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace ringserve::cuda
