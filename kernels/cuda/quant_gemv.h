// Weight-only quantized linear layers: y = x · W^T with W held quantized in device memory and
// dequantized in registers, bf16 activations, fp32 accumulation.
//
// Layout (stage/model/quant/packed_matrix.h writes it on the host; one layout for every
// checkpoint format, repacked at load):
//   codes  [rows, cols * bits / 8] row-major; 4-bit codes two a byte, the even column low
//   scales [rows, groups] fp32, groups = ceil(cols / group_cols); integer formats store a pair
//          {scale, zero} per group (float2), W = (code - zero) * scale
//   int4 / int8: unsigned codes;  fp8: e4m3 * scale;  fp4: e2m1 * scale (MXFP4's e8m0 block
//   scales are powers of two, exact in fp32).
// Kernels read 16 bytes of codes per lane (32 4-bit or 16 8-bit values): cols and group_cols
// must be multiples of QuantChunk(format) (QuantMatrixSupported); codes and x 16-byte aligned.
// Conversions are exact in fp16 (code - zero for integers, e4m3 and e2m1 bit-shifted into fp16),
// so the same kernels run on sm_80 and newer.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_utils.h"

namespace ringserve::cuda {

enum class QuantFormat { kInt4, kInt8, kFp8, kFp4 };

struct QuantMatrixView {
  QuantFormat format = QuantFormat::kInt4;
  int rows = 0;
  int cols = 0;
  int group_cols = 0;
  const uint8_t* codes = nullptr;
  const float* scales = nullptr;  // float2 pairs for integer formats
  // fp8 with groups of 128 columns only, optional: the same scales in the layouts of cuBLASLt's
  // FP8 GEMM (fp8_block_gemm.h): [cols / 128, rows] with the row fastest, and once per 128x128
  // block [ceil(rows / 128), Fp8BlockScaleStride(cols)] when every block has one scale (FP8
  // checkpoints with weight_block_size [128, 128]); null otherwise.
  const float* row_scales_t = nullptr;
  const float* block_scales = nullptr;
};

int QuantBits(QuantFormat format);
int QuantChunk(QuantFormat format);
int64_t QuantCodeBytes(QuantFormat format, int64_t rows, int64_t cols);
int64_t QuantScaleBytes(QuantFormat format, int64_t rows, int64_t cols, int64_t group_cols);
// cols and group_cols positive multiples of QuantChunk(format), rows positive.
bool QuantMatrixSupported(QuantFormat format, int64_t rows, int64_t cols, int64_t group_cols);

// Rows [row0, row0 + rows) of `w` as a view of their own (codes and scales offset; the FP8 GEMM
// layouts dropped). The codes stay 16-byte aligned since cols is a multiple of the chunk.
QuantMatrixView QuantRowSlice(const QuantMatrixView& w, int64_t row0, int rows);

// y[m, rows] (bf16) = x[m, cols] (bf16) · W^T for 1 <= m <= kQuantGemvMaxRows: one warp per
// output row streams the row's codes once (decode).
inline constexpr int kQuantGemvMaxRows = 8;
absl::Status LaunchQuantGemv(const bf16* x, const QuantMatrixView& w, bf16* y, int m,
                             LaunchStream stream);

// out[rows, cols] bf16 = W (each value rounded once to bf16), for the GEMM path of many rows.
absl::Status LaunchQuantDequantize(const QuantMatrixView& w, bf16* out, LaunchStream stream);

}  // namespace ringserve::cuda
