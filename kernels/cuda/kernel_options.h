// Which CUDA kernels a model slice may use: every kernel choice of kernels/cuda in one value,
// carried in the slice's options (CudaSliceOptions::kernels). There is no process-wide switch:
// the selector (kernel_selector.h) turns these options, the device and the build into a
// KernelPlan once per slice, and dispatch, workspace sizes and "supported" checks read the plan.
//
// The defaults are what the H200 measured fastest (bench/cuda/NOTES.md); an option a device or
// build cannot honour is dropped by the selector, never an error (e.g. dependent launch on
// sm_80). Pure C++: no CUDA headers, so the selector and its tests build without a toolkit.
#pragma once

#include <cstddef>

#include "absl/status/status.h"

namespace ringserve::cuda {

// Limits of the GEMV (rows per launch) and of the skinny GEMM (rows per launch).
inline constexpr int kGemvMaxRows = 8;
inline constexpr int kSkinnyMaxRows = 64;

struct KernelOptions {
  // Programmatic dependent launch of the decode-path kernels (dependent_launch.cuh): a kernel is
  // scheduled while its predecessor drains. Needs a compute capability 9.0+ device running code
  // compiled for sm_90+.
  bool dependent_launch = true;
  // In decode graphs, the kernels after cuBLASLt GEMMs launch when the GEMM has started instead
  // of when it has drained (graph_edges.h). Needs dependent_launch.
  bool early_graph_launch = true;
  // Head dim 128 decode attention on tensor cores (decode_attention_tc.cu) where the device gives
  // a CTA its 100 KB of shared memory; false: the CUDA-core kernel (as on sm_86 / sm_89).
  bool decode_attention_tensor_cores = true;
  // Prefill attention with Hopper's wgmma kernel (128-query tiles) on compute capability 9.0 when
  // the build has its sm_90a code; false: the mma.sync kernel (64-query tiles), as on sm_80.
  bool prefill_attention_sm90 = true;
  // DeepSeek's latent attention with Hopper's wgmma kernel (64-head tiles, mla_decode_sm90.cu)
  // on compute capability 9.0 when the build has its sm_90a code; false: the mma.sync kernel.
  // On an H100, 32 streams at 32k context: 0.81 ms a layer against 2.70 for mma.sync
  // (`mla_decode_bench`, bench/cuda/MLA_NOTES.md).
  bool mla_decode_sm90 = true;
  // MoE layers' grouped expert GEMM (prefill) with Hopper's wgmma kernel (moe_gemm_sm90.cu) on
  // compute capability 9.0 when the build has its sm_90a code; false: the WMMA kernel. On an
  // H100, Qwen3-30B-A3B's 8k prefill: 366 TFLOP/s against 251 (`moe_bench --moe_gemm`).
  bool moe_gemm_sm90 = true;
  // FP8 block-scaled checkpoints' prefill GEMMs with our wgmma kernel (fp8_gemm_sm90.h) where
  // cuBLASLt has no block-scaled FP8 algorithm (before 12.9); false: dequantize to bf16 there
  // and cuBLASLt's bf16 GEMM. Off: on an H100 the 8k prefill of the Llama-3.1-8B shape ran at
  // 0.83x of bf16 through it against ~0.99x dequantizing (bench/cuda/NOTES.md).
  bool fp8_gemm_sm90 = false;
  // Split decode attention merges its splits in the CTA that finishes last (DecodeBatch::
  // split_tickets; up to kMaxSplitsMergedByCta splits) instead of a merge kernel after it. Off:
  // not yet run on a GPU (`stage_bench --merge_splits_in_attention` for the A/B run; the kernel
  // test compares both ways bit for bit).
  bool merge_splits_in_attention = false;
  // Keys per K/V tile of the wgmma prefill kernel: 64 (97 KB of shared memory, two CTAs per SM;
  // on an H200 the 8k causal attention took 1.33-1.37 ms against 1.66-1.78 with 128) or 128.
  int prefill_key_tile_sm90 = 64;
  // GEMMs with m <= gemv_max_rows run our GEMV (gemv.h) unless tuning finds cuBLASLt faster; at
  // such sizes the decode fusions fold norms and residual adds into the GEMVs. 0..kGemvMaxRows
  // (8). On an H200 the GEMV wins only at m = 1.
  int gemv_max_rows = 1;
  // GEMM tuning also times the skinny tensor-core GEMM (skinny_gemm.h) for m <= skinny_max_rows
  // (0..64). Off (0) by default: on an H200 cuBLASLt was faster at every decode shape, and the
  // kernel costs skinny_workspace_bytes of device memory and tuning time.
  int skinny_max_rows = 0;
  size_t skinny_workspace_bytes = size_t{40} << 20;  // allocated only when skinny_max_rows > 0
  // Time cuBLASLt's candidates (and the GEMV / skinny GEMM) per decode GEMM shape before a graph
  // is captured (GemmRunner::Tune); false: the heuristic's first algorithm.
  bool tune_gemms = true;
  // Tuning times each call with the operands evicted from L2 first (as a decode step meets
  // them); false: left warm by the call before (for A/B measurements).
  bool tune_cold_cache = true;
  // Decode fusions (CudaModelSlice::RunLayer): at GEMV sizes the RMSNorms, residual adds and the
  // attention input stage fold into the GEMVs; in other all-decode steps the attention input
  // stage folds into the tensor-core decode attention kernel.
  bool fuse_decode_kernels = true;
};

// InvalidArgument naming the field for values out of range (prefill_key_tile_sm90 not 64 or
// 128, gemv_max_rows not in [0, 8], skinny_max_rows not in [0, 64], a skinny workspace too
// small for its counters when the skinny GEMM is on).
absl::Status ValidateKernelOptions(const KernelOptions& options);

}  // namespace ringserve::cuda
