// FP8 (float8_e4m3fn) weights with fp32 scales over a grid of blocks: the one rule behind
// `quant_method: fp8` (DeepSeek-V3 / Qwen fine-grained FP8: `weight` + `weight_scale_inv`,
// 128x128 blocks) and compressed-tensors `float-quantized` (`weight` + `weight_scale`, per
// tensor, per channel, per group or per block).
//
//   W[r][c] = float(weight[r][c]) * scale[r / block_rows][c / block_cols]      (fp32 multiply)
//
// as DeepSeek's `weight_dequant` kernel and transformers' Fp8Dequantize compute it. The scale grid
// is [ceil(rows / block_rows), ceil(cols / block_cols)]: edge blocks are partial (DeepSeek writes
// such shapes; transformers' own quantizer only divisible ones). Per tensor is one block of the
// whole matrix, per channel blocks of [1, cols], per group [1, group_size].
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "stage/model/quant/quant_tensor.h"

namespace ringserve::quant {

struct Fp8BlockGrid {
  int64_t block_rows = 0;  // > 0
  int64_t block_cols = 0;  // > 0
};

// `weight`: F8_E4M3 [rows, cols]. `scale`: F32, BF16, F16 or F8_E8M0 (ue8m0 scales) holding
// ceil(rows / block_rows) * ceil(cols / block_cols) values, shaped [R, C], or [R] / [R, 1] when C
// is 1, or [] / [1] when both are 1. Returns W [rows, cols] fp32, row-major. InvalidArgument
// naming the tensor for any other dtype or shape.
absl::StatusOr<std::vector<float>> DequantizeFp8(const QTensor& weight, const QTensor& scale,
                                                 Fp8BlockGrid grid);

}  // namespace ringserve::quant
