#include "kernels/cuda/kernel_selector.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ringserve::cuda {

absl::Status ValidateKernelOptions(const KernelOptions& o) {
  if (o.prefill_key_tile_sm90 != 64 && o.prefill_key_tile_sm90 != 128) {
    return absl::InvalidArgumentError(absl::StrCat(
        "kernel options: prefill_key_tile_sm90 must be 64 or 128, got ", o.prefill_key_tile_sm90));
  }
  if (o.gemv_max_rows < 0 || o.gemv_max_rows > kGemvMaxRows) {
    return absl::InvalidArgumentError(absl::StrCat("kernel options: gemv_max_rows must be in [0, ",
                                                   kGemvMaxRows, "], got ", o.gemv_max_rows));
  }
  if (o.skinny_max_rows < 0 || o.skinny_max_rows > kSkinnyMaxRows) {
    return absl::InvalidArgumentError(
        absl::StrCat("kernel options: skinny_max_rows must be in [0, ", kSkinnyMaxRows, "], got ",
                     o.skinny_max_rows));
  }
  // The skinny workspace starts with 8192 arrival counters (skinny_gemm.cu).
  if (o.skinny_max_rows > 0 && o.skinny_workspace_bytes <= 8192 * 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("kernel options: skinny_workspace_bytes ", o.skinny_workspace_bytes,
                     " is too small for the skinny GEMM (more than 32 KiB)"));
  }
  return absl::OkStatus();
}

int CodeArchFor(int compute_capability, const std::vector<int>& archs) {
  int best = 0;
  for (int arch : archs) {
    if (arch <= compute_capability) best = std::max(best, arch);
  }
  return best;
}

absl::Status CheckAttentionSupported(const AttentionDims& dims) {
  const int d = dims.head_dim;
  if (dims.num_kv_heads <= 0 || dims.num_heads <= 0 || dims.num_heads % dims.num_kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA attention needs num_heads a positive multiple of num_kv_heads; got ",
                     dims.num_heads, " and ", dims.num_kv_heads));
  }
  const int group = dims.num_heads / dims.num_kv_heads;
  if (!(d == 8 || d == 16 || d == 32 || d == 64 || d == 128 || d == 256) ||
      DecodeHeadsPerCta(group) * d > kDecodeMaxGroupDim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA attention supports head_dim in {8,16,32,64,128,256} with at most ",
        kDecodeMaxGroupDim, " values of query heads per decode CTA; model has head_dim ", d,
        " and group (heads/kv_heads) ", group));
  }
  return absl::OkStatus();
}

absl::StatusOr<KernelPlan> SelectKernels(const DeviceInfo& device, const CompiledKernels& compiled,
                                         const AttentionDims& dims, const KernelOptions& options) {
  RS_RETURN_IF_ERROR(ValidateKernelOptions(options));
  RS_RETURN_IF_ERROR(CheckAttentionSupported(dims));
  const int cc = device.compute_capability;
  if (cc < 80) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CUDA kernels need compute capability 8.0 or newer; device has ", cc / 10, ".", cc % 10));
  }
  KernelPlan plan;
  plan.code_arch = CodeArchFor(cc, compiled.archs);
  if (plan.code_arch == 0) {
    std::string archs;
    for (int a : compiled.archs) absl::StrAppend(&archs, archs.empty() ? "" : ",", a);
    return absl::FailedPreconditionError(absl::StrCat("this build has no CUDA code for sm_", cc,
                                                      " (compiled architectures: ", archs, ")"));
  }
  plan.num_sms = device.num_sms;
  // griddepcontrol exists in sm_90 code only: older code would not wait for its predecessor.
  plan.dependent_launch = options.dependent_launch && cc >= 90 && plan.code_arch >= 90;
  plan.early_graph_launch = options.early_graph_launch && plan.dependent_launch;

  // The tensor-core decode kernel's MMA tile holds one kv head's whole group (<= 8 heads).
  const bool tc_decode = options.decode_attention_tensor_cores && dims.head_dim == 128 &&
                         dims.num_heads / dims.num_kv_heads <= kDecodeMaxGroup &&
                         device.max_shared_memory_per_block_optin >= kDecodeAttentionTcSmemBytes;
  plan.decode_attention =
      tc_decode ? DecodeAttentionKernel::kTensorCore : DecodeAttentionKernel::kCudaCore;
  // The tensor-core kernel by its shared memory (100 KB), the CUDA-core kernel by its registers.
  plan.decode_ctas_per_sm = tc_decode ? 2 : 3;

  if (dims.head_dim != 128) {
    plan.prefill_attention = PrefillAttentionKernel::kDecodeKernel;
    plan.prefill_tile_rows = 0;
  } else if (options.prefill_attention_sm90 && cc == 90 && compiled.sm90a_prefill) {
    // sm_90a code runs on compute capability 9.0 only.
    plan.prefill_attention = PrefillAttentionKernel::kWgmmaSm90;
    plan.prefill_tile_rows = kPrefillTileSm90;
  } else {
    plan.prefill_attention = PrefillAttentionKernel::kMmaSync;
    plan.prefill_tile_rows = kPrefillTile;
  }
  plan.prefill_key_tile = options.prefill_key_tile_sm90;
  plan.mla_decode = options.mla_decode_sm90 && cc == 90 && compiled.sm90a_prefill
                        ? MlaDecodeKernel::kWgmmaSm90
                        : MlaDecodeKernel::kMmaSync;
  plan.moe_gemm = options.moe_gemm_sm90 && cc == 90 && compiled.sm90a_prefill
                      ? MoeGemmKernel::kWgmmaSm90
                      : MoeGemmKernel::kWmma;

  plan.gemm.gemv_max_rows = options.gemv_max_rows;
  plan.gemm.skinny_max_rows = options.skinny_max_rows;
  plan.gemm.skinny_workspace_bytes =
      options.skinny_max_rows > 0 ? options.skinny_workspace_bytes : 0;
  plan.gemm.tune = options.tune_gemms;
  plan.gemm.tune_cold_cache = options.tune_cold_cache;
  plan.fuse_decode_kernels = options.fuse_decode_kernels;
  plan.merge_splits_in_attention = options.merge_splits_in_attention;
  return plan;
}

