// Our own memory-bound GEMV for decode-sized batches (see gemm.h for the dispatch), and its
// variants that fold the decoder's neighbouring per-row ops into the projection.
#pragma once

#include "absl/status/status.h"
#include "kernels/cuda/cuda_utils.h"
#include "kernels/cuda/kernel_selector.h"  // kGemvMaxRows, GemvNormedInputFits
#include "kernels/cuda/rope.h"             // QkvStore

namespace ringserve::cuda {

enum class OutType { kBF16, kF32 };

// y[m, n] = sum_k x[m, k] * w[n, k], fp32 accumulation, 1 <= m <= kGemvMaxRows.
// x: [m, k] bf16; w: [n, k] bf16; y: [m, n] of `out`; all device, row-major; k a multiple of 8,
// pointers 16-byte aligned. One warp per output column; reads w once. Under dependent launch
// (dependent_launch.cuh) every GEMV here reads its first weights before waiting for the previous
// kernel: w must not be written by the kernels before it on the stream. kGemvMaxRows is 8.
absl::Status LaunchGemv(const bf16* x, const bf16* w, void* y, OutType out, int m, int n, int k,
                        LaunchStream stream);

// The MLP's gate/up projection fused with its activation: act[m, j] = bf16(silu(g) * u) with
// g = bf16(x[m, :] . w_gate_up[j, :]) and u = bf16(x[m, :] . w_gate_up[inter + j, :]) — the
// values LaunchSiluMul stores after the gate_up GEMM, without the [m, 2 inter] intermediate or
// its kernel. w_gate_up: [2 inter, k] bf16 (gate rows, then up rows); act: [m, inter] bf16.
// Same limits as LaunchGemv (on inter as n).
absl::Status LaunchGemvGateUpSilu(const bf16* x, const bf16* w_gate_up, bf16* act, int m, int inter,
                                  int k, LaunchStream stream);

// ---- Decode-layer fusions (the CUDA slice runs them at GEMV sizes) ----
//
// An input given as the RMSNorm of the fp32 residual stream: the GEMV's x is
//   x[r, :] = bf16(residual[r, :] * rsqrt(mean(residual[r, :]^2) + eps) * weight[:]),
// what LaunchAddRmsNorm writes without a delta. Every block normalizes the m rows into its
// shared memory before it streams its weight rows, so the norm costs no kernel of its own.
// residual: [m, k] fp32, 16-byte aligned; weight: [k] bf16.
struct RmsNormedInput {
  const float* residual = nullptr;
  const bf16* weight = nullptr;
  float eps = 0;
};
// GemvNormedInputFits(m, k) (kernel_selector.h): whether m normalized rows of k values fit the
// blocks' shared memory (m * k * 2 <= 48 KiB).
// LaunchGemv (bf16 out) / LaunchGemvGateUpSilu on the normalized rows; needs
// GemvNormedInputFits(m, k) besides their own limits.
absl::Status LaunchGemvNormed(const RmsNormedInput& x, const bf16* w, bf16* y, int m, int n, int k,
                              LaunchStream stream);
absl::Status LaunchGemvGateUpSiluNormed(const RmsNormedInput& x, const bf16* w_gate_up, bf16* act,
                                        int m, int inter, int k, LaunchStream stream);
// LaunchGemvNormed into the q/k/v projection followed by LaunchQkvPrepare (no q/k norms), in one
// kernel and without the [m, qkv width] buffer: the same values, bit for bit (the same dot
// products, rounded to bf16, then bias, rotation and stores as rope.cu). w_qkv: [(num_heads + 2 *
// num_kv_heads) * head_dim, k] bf16, q heads then k then v; head_dim a multiple of 8.
absl::Status LaunchGemvNormedQkvRope(const RmsNormedInput& x, const bf16* w_qkv,
                                     const QkvStore& out, int m, int k, LaunchStream stream);
// The projection that ends an attention or MLP block, added into the residual stream:
//   residual[r, j] += float(bf16(x[r, :] . w[j, :])) + bias[j]   (bias may be null),
// the values LaunchGemv (bf16 out) followed by LaunchAddRmsNorm's add store (at k >= 8192 two
// warps share a column, each half of k: the dot product's summation order differs, not its
// rounding). residual: [m, n] fp32. Same limits as LaunchGemv.
absl::Status LaunchGemvAddResidual(const bf16* x, const bf16* w, const bf16* bias, float* residual,
                                   int m, int n, int k, LaunchStream stream);

}  // namespace ringserve::cuda
