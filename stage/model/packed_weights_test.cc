// Quantized weights kept packed (packed_weights.h, quant/packed_matrix.h): on every quantized
// fixture (tests/fixtures/models/quant) each packed weight unpacks to exactly the matrix the
// format's rule dequantizes, the formats that can be packed are, and the packing layer itself
// refuses values it cannot hold exactly and round-trips its own quantization.
#include "stage/model/packed_weights.h"

#include <cmath>
#include <cstdlib>
#include <random>

#include "common/dtype.h"
#include "gtest/gtest.h"
#include "ring/model_config.h"
#include "stage/model/quant/mxfp4.h"
#include "stage/model/quantized_weights.h"

namespace ringserve {
namespace {

using quant::PackedFormat;

std::string QuantFixture(const std::string& format) {
  const char* root = std::getenv("RINGSERVE_SOURCE_DIR");
  return std::string(root != nullptr ? root : ".") + "/tests/fixtures/models/quant/" + format;
}

struct FixtureCase {
  std::string name;
  bool all_packed = false;  // every quantized weight packs (no permuted activation order)
};

class PackedFixtureTest : public ::testing::TestWithParam<FixtureCase> {};

TEST_P(PackedFixtureTest, PackedWeightsUnpackToTheDequantizedWeights) {
  const std::string dir = QuantFixture(GetParam().name);
  auto config = LoadModelConfig(dir);
  ASSERT_TRUE(config.ok()) << config.status();
  auto quant = quant::LoadQuantConfig(dir);
  ASSERT_TRUE(quant.ok()) << quant.status();
  auto weights = SafetensorsModel::Open(dir);
  ASSERT_TRUE(weights.ok()) << weights.status();
  int quantized = 0, packed = 0;
  for (int layer = 0; layer < config->num_layers; ++layer) {
    for (const TensorSpec& spec : LayerTensorSpecs(*config, layer)) {
      if (!IsQuantizedWeight(*quant, spec)) continue;
      ++quantized;
      auto p = ReadPackedWeight(**weights, *quant, spec);
      ASSERT_TRUE(p.ok()) << p.status();
      if (!p->matrix) {
        EXPECT_FALSE(GetParam().all_packed) << spec.name << ": " << p->why_not;
        continue;
      }
      ++packed;
      auto want = ReadWeightFloat(**weights, *quant, spec);
      ASSERT_TRUE(want.ok()) << want.status();
      const std::vector<float> got = quant::UnpackMatrix(*p->matrix);
      ASSERT_EQ(got.size(), want->size());
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i], (*want)[i]) << spec.name << " element " << i;
      }
    }
  }
  EXPECT_GT(quantized, 0);
  if (GetParam().all_packed) {
    EXPECT_EQ(packed, quantized);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, PackedFixtureTest,
    ::testing::Values(FixtureCase{"fp8_block", true}, FixtureCase{"fp8_hf", true},
                      FixtureCase{"ct_fp8", true}, FixtureCase{"ct_int8", true},
                      FixtureCase{"ct_int4", false}, FixtureCase{"gptq_int4", false},
                      FixtureCase{"gptq_int8", true}, FixtureCase{"awq_int4", true}),
    [](const auto& info) { return info.param.name; });

std::vector<float> RandomMatrix(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.05f);
  std::vector<float> w(n);
  for (float& x : w) x = d(rng);
  return w;
}

TEST(PackedMatrixTest, QuantizedMatricesPackAgainExactlyAndCloseToTheInput) {
  const int64_t rows = 6, cols = 96;
  const std::vector<float> w = RandomMatrix(rows * cols, 7);
  for (PackedFormat f :
       {PackedFormat::kInt4, PackedFormat::kInt8, PackedFormat::kFp8, PackedFormat::kFp4}) {
    SCOPED_TRACE(quant::PackedFormatName(f));
    const quant::PackedMatrix q = quant::QuantizeMatrix(w, rows, cols, f, 32);
    const std::vector<float> values = quant::UnpackMatrix(q);
    double err = 0, norm = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      err += (values[i] - w[i]) * (values[i] - w[i]);
      norm += w[i] * w[i];
    }
    EXPECT_LT(std::sqrt(err / norm),
              f == PackedFormat::kFp4 || f == PackedFormat::kInt4 ? 0.2 : 0.05);
    auto again = quant::PackExact(values, rows, cols, f, 32, q.scales);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(quant::UnpackMatrix(*again), values);
    // A value between two codes cannot be held.
    std::vector<float> off = values;
    off[5] += q.scales[0] * 0.25f;
    EXPECT_EQ(quant::PackExact(off, rows, cols, f, 32, q.scales).status().code(),
              absl::StatusCode::kFailedPrecondition);
  }
}

