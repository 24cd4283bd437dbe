// Tensor-core GEMM for decode batches of 1 to 64 rows: y[m, n] = x[m, :] . w[n, :], streaming
// the weights once. cuBLASLt's tiles are built for large m (on an H200 it read the
// Llama-3.1-8B qkv and o matrices at 49-73% of copy bandwidth at 1-8 rows); the GEMV (gemv.h)
// is one warp per output column. GemmRunner::Tune times this kernel against both and keeps the
// fastest per shape: on an H200 it wins for qkv and o at 1-8 rows (73-82% and 71-77%) and loses
// at 32-64 rows, where it is latency-bound (bench/cuda/NOTES.md, run 11).
//
// How: a block of 4 warps owns 128 weight rows, a warp 32 of them, for one part of k (blockIdx.y
// of `splits`). The block streams its weight rows and x rows through a ring of shared-memory
// stages of kSkinnyStageK values with cp.async (whole cache lines) and its warps feed mma.sync
// from there. With splits > 1 the parts of a row block run as one thread-block cluster and add
// their fp32 partial sums through distributed shared memory, in part order 0, 1, ..., so the
// result does not depend on timing. Under dependent launch (dependent_launch.cuh) the first
// weights are copied before waiting for the previous kernel: w must not be written by the kernels
// before it on the stream.
#pragma once

#include "absl/status/status.h"
#include "kernels/cuda/cuda_utils.h"
#include "kernels/cuda/gemv.h"  // OutType

namespace ringserve::cuda {

inline constexpr int kSkinnyMaxRows = 64;
inline constexpr int kSkinnyRowsPerBlock = 128;  // weight rows (output columns) per block
inline constexpr int kSkinnyStageK = 64;         // k values per pipeline stage
inline constexpr int kSkinnyMaxSplits = 8;       // parts of k: the portable cluster size

// x: [m, k] bf16; w: [n, k] bf16; y: [m, n] of `out`; all device, row-major, 16-byte aligned;
// 1 <= m <= kSkinnyMaxRows, k a multiple of 8, 1 <= splits <= kSkinnyMaxSplits. Asynchronous on
// `stream`, capturable in a CUDA graph. splits > 1 needs thread-block clusters (sm_90 and up;
// InvalidArgument on older GPUs).
absl::Status LaunchSkinnyGemm(const bf16* x, const bf16* w, void* y, OutType out, int m, int n,
                              int k, int splits, cudaStream_t stream);

}  // namespace ringserve::cuda