StepKernels SelectStepKernels(const KernelPlan& plan, const StepShape& step) {
  StepKernels k;
  k.fused_norms = plan.fuse_decode_kernels && step.tokens <= plan.gemm.gemv_max_rows &&
                  GemvNormedInputFits(step.tokens, step.hidden_size);
  k.qkv_in_gemv = k.fused_norms && !step.qk_norm;
  k.qkv_in_attention = plan.fuse_decode_kernels && step.all_decode && !k.qkv_in_gemv &&
                       !step.qk_norm && plan.decode_attention == DecodeAttentionKernel::kTensorCore;
  k.gate_up_gemv = !k.fused_norms && step.tokens <= plan.gemm.gemv_max_rows;
  return k;
}

DecodeSplitPlan PlanDecodeSplitsForCtas(int num_entries, int num_kv_heads, int max_context,
                                        int ctas_per_sm, int num_sms) {
  const int ctx = max_context < 1 ? 1 : max_context;
  const int base = num_entries * num_kv_heads < 1 ? 1 : num_entries * num_kv_heads;
  int splits = ctas_per_sm * num_sms / base;
  const int max_splits = (ctx + kMinDecodePartition - 1) / kMinDecodePartition;
  if (splits > max_splits) splits = max_splits;
  if (splits < 1) splits = 1;
  int partition = (ctx + splits - 1) / splits;
  partition = (partition + kMinDecodePartition - 1) / kMinDecodePartition * kMinDecodePartition;
  return {partition, (ctx + partition - 1) / partition};
}

std::string KernelPlan::Summary() const {
  const char* prefill = prefill_attention == PrefillAttentionKernel::kWgmmaSm90 ? "wgmma"
                        : prefill_attention == PrefillAttentionKernel::kMmaSync ? "mma.sync"
                                                                                : "decode-kernel";
  std::string out = absl::StrCat(
      "code sm_", code_arch, ": decode attention ",
      decode_attention == DecodeAttentionKernel::kTensorCore ? "tensor-core" : "cuda-core",
      ", prefill ", prefill);
  if (prefill_attention == PrefillAttentionKernel::kWgmmaSm90) {
    absl::StrAppend(&out, " ", prefill_tile_rows, "q/", prefill_key_tile, "k");
  }
  absl::StrAppend(&out, ", ",
                  dependent_launch ? (early_graph_launch ? "pdl+early" : "pdl") : "no pdl",
                  ", gemv<=", gemm.gemv_max_rows, ", skinny ",
                  gemm.skinny_max_rows > 0 ? absl::StrCat("<=", gemm.skinny_max_rows) : "off", ", ",
                  gemm.tune ? (gemm.tune_cold_cache ? "tuned cold" : "tuned warm") : "untuned",
                  fuse_decode_kernels ? ", fused" : ", unfused");
  return out;
}

}  // namespace ringserve::cuda
