// Element types of tensors on disk and on the wire, and conversions to and from fp32. The float
// types (F32, F16, BF16) are what weights and activations travel in; the others are storage types
// of quantized checkpoints (packed integers, FP8 values and scales), read through
// stage/model/quant.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace ringserve {

enum class DType {
  kF32,
  kF16,
  kBF16,
  kF8E4M3,  // float8_e4m3fn: no infinities, 0x7f/0xff are NaN
  kF8E8M0,  // exponent only: 2^(bits - 127), 0xff is NaN
  kI8,
  kU8,
  kI16,
  kI32,
  kI64,
};

// Bytes per element: 4, 2, 2, 1, 1, 1, 1, 2, 4, 8.
size_t DTypeSize(DType dtype);
// F32, F16 or BF16 (what ConvertToFloat reads).
bool IsFloatDType(DType dtype);
// Safetensors spelling: "F32", "F16", "BF16", "F8_E4M3", "F8_E8M0", "I8", "U8", "I16", "I32",
// "I64".
std::string_view DTypeName(DType dtype);
// Parses the safetensors spelling; nullopt for anything else.
std::optional<DType> ParseDType(std::string_view name);

inline float BF16ToFloat(uint16_t bits) {
  uint32_t word = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &word, sizeof(value));
  return value;
}

// Round to nearest even, as torch does; NaN stays NaN.
inline uint16_t FloatToBF16(float value) {
  uint32_t word;
  std::memcpy(&word, &value, sizeof(word));
  if ((word & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((word >> 16) | 0x40);
  word += 0x7fffu + ((word >> 16) & 1u);
  return static_cast<uint16_t>(word >> 16);
}

float HalfToFloat(uint16_t bits);
// float8_e4m3fn (sign, 4 exponent bits with bias 7, 3 mantissa bits; subnormals; S.1111.111 is
// NaN) to fp32, exactly.
float Fp8E4M3ToFloat(uint8_t bits);
// fp32 to float8_e4m3fn, rounded to nearest even and saturated to +-448 (as the CUDA
// __NV_SATFINITE conversion); NaN becomes 0x7f.
uint8_t FloatToFp8E4M3(float value);
// E8M0 (an unsigned biased exponent) to fp32: 2^(bits - 127) exactly; 0xff is NaN.
float E8M0ToFloat(uint8_t bits);
uint16_t FloatToHalf(float value);

// Converts `count` elements of `dtype` at `src` to fp32 at `dst`. `dtype` must be a float type
// (IsFloatDType); other types are the caller's bug (it aborts).
void ConvertToFloat(DType dtype, const void* src, size_t count, float* dst);

}  // namespace ringserve
