// Multi-head latent attention decode (DeepSeek-V2/V3) with the up-projections absorbed, over a
// paged latent cache, on tensor cores (mma.sync, sm_80+). The cache holds per token only the
// normalized latent [kMlaLatentDim] and the rotated rope key [kMlaRopeDim] (576 bf16, 1,152
// bytes per token and layer); keys and values of the heads are never expanded:
//   q_h   = [W_uk_h^T q_nope_h | q_rope_h]                    [576]  (absorbed query, the caller's)
//   s_h,t = scale * q_h . cache_t                              (latent . latent + rope . rope)
//   out_h = sum_t softmax_t(s_h,t) cache_t[0:512]             [512]  (W_uv_h maps it out later)
// i.e. multi-query attention of every head against one shared key of width 576 whose first 512
// values are also the value. The caller folds W_uk into the query and applies W_uv (and o_proj)
// to the output (batched GEMMs). fp32 softmax with max subtraction; bf16 in and out.
//
// Two kernels (MlaDecodeKernel, chosen by the caller from its KernelPlan), splits of the context
// merged by a third:
// - mma.sync (any sm_80+ device): one CTA per (entry, 16-head tile, context split), 4 warps.
//   Keys go through shared memory in tiles of 32 (cp.async, two tiles in flight); each warp
//   scores 8 keys of a tile for the 16 heads (Q . K^T over 576 dims), the CTA shares one online
//   softmax, and each warp then accumulates 128 of the 512 output dims (P . V).
// - wgmma (compute capability 9.0, a build with sm_90a code; models of >= 64 heads): one CTA of
//   two warpgroups per (entry, 64-head tile, context split), one CTA an SM; the tensor cores read
//   the query, keys and probabilities from shared memory (mla_decode_sm90.h).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_utils.h"
#include "kernels/cuda/kernel_selector.h"

namespace ringserve::cuda {

inline constexpr int kMlaLatentDim = 512;  // kv_lora_rank of DeepSeek-V2 / V2-Lite / V3
inline constexpr int kMlaRopeDim = 64;     // qk_rope_head_dim
inline constexpr int kMlaRowDim = kMlaLatentDim + kMlaRopeDim;
inline constexpr int kMlaHeadsSm90 = 64;  // heads per CTA of the wgmma kernel

// The kernel that runs a batch: `planned` (the KernelPlan's) unless the model has fewer heads
// than one wgmma tile, which the mma.sync kernel runs. Host-side, pure.
MlaDecodeKernel MlaDecodeKernelFor(MlaDecodeKernel planned, int num_heads);

// One layer's paged latent cache: position slot s of block b is the row [kMlaRowDim] bf16 at
// data + b * block_stride + s * kMlaRowDim (latent first, then the rope key).
struct MlaCacheLayer {
  bf16* data = nullptr;
  int64_t block_stride = 0;  // elements between blocks (>= block_size * kMlaRowDim)
  int block_size = 0;
};

// Entries, device memory. Entry e attends query q[e] ([num_entries, num_heads, kMlaRowDim] bf16)
// to cache positions [0, context_lens[e]) through block_tables row table_rows[e] (row e when
// table_rows is null; [*, max_blocks] int32) and writes out[e] ([num_entries, num_heads,
// kMlaLatentDim] bf16, normalized). A prefill chunk over the compressed cache is one entry per
// query token: the sequence's table row for each, context_lens = position + 1 (causal).
// context_lens[e] <= num_splits * partition is the caller's contract; 0 writes nothing.
// `workspace` holds MlaDecodeWorkspaceFloats(...) floats when num_splits > 1.
struct MlaDecodeBatch {
  const int32_t* context_lens = nullptr;
  const int32_t* table_rows = nullptr;
  const int32_t* block_tables = nullptr;
  int max_blocks = 0;
  int num_entries = 0;
  int num_splits = 1;
  int partition = 1024;  // keys per split, a multiple of 32
  float* workspace = nullptr;
  MlaDecodeKernel kernel = MlaDecodeKernel::kMmaSync;  // resolved by MlaDecodeKernelFor
};

int64_t MlaDecodeWorkspaceFloats(int num_entries, int num_heads, int num_splits);

// Splits (and the partition) for `num_entries` entries of up to `max_context` keys on `kernel`
// (MlaDecodeKernelFor's): mma.sync at least ~2 CTAs per SM; wgmma (one CTA an SM) the split
// count whose waves of CTAs finish soonest. Always num_entries * num_splits * num_heads <=
// kMlaWorkspaceRowsPerSm * num_sms when num_splits > 1 (the workspace a caller sizes once).
// Host-side, pure.
inline constexpr int kMlaWorkspaceRowsPerSm = 64;
struct MlaSplitPlan {
  int num_splits = 1;
  int partition = 1024;
};
MlaSplitPlan PlanMlaDecodeSplits(int num_entries, int num_heads, int max_context, int num_sms,
                                 MlaDecodeKernel kernel = MlaDecodeKernel::kMmaSync);

// InvalidArgument for num_heads < 1, a partition that is not a positive multiple of 32, a
// missing workspace with splits, a block_size < 1, or batch.kernel wgmma in a build without
// sm_90a code or with fewer than kMlaHeadsSm90 heads. (The device must run the chosen kernel's
// code: wgmma only on compute capability 9.0.)
absl::Status LaunchMlaDecode(int num_heads, float scale, const MlaCacheLayer& cache, const bf16* q,
                             bf16* out, const MlaDecodeBatch& batch, cudaStream_t stream);

}  // namespace ringserve::cuda
