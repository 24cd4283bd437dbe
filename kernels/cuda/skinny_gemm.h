// Tensor-core GEMM for decode batches of 1 to 64 rows: y[m, n] = x[m, :] . w[n, :], streaming
// the weights once at close to copy bandwidth. cuBLASLt's tiles are built for large m: on an
// H200 its best tuned algorithm read the Llama-3.1-8B qkv and o matrices at 58-70% of copy
// bandwidth at m = 32 (bench/cuda/NOTES.md); the GEMV (gemv.h) stops at 8 rows. GemmRunner::Tune
// times this kernel against both and keeps the fastest per shape.
//
// How: a block of 4 warps owns 128 weight rows, a warp 32 of them, for one part of k (blockIdx.y
// of `splits`). Each warp streams its rows through its own ring of shared-memory stages of
// kSkinnyStageK values with cp.async (whole cache lines, 12 KB in flight per warp) and feeds
// mma.sync from there; x is read straight from global memory (L1 serves the block's 4 warps).
// With splits > 1 each part writes fp32 partial sums to the workspace and the last block of a row
// block to finish (an atomic counter per row block) adds the parts in order 0, 1, ..., so the
// result does not depend on timing. Under dependent launch (dependent_launch.cuh) the first
// weights are read before waiting for the previous kernel: w must not be written by the kernels
// before it on the stream.
#pragma once

#include <cstddef>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_utils.h"
#include "kernels/cuda/gemv.h"  // OutType

namespace ringserve::cuda {

inline constexpr int kSkinnyMaxRows = 64;
inline constexpr int kSkinnyRowsPerBlock = 128;  // weight rows (output columns) per block
inline constexpr int kSkinnyStageK = 64;         // k values per pipeline stage

// Scratch a launch with `splits` parts needs (none for 1): the fp32 partial sums,
// splits * m * n floats. Shared with cuBLASLt's workspace is fine: both run in stream order.
size_t SkinnyGemmPartialBytes(int m, int n, int splits);
// Counters a launch with splits > 1 needs: one int per row block, ceil(n / 128); they must be
// zero before the first launch and every launch leaves them zero.
int SkinnyGemmCounters(int n);

// x: [m, k] bf16; w: [n, k] bf16; y: [m, n] of `out`; all device, row-major, 16-byte aligned;
// 1 <= m <= kSkinnyMaxRows, k a multiple of 8, 1 <= splits <= 64. `partials` (fp32,
// `partial_bytes` long) and `counters` (`num_counters` ints) as above; both may be null for
// splits == 1. Asynchronous on `stream`, capturable in a CUDA graph; two launches sharing
// counters or partials must be ordered (one stream).
absl::Status LaunchSkinnyGemm(const bf16* x, const bf16* w, void* y, OutType out, int m, int n,
                              int k, int splits, float* partials, size_t partial_bytes,
                              int* counters, int num_counters, cudaStream_t stream);

}  // namespace ringserve::cuda
