// compressed-tensors integer weights (`pack-quantized`, `int-quantized`): how the values are
// stored, and the one integer rule.
//
// Storage (compressed_tensors.compressors.pack_quantized.pack_to_int32): a signed value q in
// [-2^(b-1), 2^(b-1)) is stored as q + 2^(b-1) in b bits; 32 / b of them fill an int32 from the
// least significant bits up, along the packed dimension (1: the weight's columns, `weight_packed`
// [rows, ceil(cols / (32 / b))]; 0: the rows, asymmetric zero points [ceil(R / (32 / b)), C]),
// the last word zero-padded.
//
// Rule (compressed_tensors.quantization.lifecycle.forward.dequantize), in fp32:
//   W[r][c] = (q[r][c] - zp[r / block_rows][g(c)]) * scale[r / block_rows][g(c)]
// with g(c) = c / block_cols, or g_idx[c] when `weight_g_idx` is stored (activation ordering).
// Per tensor is one block of the whole matrix, per channel [1, cols], per group [1, group_size],
// per block [block_rows, block_cols]. The reference computes in the scale's dtype (bf16) and so
// rounds the product; in fp32 the product of a <= 9-bit integer and a bf16 scale is exact.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "stage/model/quant/fp8_block.h"
#include "stage/model/quant/quant_tensor.h"

namespace ringserve::quant {

// Unpacks `packed` (I32; [rows, ceil(cols / per_word)] when packed_dim is 1, [ceil(rows /
// per_word), cols] when 0; per_word = 32 / bits) into signed values [rows, cols], row-major.
// bits in [1, 8]. InvalidArgument naming the tensor for a wrong dtype or shape.
absl::StatusOr<std::vector<int8_t>> UnpackCompressedInt32(const QTensor& packed, int bits,
                                                          int64_t rows, int64_t cols,
                                                          int packed_dim);

struct IntDequantArgs {
  int64_t rows = 0;
  int64_t cols = 0;
  Fp8BlockGrid grid;  // scale grid as in fp8_block.h; [rows, cols] is one block per tensor
  // [R, C] = [ceil(rows / block_rows), ceil(cols / block_cols)] zero points; empty = symmetric.
  std::vector<int8_t> zero_points = {};
  // [cols] group of each column (0 <= g < C); empty = c / block_cols.
  std::vector<int64_t> g_idx = {};
};

// The integer rule above. `q` [rows, cols]; `scale` F32/BF16/F16 holding R * C values ([R, C], or
// [R] / [R, 1] when C is 1, or [] / [1] per tensor). Returns W [rows, cols] fp32.
absl::StatusOr<std::vector<float>> DequantizeCompressedInt(std::span<const int8_t> q,
                                                           const QTensor& scale,
                                                           const IntDequantArgs& args);

}  // namespace ringserve::quant
