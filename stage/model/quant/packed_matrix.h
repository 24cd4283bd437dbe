// A quantized weight matrix in the one layout the CUDA quantized linear layers read
// (kernels/cuda/quant_gemv.h), whatever checkpoint format it came from: codes row-major, one
// scale (and, for integers, one zero point) per row and group of `group_cols` columns.
//
//   int4 / int8   W[r][c] = (code[r][c] - zero[r][g]) * scale[r][g]       (code unsigned)
//   fp8 (e4m3)    W[r][c] = e4m3(code[r][c]) * scale[r][g]
//   fp4 (e2m1)    W[r][c] = e2m1(code[r][c]) * scale[r][g]                (kFp4Values)
// with g = c / group_cols. Codes of 4-bit formats are two a byte, the even column in the low
// nibble. Block-scaled checkpoints (fp8 128x128) are held with their block scale repeated on each
// row of the block, so that matrices can be stacked by rows (q/k/v, gate/up) whatever their
// blocks.
//
// PackExact turns a matrix a checkpoint's rule dequantized (stage/model/quantized_weights.h)
// back into this layout given its scales: it refuses (FailedPrecondition) unless every value is
// exactly code * scale as above, so that holding the packed matrix is the same model as the
// dequantized one. QuantizeMatrix chooses scales itself (benchmarks, tests). Pure; thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace ringserve::quant {

enum class PackedFormat { kInt4, kInt8, kFp8, kFp4 };

// "int4", "int8", "fp8", "fp4".
std::string_view PackedFormatName(PackedFormat format);
// The inverse; InvalidArgument naming the value otherwise.
absl::StatusOr<PackedFormat> ParsePackedFormat(std::string_view name);
int PackedBits(PackedFormat format);
bool IsIntegerFormat(PackedFormat format);
// Values one 16-byte load of codes holds (32 for 4-bit formats, 16 for 8-bit): the CUDA kernels
// need columns and group_cols to be multiples of it.
int PackedChunk(PackedFormat format);

struct PackedMatrix {
  PackedFormat format = PackedFormat::kInt4;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t group_cols = 0;           // columns per scale; cols for one scale per row
  std::vector<uint8_t> codes = {};  // rows * cols * bits / 8
  std::vector<float> scales = {};   // [rows, groups()]
  std::vector<float> zeros = {};    // [rows, groups()] for integer formats, else empty

  int64_t groups() const { return (cols + group_cols - 1) / group_cols; }
  uint8_t Code(int64_t r, int64_t c) const;
  // The value the rule above gives, fp32.
  float Value(int64_t r, int64_t c) const;
};

// e4m3 (float8_e4m3fn) and e2m1 codes of a value: exact match, or nearest (ties to even code).
// Values beyond the range saturate.
uint8_t NearestE4m3(float v);
uint8_t NearestE2m1(float v);

// The matrix `w` [rows, cols] held as `format` with the given per-row scales [rows, groups] (a
// zero scale means the group is all zeros). Integer formats choose each group's zero point so
// that its codes fit the bits. FailedPrecondition when some value is not exactly representable
// (then the caller keeps the dequantized matrix); InvalidArgument for bad sizes.
absl::StatusOr<PackedMatrix> PackExact(std::span<const float> w, int64_t rows, int64_t cols,
                                       PackedFormat format, int64_t group_cols,
                                       std::span<const float> scales);

// Round-to-nearest quantization with absmax scales (asymmetric min/max for integers; e8m0 power
// of two scales for fp4, as MXFP4). For benchmarks and tests.
PackedMatrix QuantizeMatrix(std::span<const float> w, int64_t rows, int64_t cols,
                            PackedFormat format, int64_t group_cols);

// All values, row-major [rows, cols] fp32.
std::vector<float> UnpackMatrix(const PackedMatrix& m);

// `parts` stacked by rows (same format, cols and group_cols). InvalidArgument otherwise.
absl::StatusOr<PackedMatrix> StackRows(std::span<const PackedMatrix> parts);

// The rows `rows` of `m` in that order (codes, scales and zeros). InvalidArgument for a row out
// of range.
absl::StatusOr<PackedMatrix> SelectRows(const PackedMatrix& m, std::span<const int64_t> rows);

}  // namespace ringserve::quant
