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

TEST(DTypeTest, ParsesQuantizedStorageTypes) {
  EXPECT_EQ(ParseDType("F8_E4M3"), DType::kF8E4M3);
  EXPECT_EQ(ParseDType("F8_E8M0"), DType::kF8E8M0);
  EXPECT_EQ(ParseDType("I32"), DType::kI32);
  EXPECT_EQ(ParseDType("I64"), DType::kI64);
  EXPECT_EQ(ParseDType("U8"), DType::kU8);
  EXPECT_FALSE(ParseDType("F8_E5M2").has_value());
  EXPECT_EQ(DTypeSize(DType::kF8E4M3), 1u);
  EXPECT_EQ(DTypeSize(DType::kI64), 8u);
  EXPECT_EQ(DTypeName(DType::kF8E4M3), "F8_E4M3");
  EXPECT_FALSE(IsFloatDType(DType::kI32));
  EXPECT_TRUE(IsFloatDType(DType::kBF16));
}

// float8_e4m3fn as torch defines it: bias 7, subnormals, no infinities, S.1111.111 is NaN.
// Every finite code encodes back to itself; halfway values round to the even code; beyond 448
// saturates (as __NV_SATFINITE); NaN becomes the NaN code.
TEST(DTypeTest, FloatToFp8E4M3RoundsToNearestEvenAndSaturates) {
  for (int bits = 0; bits < 256; ++bits) {
    if ((bits & 0x7f) == 0x7f) continue;  // NaN
    const float value = Fp8E4M3ToFloat(static_cast<uint8_t>(bits));
    if (value == 0.0f) continue;  // -0 and +0 both decode to zero
    EXPECT_EQ(FloatToFp8E4M3(value), bits) << value;
  }
  EXPECT_EQ(FloatToFp8E4M3(1.0625f), 0x38);                // between 1 (even) and 1.125: ties to 1
  EXPECT_EQ(FloatToFp8E4M3(1.1875f), 0x3a);                // between 1.125 and 1.25 (even)
  EXPECT_EQ(FloatToFp8E4M3(1.07f), 0x39);                  // above the midpoint
  EXPECT_EQ(FloatToFp8E4M3(std::ldexp(1.0f, -10)), 0x00);  // half the smallest subnormal
  EXPECT_EQ(FloatToFp8E4M3(std::ldexp(3.0f, -10)), 0x02);  // 1.5 subnormal steps: even
  EXPECT_EQ(FloatToFp8E4M3(0.0f), 0x00);
  EXPECT_EQ(FloatToFp8E4M3(500.0f), 0x7e);
  EXPECT_EQ(FloatToFp8E4M3(-1e9f), 0xfe);
  EXPECT_EQ(FloatToFp8E4M3(NAN), 0x7f);
}

TEST(DTypeTest, Fp8E4M3DecodesEveryClassOfValue) {
  EXPECT_EQ(Fp8E4M3ToFloat(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(Fp8E4M3ToFloat(0x80)));
  EXPECT_EQ(Fp8E4M3ToFloat(0x38), 1.0f);                  // e=7, m=0
  EXPECT_EQ(Fp8E4M3ToFloat(0x3c), 1.5f);                  // e=7, m=4
  EXPECT_EQ(Fp8E4M3ToFloat(0xc0), -2.0f);                 // e=8
  EXPECT_EQ(Fp8E4M3ToFloat(0x7e), 448.0f);                // the largest finite value
  EXPECT_EQ(Fp8E4M3ToFloat(0x01), std::ldexp(1.0f, -9));  // the smallest subnormal
  EXPECT_EQ(Fp8E4M3ToFloat(0x08), std::ldexp(1.0f, -6));  // the smallest normal
  EXPECT_TRUE(std::isnan(Fp8E4M3ToFloat(0x7f)));
  EXPECT_TRUE(std::isnan(Fp8E4M3ToFloat(0xff)));
  EXPECT_EQ(Fp8E4M3ToFloat(0x78), 256.0f);  // e=15 is a normal exponent in the fn variant
}

TEST(DTypeTest, E8M0IsAPowerOfTwo) {
  EXPECT_EQ(E8M0ToFloat(127), 1.0f);
  EXPECT_EQ(E8M0ToFloat(120), 1.0f / 128);
  EXPECT_EQ(E8M0ToFloat(130), 8.0f);
  EXPECT_TRUE(std::isnan(E8M0ToFloat(0xff)));
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