TEST(PackedMatrixTest, NearestCodesRoundTripEveryCode) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;  // NaN
    const float v = Fp8E4M3ToFloat(static_cast<uint8_t>(c));
    if (c == 0x80) continue;  // -0 is coded +0
    EXPECT_EQ(quant::NearestE4m3(v), c) << v;
  }
  EXPECT_EQ(quant::NearestE4m3(1000.0f), 0x7e);  // saturates at 448
  for (int c = 1; c < 16; ++c) {
    if (c == 8) continue;
    EXPECT_EQ(quant::NearestE2m1(quant::kFp4Values[c]), c);
  }
}

// NearestE4m3 works from the value's bits; it must equal the plain search: the nearest of the
// magnitude codes 0..0x7e by value, ties to the even code, saturating at 448. Checked on every
// midpoint between neighbouring codes and one float step either side of it, and random values.
TEST(PackedMatrixTest, NearestE4m3EqualsTheSearchOverEveryCode) {
  auto search = [](float v) {
    const float a = std::fabs(v);
    int best = 0;
    if (a > 0) {
      float best_gap = INFINITY;
      for (int c = 0; c <= 0x7e; ++c) {
        const float gap = std::fabs(Fp8E4M3ToFloat(static_cast<uint8_t>(c)) - a);
        if (gap < best_gap || (gap == best_gap && c % 2 == 0)) {
          best = c;
          best_gap = gap;
        }
      }
    }
    return static_cast<uint8_t>(std::signbit(v) && best != 0 ? best | 0x80 : best);
  };
  std::vector<float> values = {0.0f, -0.0f, 1e-30f, 447.9f, 448.0f, 460.0f, 1e9f, -1e9f};
  for (int c = 0; c < 0x7e; ++c) {
    const float mid =
        (Fp8E4M3ToFloat(static_cast<uint8_t>(c)) + Fp8E4M3ToFloat(static_cast<uint8_t>(c + 1))) / 2;
    for (float v : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
      values.push_back(v);
      values.push_back(-v);
    }
  }
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> exponent(-14.0f, 10.0f);
  for (int i = 0; i < 20000; ++i) {
    values.push_back((i % 2 ? -1.0f : 1.0f) * std::exp2(exponent(rng)));
  }
  for (float v : values) EXPECT_EQ(quant::NearestE4m3(v), search(v)) << v;
}

TEST(PackedMatrixTest, StackRowsRefusesMismatchedMatrices) {
  const std::vector<float> w = RandomMatrix(2 * 64, 3);
  const auto a = quant::QuantizeMatrix(w, 2, 64, PackedFormat::kInt4, 32);
  const auto b = quant::QuantizeMatrix(w, 2, 64, PackedFormat::kInt4, 64);
  EXPECT_EQ(quant::StackRows(std::vector{a, b}).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto ab = quant::StackRows(std::vector{a, a});
  ASSERT_TRUE(ab.ok());
  EXPECT_EQ(ab->rows, 4);
  EXPECT_EQ(quant::UnpackMatrix(*ab)[2 * 64 + 5], quant::UnpackMatrix(a)[5]);
  EXPECT_EQ(quant::ParsePackedFormat("int3").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(PackedMatrixTest, SelectRowsTakesRowsInTheGivenOrder) {
  const std::vector<float> w = RandomMatrix(4 * 64, 5);
  for (const PackedFormat f : {PackedFormat::kInt4, PackedFormat::kFp4, PackedFormat::kInt8}) {
    const auto m = quant::QuantizeMatrix(w, 4, 64, f, 32);
    const std::vector<int64_t> order = {2, 0, 3, 1, 2};
    auto picked = quant::SelectRows(m, order);
    ASSERT_TRUE(picked.ok()) << picked.status();
    ASSERT_EQ(picked->rows, 5);
    const std::vector<float> all = quant::UnpackMatrix(m), got = quant::UnpackMatrix(*picked);
    for (size_t r = 0; r < order.size(); ++r) {
      for (int64_t c = 0; c < 64; ++c) {
        ASSERT_EQ(got[r * 64 + c], all[order[r] * 64 + c]) << quant::PackedFormatName(f);
      }
    }
    const std::vector<int64_t> out_of_range = {4};
    EXPECT_EQ(quant::SelectRows(m, out_of_range).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace ringserve
