// Our own memory-bound GEMV for decode-sized batches (see gemm.h for the dispatch).
#pragma once

#include "absl/status/status.h"
#include "kernels/cuda/cuda_utils.h"

namespace ringserve::cuda {

enum class OutType { kBF16, kF32 };

// y[m, n] = sum_k x[m, k] * w[n, k], fp32 accumulation, 1 <= m <= kGemvMaxRows.
// x: [m, k] bf16; w: [n, k] bf16; y: [m, n] of `out`; all device, row-major; k a multiple of 8,
// pointers 16-byte aligned. One warp per output column; reads w once.
inline constexpr int kGemvMaxRows = 8;
absl::Status LaunchGemv(const bf16* x, const bf16* w, void* y, OutType out, int m, int n, int k,
                        cudaStream_t stream);

// The MLP's gate/up projection fused with its activation: act[m, j] = bf16(silu(g) * u) with
// g = bf16(x[m, :] . w_gate_up[j, :]) and u = bf16(x[m, :] . w_gate_up[inter + j, :]) — the
// values LaunchSiluMul stores after the gate_up GEMM, without the [m, 2 inter] intermediate or
// its kernel. w_gate_up: [2 inter, k] bf16 (gate rows, then up rows); act: [m, inter] bf16.
// Same limits as LaunchGemv (on inter as n).
absl::Status LaunchGemvGateUpSilu(const bf16* x, const bf16* w_gate_up, bf16* act, int m, int inter,
                                  int k, cudaStream_t stream);

}  // namespace ringserve::cuda
