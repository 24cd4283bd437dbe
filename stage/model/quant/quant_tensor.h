// The raw tensors a quantized checkpoint stores (packed integers, FP8 values, scales) as the
// dequantization rules read them, and the readers they share. Nothing here allocates more than
// the decoded values; nothing aborts on malformed input (InvalidArgument naming the tensor).
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/dtype.h"

namespace ringserve::quant {

// A borrowed view of one stored tensor: little-endian bytes with no alignment guarantee
// (memory-mapped safetensors). `bytes.size()` == product(shape) * DTypeSize(dtype).
struct QTensor {
  std::string name;  // the checkpoint name, for error messages
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::span<const uint8_t> bytes;

  int64_t NumElements() const;
};

// InvalidArgument unless `t` has exactly `shape`.
absl::Status CheckShape(const QTensor& t, std::span<const int64_t> shape);
// InvalidArgument unless `t.dtype` is one of `allowed`.
absl::Status CheckDType(const QTensor& t, std::initializer_list<DType> allowed);

// InvalidArgument unless `scale` holds a [grid_rows, grid_cols] grid: that shape, or [grid_rows] /
// [grid_rows, 1] when grid_cols is 1, or [] / [1] when both are 1. `what` names the weight.
absl::Status CheckGridShape(const QTensor& scale, int64_t grid_rows, int64_t grid_cols,
                            std::string_view what);

// Scales as fp32, row-major: F32, F16 and BF16 exactly, F8_E8M0 as 2^(e - 127).
absl::StatusOr<std::vector<float>> ReadScales(const QTensor& t);
// Integer tensors (I8, U8, I16, I32, I64) widened to int64, row-major.
absl::StatusOr<std::vector<int64_t>> ReadIntegers(const QTensor& t);

// Word `index` of an I32 tensor's bytes, as the unsigned bit pattern.
inline uint32_t LoadWord(std::span<const uint8_t> bytes, int64_t index) {
  uint32_t word;
  std::memcpy(&word, bytes.data() + index * 4, sizeof(word));
  return word;
}

// Field `position` (0 = least significant bits) of `bits` bits in `word`.
inline uint32_t Field(uint32_t word, int bits, int position) {
  return (word >> (bits * position)) & ((uint32_t{1} << bits) - 1);
}

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace ringserve::quant
