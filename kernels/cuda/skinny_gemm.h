// Tensor-core GEMM for decode batches of 1 to 64 rows: y[m, n] = x[m, :] . w[n, :], streaming
// the weights once. cuBLASLt's tiles are built for large m (on an H200 it read the
// Llama-3.1-8B qkv and o matrices at 49-73% of copy bandwidth at 1-8 rows); the GEMV (gemv.h)
// is one warp per output column. GemmRunner::Tune times this kernel against both, over several
// grid sizes, and keeps the fastest per shape. On an H200, timed with the weights coming from
// DRAM, cuBLASLt was faster at every Llama-3.1-8B decode shape (by 5-15% at 1-8 rows, 1.1-1.4x
// at 32 and 1.3-2.2x at 64: bench/cuda/NOTES.md, run 12), so it is off by default
// (KernelOptions::skinny_max_rows 0: no workspace, no tuning time); it stays a candidate to ask
// for on other GPUs (stage_bench's "skinny" rows time it).
//
// How: the weights are cut into row blocks of 128 rows (output columns) and each row block's k
// into stages of kSkinnyStageK values. The row blocks' stages, in order, form one list that the
// thread blocks share out in equal contiguous runs ("stream-K": `blocks` rounded so that every run
// but the last has the same length), so the blocks stream the same number of weight bytes
// whatever n and k are.
// A block of 4 warps (a warp 32 weight rows) streams its weights and x through a ring of
// shared-memory stages with cp.async (whole cache lines) and feeds mma.sync from there. A row
// block whose stages two or more blocks share is finished by the last of them to arrive (a
// counter per row block): it adds the fp32 partial sums in block order, so the result does not
// depend on timing. Under dependent launch (dependent_launch.cuh) the first weights are copied
// before waiting for the previous kernel: w must not be written by the kernels before it on the
// stream.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_utils.h"
#include "kernels/cuda/gemv.h"            // OutType
#include "kernels/cuda/kernel_options.h"  // kSkinnyMaxRows (64)

namespace ringserve::cuda {

inline constexpr int kSkinnyRowsPerBlock = 128;  // weight rows (output columns) per row block
inline constexpr int kSkinnyStageK = 64;         // k values per pipeline stage

// Scratch of LaunchSkinnyGemm (device memory): fp32 partial sums of shared row blocks and one
// arrival counter per row block. The counters are zero before the first launch and every launch
// leaves them zero; launches sharing a workspace must be ordered (one stream).
struct SkinnyWorkspace {
  float* partials = nullptr;
  int64_t partial_floats = 0;
  uint32_t* counters = nullptr;
  int64_t num_counters = 0;
};

// Allocates a workspace of about `bytes` into `buffer` (kept by the caller) and zeroes it.
absl::Status AllocateSkinnyWorkspace(size_t bytes, DeviceBuffer* buffer, SkinnyWorkspace* ws);

// The partial-sum floats a launch needs: 2 m 128 per block actually launched.
int64_t SkinnyPartialFloats(int m, int n, int k, int blocks);

// x: [m, k] bf16; w: [n, k] bf16; y: [m, n] of `out`; all device, row-major, 16-byte aligned;
// 1 <= m <= kSkinnyMaxRows, k a multiple of 8, blocks >= 1 (more than the row blocks' stages
// launches one block per stage). The workspace must hold SkinnyPartialFloats partials and
// ceil(n / 128) counters (InvalidArgument otherwise). Asynchronous on `stream`, capturable in a
// CUDA graph; the same inputs and block count give the same bits.
absl::Status LaunchSkinnyGemm(const bf16* x, const bf16* w, void* y, OutType out, int m, int n,
                              int k, int blocks, const SkinnyWorkspace& ws, LaunchStream stream);

}  // namespace ringserve::cuda
