#include "common/dtype.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>

namespace ringserve {

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
    case DType::kI16:
      return 2;
    case DType::kF8E4M3:
    case DType::kF8E8M0:
    case DType::kI8:
    case DType::kU8:
      return 1;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
  }
  return 0;
}

bool IsFloatDType(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF16 || dtype == DType::kBF16;
}

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kF8E4M3:
      return "F8_E4M3";
    case DType::kF8E8M0:
      return "F8_E8M0";
    case DType::kI8:
      return "I8";
    case DType::kU8:
      return "U8";
    case DType::kI16:
      return "I16";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
  }
  return "?";
}

std::optional<DType> ParseDType(std::string_view name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  if (name == "F8_E4M3") return DType::kF8E4M3;
  if (name == "F8_E8M0") return DType::kF8E8M0;
  if (name == "I8") return DType::kI8;
  if (name == "U8") return DType::kU8;
  if (name == "I16") return DType::kI16;
  if (name == "I32") return DType::kI32;
  if (name == "I64") return DType::kI64;
  return std::nullopt;
}

float HalfToFloat(uint16_t bits) {
  const uint32_t sign = (bits >> 15) & 1u;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  float magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -24);
  } else if (exponent == 31) {
    magnitude = mantissa ? NAN : INFINITY;
  } else {
    magnitude = std::ldexp(static_cast<float>(mantissa | 0x400u), static_cast<int>(exponent) - 25);
  }
  return sign ? -magnitude : magnitude;
}

uint16_t FloatToHalf(float value) {
  uint32_t word;
  std::memcpy(&word, &value, sizeof(word));
  const uint16_t sign = static_cast<uint16_t>((word >> 16) & 0x8000u);
  const uint32_t abs_word = word & 0x7fffffffu;
  if (abs_word > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (abs_word >= 0x477ff000u) return sign | 0x7c00u;  // overflow to inf (incl. inf)
  if (abs_word < 0x38800000u) {                        // subnormal or zero in half
    float abs_value;
    std::memcpy(&abs_value, &abs_word, sizeof(abs_value));
    return sign | static_cast<uint16_t>(std::nearbyint(abs_value * 16777216.0f));
  }
  // Normal: rebias exponent 127 -> 15 and round the 13 dropped mantissa bits to nearest even.
  uint32_t half = (abs_word - 0x38000000u) >> 13;
  const uint32_t dropped = abs_word & 0x1fffu;
  if (dropped > 0x1000u || (dropped == 0x1000u && (half & 1u))) ++half;
  return sign | static_cast<uint16_t>(half);
}

namespace {

// The e4m3 rule itself (Fp8E4M3ToFloat reads it from a table built once: loaders decode
// billions of codes).
float DecodeE4M3(uint8_t bits) {
  const int exponent = (bits >> 3) & 0xf;
  const int mantissa = bits & 0x7;
  if (exponent == 0xf && mantissa == 0x7) return NAN;
  const float magnitude = exponent == 0
                              ? std::ldexp(static_cast<float>(mantissa), -9)
                              : std::ldexp(static_cast<float>(8 + mantissa), exponent - 10);
  return (bits & 0x80) ? -magnitude : magnitude;
}

}  // namespace

float Fp8E4M3ToFloat(uint8_t bits) {
  static const std::array<float, 256> values = [] {
    std::array<float, 256> table{};
    for (int b = 0; b < 256; ++b) table[b] = DecodeE4M3(static_cast<uint8_t>(b));
    return table;
  }();
  return values[bits];
}

uint8_t FloatToFp8E4M3(float value) {
  if (std::isnan(value)) return 0x7f;
  const uint8_t sign = std::signbit(value) ? 0x80 : 0;
  const float magnitude = std::fabs(value);
  if (magnitude >= 448.0f) return sign | 0x7e;
  // The spacing of e4m3 values at this magnitude: 2^(e - 3) for normals (e >= -6), 2^-9 below.
  int exponent = 0;
  std::frexp(magnitude, &exponent);  // magnitude in [2^(exponent-1), 2^exponent)
  const int step_log2 = std::max(exponent - 1, -6) - 3;
  const float steps = std::nearbyint(std::ldexp(magnitude, -step_log2));  // ties to even
  const float rounded = std::ldexp(steps, step_log2);
  if (rounded >= 448.0f) return sign | 0x7e;
  // Encode the rounded value exactly.
  if (rounded < std::ldexp(1.0f, -6)) return sign | static_cast<uint8_t>(std::ldexp(rounded, 9));
  int e = 0;
  const float m = std::frexp(rounded, &e);  // rounded = m 2^e, m in [0.5, 1)
  const int biased = e - 1 + 7;
  const int mantissa = static_cast<int>(std::ldexp(m, 4)) - 8;
  return sign | static_cast<uint8_t>((biased << 3) | mantissa);
}

float E8M0ToFloat(uint8_t bits) {
  if (bits == 0xff) return NAN;
  return std::ldexp(1.0f, static_cast<int>(bits) - 127);
}

void ConvertToFloat(DType dtype, const void* src, size_t count, float* dst) {
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, count * sizeof(float));
      return;
    case DType::kF16:
    case DType::kBF16: {
      // Byte-wise loads: a tensor in a hand-made file may start at an odd offset.
      const auto* in = static_cast<const unsigned char*>(src);
      for (size_t i = 0; i < count; ++i) {
        uint16_t bits;
        std::memcpy(&bits, in + 2 * i, sizeof(bits));
        dst[i] = dtype == DType::kF16 ? HalfToFloat(bits) : BF16ToFloat(bits);
      }
      return;
    }
    case DType::kF8E4M3:
    case DType::kF8E8M0:
    case DType::kI8:
    case DType::kU8:
    case DType::kI16:
    case DType::kI32:
    case DType::kI64:
      break;
  }
  std::abort();  // a storage type: the caller must check IsFloatDType first
}

}  // namespace ringserve
