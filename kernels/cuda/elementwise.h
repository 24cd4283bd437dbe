// Element-wise and per-row ops of the decoder: RMSNorm fused with the residual add, SiLU-and-
// multiply, embedding gather, dtype conversions. All pointers are device memory, row-major; all
// launches are asynchronous on `stream` and return the launch status (InvalidArgument for bad
// sizes). bf16 storage, fp32 math. The residual stream is kept in fp32.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_utils.h"

namespace ringserve::cuda {

// For each row r < rows:
//   if delta: residual[r, :] += delta[r, :] (+ bias[:])   (fp32 += bf16)
//   out[r, :] = bf16(residual[r, :] * rsqrt(mean(residual[r, :]^2) + eps) * weight[:])
// residual: [rows, dim] fp32 (in/out); delta: [rows, dim] bf16 or nullptr; bias: [dim] bf16 or
// nullptr (the bias of the projection that produced delta); weight: [dim] bf16; out: [rows,
// dim] bf16, or nullptr to only add.
absl::Status LaunchAddRmsNorm(float* residual, const bf16* delta, const bf16* bias,
                              const bf16* weight, bf16* out, int64_t rows, int dim, float eps,
                              LaunchStream stream);

// out[r, i] = bf16(silu(gate_up[r, i]) * gate_up[r, inter + i]), silu(x) = x / (1 + exp(-x)).
// gate_up: [rows, 2 * inter] bf16 (gate half first, as the fused gate/up projection writes
// it); out: [rows, inter] bf16.
absl::Status LaunchSiluMul(const bf16* gate_up, bf16* out, int64_t rows, int inter,
                           LaunchStream stream);

// out[t, :] = float(table[ids[t], :]). table: [vocab, hidden] bf16; ids: [n] int32 device,
// each in [0, vocab) (the caller validates); out: [n, hidden] fp32.
absl::Status LaunchEmbedding(const bf16* table, const int32_t* ids, float* out, int64_t n,
                             int hidden, LaunchStream stream);

// dst[i] = bf16(src[i]) (round to nearest even) / dst[i] = float(src[i]), n elements.
absl::Status LaunchF32ToBF16(const float* src, bf16* dst, int64_t n, LaunchStream stream);
absl::Status LaunchBF16ToF32(const bf16* src, float* dst, int64_t n, LaunchStream stream);
// dst[i] = bf16(half src[i]); src holds fp16 bit patterns.
absl::Status LaunchF16ToBF16(const uint16_t* src, bf16* dst, int64_t n, LaunchStream stream);

// dst[r, :] = src[rows[r], :] for r < num_rows. src: [*, dim] bf16; rows: [num_rows] int32
// device; dst: [num_rows, dim] bf16.
absl::Status LaunchGatherRows(const bf16* src, const int32_t* rows, bf16* dst, int num_rows,
                              int dim, LaunchStream stream);

// Fills dst[0, n) with bf16(center + scale * u), u uniform in [-1, 1) from a counter-based hash
// of (seed, i): the same seed gives the same values on any device. For random-weight models.
absl::Status LaunchFillRandom(bf16* dst, int64_t n, uint64_t seed, float center, float scale,
                              LaunchStream stream);

}  // namespace ringserve::cuda
