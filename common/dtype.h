// Element types of tensors on disk and on the wire, and conversions to and from fp32.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace ringserve {

enum class DType { kF32, kF16, kBF16 };

// Bytes per element: 4, 2, 2.
size_t DTypeSize(DType dtype);
// Safetensors spelling: "F32", "F16", "BF16".
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
uint16_t FloatToHalf(float value);

// Converts `count` elements of `dtype` at `src` to fp32 at `dst`.
void ConvertToFloat(DType dtype, const void* src, size_t count, float* dst);

}  // namespace ringserve
