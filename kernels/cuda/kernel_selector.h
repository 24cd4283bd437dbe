// The kernel selector: which CUDA kernel runs for each op of a model slice, decided once from
// the device, the code this build compiled, the model's attention shape and KernelOptions (as
// ggml-cuda's flash-attention selector does). Dispatch (CudaModelSlice, stage_bench), workspace
// sizes (the skinny GEMM's) and "supported" checks (attention shapes) all read its KernelPlan,
// so no kernel choice is made anywhere else and none is process-wide state.
//
// It knows which architectures were compiled: a build that carries only compute_80 code runs,
// on an H200, exactly the sm_80 paths (no dependent launch, no wgmma prefill) — how A100-class
// and CMP 170HX users' kernels are tested on the H200.
//
// Pure functions over values: no CUDA headers, no device access, thread-safe.
// QueryDeviceInfo / CompiledKernels (device_info.h) read the real device and build.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/kernel_options.h"

namespace ringserve::cuda {

// The device the kernels run on (cudaDeviceProp's values).
struct DeviceInfo {
  int compute_capability = 0;  // major * 10 + minor: 80 (A100), 86, 89, 90 (H100 / H200)
  int num_sms = 0;
  int max_shared_memory_per_block_optin = 0;  // bytes a CTA may opt in to
};

// What the build compiled (device_info.h's CompiledKernels() for this binary).
struct CompiledKernels {
  // The virtual architectures of the kernels' code (nvcc's __CUDA_ARCH_LIST__ / 10), ascending:
  // {80, 90} for CMAKE_CUDA_ARCHITECTURES "80;90". Each is assumed to carry PTX or a matching
  // SASS (CMake's plain "80" builds both).
  std::vector<int> archs;
  // The Hopper wgmma kernels were compiled (prefill attention and MLA decode: their own sm_90a
  // object, when the build targets 90).
  bool sm90a_prefill = false;
};

// The architecture whose code runs on a device of `compute_capability`: the newest compiled arch
// not newer than the device (0 when none is). The kernels see it as __CUDA_ARCH__ / 10.
int CodeArchFor(int compute_capability, const std::vector<int>& archs);

// The model's attention shape.
struct AttentionDims {
  int head_dim = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
};

// Shared memory a tensor-core decode attention CTA needs (decode_attention_tc.cu asserts it).
inline constexpr int kDecodeAttentionTcSmemBytes = 100 * 1024;
// Decode attention limits (decode_merge.cuh): query heads one CTA handles, and those heads *
// head_dim. A kv head's larger group (GLM-4.5: 12) is cut into DecodeHeadParts parts of at most
// DecodeHeadsPerCta heads (the CUDA-core kernel; the tensor-core one takes groups <= 8).
inline constexpr int kDecodeMaxGroup = 8;
inline constexpr int kDecodeMaxGroupDim = 1024;
constexpr int DecodeHeadParts(int group) { return (group + kDecodeMaxGroup - 1) / kDecodeMaxGroup; }
constexpr int DecodeHeadsPerCta(int group) {
  return (group + DecodeHeadParts(group) - 1) / DecodeHeadParts(group);
}
// Prefill query tiles: the mma.sync kernel's (any sm_80+ device) and the wgmma kernel's.
inline constexpr int kPrefillTile = 64;
inline constexpr int kPrefillTileSm90 = 128;

enum class DecodeAttentionKernel {
  kCudaCore,    // any head_dim in {16, 32, 64, 128, 256} (decode_attention.cu)
  kTensorCore,  // head_dim 128, mma.sync, 100 KB of shared memory (decode_attention_tc.cu)
};
enum class PrefillAttentionKernel {
  kDecodeKernel,  // head_dim != 128: each query token is a decode entry (correct, slower)
  kMmaSync,       // 64-query tiles, any sm_80+ device (prefill_attention.cu)
  kWgmmaSm90,     // 128-query tiles, compute capability 9.0 only (prefill_attention_sm90.cu)
};

enum class MoeGemmKernel {
  kWmma,       // any sm_80+ device (moe_gemm.cu)
  kWgmmaSm90,  // compute capability 9.0 only (moe_gemm_sm90.cu)
};
enum class MlaDecodeKernel {
  kMmaSync,    // any sm_80+ device (mla_decode.cu)
  kWgmmaSm90,  // compute capability 9.0 only (mla_decode_sm90.cu)
};

// The GEMM runner's settings (GemmOptions' kernel fields).
struct GemmPlan {
  int gemv_max_rows = 1;
  int skinny_max_rows = 0;            // 0: the skinny GEMM is neither tuned nor allocated
  size_t skinny_workspace_bytes = 0;  // 0 when skinny_max_rows is 0
  bool tune = true;
  bool tune_cold_cache = true;
  // (Spelled out: the .cu files that include this header are C++17.)
  bool operator==(const GemmPlan& o) const {
    return gemv_max_rows == o.gemv_max_rows && skinny_max_rows == o.skinny_max_rows &&
           skinny_workspace_bytes == o.skinny_workspace_bytes && tune == o.tune &&
           tune_cold_cache == o.tune_cold_cache;
  }
};

struct KernelPlan {
  int code_arch = 0;  // CodeArchFor(the device)
  bool dependent_launch = false;
  bool early_graph_launch = false;  // only with dependent_launch
  DecodeAttentionKernel decode_attention = DecodeAttentionKernel::kCudaCore;
  // Decode attention CTAs one SM holds (sizes split-K: PlanDecodeSplits).
  int decode_ctas_per_sm = 3;
  PrefillAttentionKernel prefill_attention = PrefillAttentionKernel::kDecodeKernel;
  int prefill_tile_rows = 0;  // kPrefillTile or kPrefillTileSm90; 0 with kDecodeKernel
  int prefill_key_tile = 64;  // the wgmma kernel's K/V tile (kWgmmaSm90 only)
  // DeepSeek's latent attention (decode and prefill entries); models with fewer heads than one
  // wgmma tile still run mma.sync (MlaDecodeKernelFor).
  MlaDecodeKernel mla_decode = MlaDecodeKernel::kMmaSync;
  // The MoE layers' grouped expert GEMM (prefill-sized steps).
  MoeGemmKernel moe_gemm = MoeGemmKernel::kWmma;
  GemmPlan gemm;
  bool fuse_decode_kernels = true;
  bool merge_splits_in_attention = false;  // KernelOptions::merge_splits_in_attention
  int num_sms = 0;

