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

// The MLP's down projection fused with its activation: y[m, n] = act[m, :] . w[n, :] with
// act = bf16(silu(gate_up[:, :k]) * gate_up[:, k:]) computed on the fly (LaunchSiluMul's
// values). gate_up: [m, 2k] bf16; w: [n, k] bf16; y: [m, n] bf16. Same limits as LaunchGemv.
absl::Status LaunchGemvSiluMul(const bf16* gate_up, const bf16* w, bf16* y, int m, int n, int k,
                               cudaStream_t stream);

}  // namespace ringserve::cuda
