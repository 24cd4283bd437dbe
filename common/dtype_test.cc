#include "common/dtype.h"

#include <cmath>

#include "gtest/gtest.h"

namespace ringserve {
namespace {

TEST(DTypeTest, ParsesSafetensorsNamesAndRejectsOthers) {
  EXPECT_EQ(ParseDType("BF16"), DType::kBF16);
  EXPECT_EQ(ParseDType("F16"), DType::kF16);
  EXPECT_EQ(ParseDType("F32"), DType::kF32);
  EXPECT_FALSE(ParseDType("F64").has_value());
  EXPECT_FALSE(ParseDType("bf16").has_value());
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
}

TEST(DTypeTest, BF16RoundsToNearestEven) {
  EXPECT_EQ(FloatToBF16(1.0f), 0x3f80);
  EXPECT_EQ(BF16ToFloat(0x3f80), 1.0f);
  // 1 + 2^-8 is exactly between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(FloatToBF16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(FloatToBF16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(BF16ToFloat(FloatToBF16(NAN))));
}

TEST(DTypeTest, HalfRoundTripsRepresentableValues) {
  for (float v : {0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f, 0.333251953125f}) {
    EXPECT_EQ(HalfToFloat(FloatToHalf(v)), v) << v;
  }
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_TRUE(std::isinf(HalfToFloat(FloatToHalf(1e6f))));
}

}  // namespace
}  // namespace ringserve