  // One line for logs: "sm_90 code 90: decode tensor-core, prefill wgmma 128q/64k, pdl+early,
  // gemv<=1, skinny off, tuned cold, fused".
  std::string Summary() const;
};

// InvalidArgument when the decode attention kernels cannot run the shape (head_dim in {8, 16,
// 32, 64, 128, 256}, num_heads a multiple of num_kv_heads, DecodeHeadsPerCta(group) * head_dim
// <= 1024).
absl::Status CheckAttentionSupported(const AttentionDims& dims);

// The plan for a device, build, model shape and options. FailedPrecondition when the build has
// no code the device runs or the device is older than sm_80; InvalidArgument for bad options
// (ValidateKernelOptions) or an unsupported attention shape (CheckAttentionSupported).
absl::StatusOr<KernelPlan> SelectKernels(const DeviceInfo& device, const CompiledKernels& compiled,
                                         const AttentionDims& dims, const KernelOptions& options);

// ---- Per-step choices (a micro-batch's shape against the plan) ----

// Whether the normalized input rows of a GEMV (m rows of k bf16 values) fit the 48 KiB of shared
// memory each GEMV block normalizes them into (gemv.h's RmsNormedInput).
constexpr bool GemvNormedInputFits(int m, int k) {
  return static_cast<int64_t>(m) * k * 2 <= 48 * 1024;
}

struct StepShape {
  int tokens = 0;           // rows of the step (a decode graph: its padded bucket)
  int hidden_size = 0;      // the GEMVs' k for the normalized input
  bool all_decode = false;  // every chunk one token of a sequence no other chunk continues
  bool qk_norm = false;     // the model normalizes q and k per head (Qwen3)
};
struct StepKernels {
  // RMSNorms and residual adds folded into the GEMVs (GEMV sizes, fuse_decode_kernels).
  bool fused_norms = false;
  // The attention input stage (bias, rotation, K/V store) in the q/k/v GEMV, or in the decode
  // attention kernel (LaunchDecodeAttentionFromQkv); else its own kernel (LaunchQkvPrepare).
  bool qkv_in_gemv = false;
  bool qkv_in_attention = false;
  // Unfused gate/up projection and SiLU in one GEMV kernel (tokens <= gemv_max_rows).
  bool gate_up_gemv = false;
};
StepKernels SelectStepKernels(const KernelPlan& plan, const StepShape& step);

// ---- Decode split-K ----

inline constexpr int kDecodePartition = 512;
// No split is shorter than this many keys (splits are multiples of it).
inline constexpr int kMinDecodePartition = 32;
// Splits needed so that every context up to max_context fits in pieces of `partition` keys.
inline int DecodeSplitsFor(int max_context, int partition = kDecodePartition) {
  return max_context <= partition ? 1 : (max_context + partition - 1) / partition;
}
struct DecodeSplitPlan {
  int partition = kDecodePartition;  // keys per split
  int splits = 1;
};
// As many splits as fit one wave of the decode kernel (ctas_per_sm CTAs per SM; num_entries x
// num_kv_heads x splits CTAs in all) — never a second, partial wave, and no split (and no merge
// kernel) when the batch alone fills the GPU — but no split shorter than kMinDecodePartition keys;
// partition * splits >= max_context. Measured on an H200 (Llama-3.1-8B shape, 32 sequences of 160
// keys): 2 splits = 1.3 waves took 27.4 us + 5.3 us of merge, where the batch alone is 256 CTAs.
DecodeSplitPlan PlanDecodeSplitsForCtas(int num_entries, int num_kv_heads, int max_context,
                                        int ctas_per_sm, int num_sms);
inline DecodeSplitPlan PlanDecodeSplits(const KernelPlan& plan, int num_entries, int num_kv_heads,
                                        int max_context) {
  return PlanDecodeSplitsForCtas(num_entries, num_kv_heads, max_context, plan.decode_ctas_per_sm,
                                 plan.num_sms);
}

}  // namespace ringserve::cuda
