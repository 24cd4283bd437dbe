// Weight-only quantized linear layers on tensor cores for a few to a few dozen activation rows
// (decode, decode batches): y[m, rows] (bf16) = x[m, cols] (bf16) · W^T, W in the layout of
// quant_gemv.h (row-major codes, per row and group scales), dequantized in registers.
//
// How: mma.sync m16n8k16 bf16 with W as the A operand (16 output rows) and x as B (8 tokens), so
// one MMA covers up to 8 tokens. Each lane loads 16 contiguous bytes of codes of two rows (4 or 1
// bytes when the groups are smaller than a 16-byte block: see kernels/cuda/quant_mma.cu) and the
// k order inside the MMA is permuted to the codes' order (x permuted alike), so no shared memory
// and no repacked layout are needed. Codes become exact bf16 values: integers as code - zero
// (|value| <= 255, exact in bf16; zero points integral, as every loader writes them), e4m3 and
// e2m1 by bit shifts and an exact power-of-two multiply. The group scale multiplies the fp32
// partial sum of each block of columns, so W is never rounded: the result is the fp32 product of
// the exact weights with x up to the tensor cores' fp32 accumulation. Eight warps split the
// columns and sum their partials in shared memory. sm_80 and newer.
//
// Capturable in CUDA graphs (no host synchronization, no allocation). With a dependent
// LaunchStream (dependent_launch.cuh) the kernel loads its first weights before it waits for the
// kernel before it: only x and y are touched after the wait.
#pragma once

#include "absl/status/status.h"
#include "kernels/cuda/quant_gemv.h"

namespace ringserve::cuda {

// The most activation rows LaunchQuantMma takes; above, the caller dequantizes and runs a GEMM.
inline constexpr int kQuantMmaMaxRows = 64;

// The kernel's shape: `warps` (4 or 8) split the columns of one 16-row tile for each 8 tokens,
// each a contiguous range of column blocks or (interleaved) every warps-th block; with
// large_tiles, more than 8 tokens run as 32-row x 32-token tiles on 8 warps instead (codes read
// once per 32 tokens, more registers). The defaults are the fastest measured on an H100
// (bench/cuda/NOTES.md); RS_QUANT_MMA_WARPS=4|8, RS_QUANT_MMA_SPLIT=interleaved|contiguous and
// RS_QUANT_MMA_LARGE=tiles|groups override them for benchmarks.
struct QuantMmaShape {
  int warps = 8;
  bool interleaved = false;
  bool large_tiles = true;
};
QuantMmaShape QuantMmaShapeFromEnv();

// 1 <= m <= kQuantMmaMaxRows; x and y 16-byte aligned, x row-major [m, w.cols], y [m, w.rows].
// InvalidArgument for an unsupported view (QuantMatrixSupported) or m.
absl::Status LaunchQuantMma(const bf16* x, const QuantMatrixView& w, bf16* y, int m,
                            LaunchStream stream);

}  // namespace ringserve::cuda
