#include "kernels/cuda/kernel_selector.h"

#include <algorithm>
#include <cstdint>

#include "gtest/gtest.h"

namespace ringserve::cuda {
namespace {

const DeviceInfo kH200{
    .compute_capability = 90, .num_sms = 132, .max_shared_memory_per_block_optin = 227 * 1024};
const DeviceInfo kA100{
    .compute_capability = 80, .num_sms = 108, .max_shared_memory_per_block_optin = 163 * 1024};
// sm_86 (RTX 30xx, A10): 99 KB per CTA, one short of the tensor-core decode kernel.
const DeviceInfo kSm86{
    .compute_capability = 86, .num_sms = 84, .max_shared_memory_per_block_optin = 99 * 1024};
const CompiledKernels kDefaultBuild{.archs = {80, 90}, .sm90a_prefill = true};
const CompiledKernels kSm80Build{.archs = {80}, .sm90a_prefill = false};
const AttentionDims kLlama8b{.head_dim = 128, .num_heads = 32, .num_kv_heads = 8};

KernelPlan Select(const DeviceInfo& device, const CompiledKernels& build,
                  const KernelOptions& options = {}, const AttentionDims& dims = kLlama8b) {
  absl::StatusOr<KernelPlan> plan = SelectKernels(device, build, dims, options);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan.ok() ? *plan : KernelPlan{};
}

TEST(KernelSelectorTest, H200DefaultBuildRunsTheFastestKernels) {
  const KernelPlan plan = Select(kH200, kDefaultBuild);
  EXPECT_EQ(plan.code_arch, 90);
  EXPECT_TRUE(plan.dependent_launch);
  EXPECT_TRUE(plan.early_graph_launch);
  EXPECT_EQ(plan.decode_attention, DecodeAttentionKernel::kTensorCore);
  EXPECT_EQ(plan.decode_ctas_per_sm, 2);
  EXPECT_EQ(plan.prefill_attention, PrefillAttentionKernel::kWgmmaSm90);
  EXPECT_EQ(plan.prefill_tile_rows, kPrefillTileSm90);
  EXPECT_EQ(plan.prefill_key_tile, 64);
  EXPECT_EQ(plan.gemm.gemv_max_rows, 1);
  EXPECT_TRUE(plan.gemm.tune);
  EXPECT_TRUE(plan.gemm.tune_cold_cache);
  EXPECT_TRUE(plan.fuse_decode_kernels);
  EXPECT_EQ(plan.num_sms, 132);
}

TEST(KernelSelectorTest, SkinnyGemmIsOffAndCostsNoWorkspaceUnlessAsked) {
  const KernelPlan plan = Select(kH200, kDefaultBuild);
  EXPECT_EQ(plan.gemm.skinny_max_rows, 0);
  EXPECT_EQ(plan.gemm.skinny_workspace_bytes, 0u);
  const KernelPlan asked = Select(kH200, kDefaultBuild, {.skinny_max_rows = 64});
  EXPECT_EQ(asked.gemm.skinny_max_rows, 64);
  EXPECT_EQ(asked.gemm.skinny_workspace_bytes, size_t{40} << 20);
}

// A build with only compute_80 code runs on the H200 exactly what an A100 runs: its code has no
// griddepcontrol (a dependent launch would not wait) and no wgmma kernel.
TEST(KernelSelectorTest, Sm80OnlyBuildRunsTheSm80PathsOnAnH200) {
  const KernelPlan on_h200 = Select(kH200, kSm80Build);
  const KernelPlan on_a100 = Select(kA100, kDefaultBuild);
  for (const KernelPlan& plan : {on_h200, on_a100}) {
    EXPECT_EQ(plan.code_arch, 80);
    EXPECT_FALSE(plan.dependent_launch);
    EXPECT_FALSE(plan.early_graph_launch);
    EXPECT_EQ(plan.decode_attention, DecodeAttentionKernel::kTensorCore);
    EXPECT_EQ(plan.prefill_attention, PrefillAttentionKernel::kMmaSync);
    EXPECT_EQ(plan.prefill_tile_rows, kPrefillTile);
  }
  // A build for 90 without the sm_90a object (e.g. "80;90-virtual") has dependent launch but not
  // the wgmma kernel.
  const KernelPlan no_sm90a = Select(kH200, {.archs = {80, 90}, .sm90a_prefill = false});
  EXPECT_TRUE(no_sm90a.dependent_launch);
  EXPECT_EQ(no_sm90a.prefill_attention, PrefillAttentionKernel::kMmaSync);
}

TEST(KernelSelectorTest, LatentAttentionTakesWgmmaOnlyOnComputeCapability90WithSm90aCode) {
  const KernelOptions on{.mla_decode_sm90 = true};
  EXPECT_EQ(Select(kH200, kDefaultBuild, on).mla_decode, MlaDecodeKernel::kWgmmaSm90);
  EXPECT_EQ(Select(kH200, kSm80Build, on).mla_decode, MlaDecodeKernel::kMmaSync);
  EXPECT_EQ(Select(kH200, {.archs = {80, 90}, .sm90a_prefill = false}, on).mla_decode,
            MlaDecodeKernel::kMmaSync);
  EXPECT_EQ(Select(kA100, kDefaultBuild, on).mla_decode, MlaDecodeKernel::kMmaSync);
  EXPECT_EQ(Select(kSm86, kDefaultBuild, on).mla_decode, MlaDecodeKernel::kMmaSync);
  EXPECT_EQ(Select(kH200, kDefaultBuild).mla_decode, MlaDecodeKernel::kWgmmaSm90);  // default
  EXPECT_EQ(Select(kH200, kDefaultBuild, {.mla_decode_sm90 = false}).mla_decode,
            MlaDecodeKernel::kMmaSync);
}

TEST(KernelSelectorTest, MoeGroupedGemmTakesWgmmaOnlyOnComputeCapability90WithSm90aCode) {
  const KernelOptions on{.moe_gemm_sm90 = true};
  EXPECT_EQ(Select(kH200, kDefaultBuild, on).moe_gemm, MoeGemmKernel::kWgmmaSm90);
  EXPECT_EQ(Select(kH200, kSm80Build, on).moe_gemm, MoeGemmKernel::kWmma);
  EXPECT_EQ(Select(kA100, kDefaultBuild, on).moe_gemm, MoeGemmKernel::kWmma);
  EXPECT_EQ(Select(kH200, kDefaultBuild).moe_gemm, MoeGemmKernel::kWgmmaSm90);  // default
  EXPECT_EQ(Select(kH200, kDefaultBuild, {.moe_gemm_sm90 = false}).moe_gemm, MoeGemmKernel::kWmma);
}

TEST(KernelSelectorTest, CodeArchIsTheNewestCompiledArchNotNewerThanTheDevice) {
  EXPECT_EQ(CodeArchFor(90, {80, 90}), 90);
  EXPECT_EQ(CodeArchFor(89, {80, 90}), 80);
  EXPECT_EQ(CodeArchFor(120, {80, 90}), 90);
  EXPECT_EQ(CodeArchFor(80, {90}), 0);
  EXPECT_EQ(CodeArchFor(90, {}), 0);
  const absl::StatusOr<KernelPlan> none =
      SelectKernels(kA100, {.archs = {90}, .sm90a_prefill = true}, kLlama8b, {});
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition) << none.status();
  const absl::StatusOr<KernelPlan> old =
      SelectKernels({.compute_capability = 75, .num_sms = 40}, kDefaultBuild, kLlama8b, {});
  EXPECT_EQ(old.status().code(), absl::StatusCode::kFailedPrecondition) << old.status();
}

TEST(KernelSelectorTest, TensorCoreDecodeNeedsHeadDim128AndItsSharedMemory) {
  const KernelPlan sm86 = Select(kSm86, kDefaultBuild);
  EXPECT_EQ(sm86.decode_attention, DecodeAttentionKernel::kCudaCore);
  EXPECT_EQ(sm86.decode_ctas_per_sm, 3);
  EXPECT_EQ(sm86.prefill_attention, PrefillAttentionKernel::kMmaSync);  // 64 KB: fits
  const KernelPlan head64 =
      Select(kH200, kDefaultBuild, {}, {.head_dim = 64, .num_heads = 16, .num_kv_heads = 4});
  EXPECT_EQ(head64.decode_attention, DecodeAttentionKernel::kCudaCore);
  EXPECT_EQ(head64.prefill_attention, PrefillAttentionKernel::kDecodeKernel);
  EXPECT_EQ(head64.prefill_tile_rows, 0);
  const KernelPlan forced = Select(kH200, kDefaultBuild, {.decode_attention_tensor_cores = false});
  EXPECT_EQ(forced.decode_attention, DecodeAttentionKernel::kCudaCore);
  EXPECT_EQ(forced.decode_ctas_per_sm, 3);
}

TEST(KernelSelectorTest, OptionsTurnKernelsOff) {
  const KernelPlan plan = Select(kH200, kDefaultBuild,
                                 {.dependent_launch = false,
                                  .prefill_attention_sm90 = false,
                                  .tune_gemms = false,
                                  .fuse_decode_kernels = false});
  EXPECT_FALSE(plan.dependent_launch);
  EXPECT_FALSE(plan.early_graph_launch);  // needs dependent launch
  EXPECT_EQ(plan.prefill_attention, PrefillAttentionKernel::kMmaSync);
  EXPECT_FALSE(plan.gemm.tune);
  EXPECT_FALSE(plan.fuse_decode_kernels);
  const KernelPlan late = Select(kH200, kDefaultBuild, {.early_graph_launch = false});
  EXPECT_TRUE(late.dependent_launch);
  EXPECT_FALSE(late.early_graph_launch);
  EXPECT_EQ(Select(kH200, kDefaultBuild, {.prefill_key_tile_sm90 = 128}).prefill_key_tile, 128);
}

TEST(KernelSelectorTest, RefusesBadOptionsAndUnsupportedShapes) {
  const auto code = [](const KernelOptions& options, const AttentionDims& dims = kLlama8b) {
    return SelectKernels(kH200, kDefaultBuild, dims, options).status().code();
  };
  EXPECT_EQ(code({.prefill_key_tile_sm90 = 96}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({.gemv_max_rows = 9}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({.gemv_max_rows = -1}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({.skinny_max_rows = 65}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({.skinny_max_rows = 8, .skinny_workspace_bytes = 1024}),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({}, {.head_dim = 96, .num_heads = 8, .num_kv_heads = 8}),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({}, {.head_dim = 256, .num_heads = 32, .num_kv_heads = 2}),  // 2 x 8 x 256
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({}, {.head_dim = 256, .num_heads = 16, .num_kv_heads = 2}),  // 8 x 256 > 1024
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({}, {.head_dim = 128, .num_heads = 12, .num_kv_heads = 8}),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({}, {.head_dim = 256, .num_heads = 8, .num_kv_heads = 2}), absl::StatusCode::kOk);
}

// Groups above 8 query heads per kv head (GLM-4.5: 96 / 8) run the CUDA-core decode kernel in
// parts of at most 8 heads; the tensor-core kernel holds a whole group in its MMA tile.
TEST(KernelSelectorTest, LargeGroupsDecodeOnCudaCoresInParts) {
  const AttentionDims glm{.head_dim = 128, .num_heads = 96, .num_kv_heads = 8};
  auto plan = SelectKernels(kH200, kDefaultBuild, glm, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->decode_attention, DecodeAttentionKernel::kCudaCore);
  EXPECT_EQ(plan->prefill_attention, PrefillAttentionKernel::kWgmmaSm90);
  EXPECT_EQ(DecodeHeadParts(12), 2);
  EXPECT_EQ(DecodeHeadsPerCta(12), 6);
  EXPECT_EQ(DecodeHeadParts(16), 2);
  EXPECT_EQ(DecodeHeadsPerCta(16), 8);
  EXPECT_EQ(DecodeHeadParts(8), 1);
  EXPECT_EQ(DecodeHeadsPerCta(9), 5);
  EXPECT_TRUE(
      SelectKernels(kH200, kDefaultBuild, {.head_dim = 128, .num_heads = 32, .num_kv_heads = 2}, {})
          .ok());
}

TEST(KernelSelectorTest, StepKernelsFollowTheBatchShape) {
  const KernelPlan plan = Select(kH200, kDefaultBuild);
  // One decode token: norms, adds and the attention input stage in the GEMVs.
  StepKernels one = SelectStepKernels(plan, {.tokens = 1, .hidden_size = 4096, .all_decode = true});
  EXPECT_TRUE(one.fused_norms);
  EXPECT_TRUE(one.qkv_in_gemv);
  EXPECT_FALSE(one.qkv_in_attention);
  EXPECT_FALSE(one.gate_up_gemv);
  // Qwen3's q/k norms keep the input stage in its own kernel.
  one = SelectStepKernels(plan,
                          {.tokens = 1, .hidden_size = 4096, .all_decode = true, .qk_norm = true});
  EXPECT_TRUE(one.fused_norms);
  EXPECT_FALSE(one.qkv_in_gemv);
  EXPECT_FALSE(one.qkv_in_attention);
  // 32 decode tokens: the input stage in the tensor-core attention kernel.
  const StepKernels many =
      SelectStepKernels(plan, {.tokens = 32, .hidden_size = 4096, .all_decode = true});
  EXPECT_FALSE(many.fused_norms);
  EXPECT_FALSE(many.qkv_in_gemv);
  EXPECT_TRUE(many.qkv_in_attention);
  EXPECT_FALSE(many.gate_up_gemv);
  // A prefill step: nothing fused.
  const StepKernels prefill =
      SelectStepKernels(plan, {.tokens = 32, .hidden_size = 4096, .all_decode = false});
  EXPECT_FALSE(prefill.qkv_in_attention);
  // Unfused at one row: the gate/up GEMV with its SiLU; rows too wide for the GEMV's shared
  // memory are not fused.
  const KernelPlan unfused = Select(kH200, kDefaultBuild, {.fuse_decode_kernels = false});
  const StepKernels plain =
      SelectStepKernels(unfused, {.tokens = 1, .hidden_size = 4096, .all_decode = true});
  EXPECT_FALSE(plain.fused_norms);
  EXPECT_FALSE(plain.qkv_in_attention);
  EXPECT_TRUE(plain.gate_up_gemv);
  EXPECT_FALSE(
      SelectStepKernels(plan, {.tokens = 1, .hidden_size = 32768, .all_decode = true}).fused_norms);
  // The CUDA-core decode kernel cannot take the projection.
  const KernelPlan cuda_core = Select(kSm86, kDefaultBuild);
  EXPECT_FALSE(SelectStepKernels(cuda_core, {.tokens = 32, .hidden_size = 4096, .all_decode = true})
                   .qkv_in_attention);
}

TEST(KernelSelectorTest, SplitPlanCoversContextAndFillsOneWave) {
  for (int ctas_per_sm : {2, 3}) {
    for (int entries : {1, 3, 32, 256}) {
      for (int ctx : {0, 1, 31, 200, 512, 4097, 32768}) {
        const DecodeSplitPlan plan = PlanDecodeSplitsForCtas(entries, 8, ctx, ctas_per_sm, 132);
        SCOPED_TRACE(::testing::Message()
                     << "ctas/SM " << ctas_per_sm << " entries " << entries << " ctx " << ctx);
        EXPECT_GE(plan.splits, 1);
        EXPECT_EQ(plan.partition % kMinDecodePartition, 0);
        EXPECT_GE(int64_t{plan.partition} * plan.splits, ctx);
        EXPECT_LT(int64_t{plan.partition} * (plan.splits - 1), std::max(ctx, 1));  // none empty
        EXPECT_EQ(plan.splits, DecodeSplitsFor(std::max(ctx, 1), plan.partition));
        EXPECT_LE(entries * 8 * plan.splits, std::max(entries * 8, ctas_per_sm * 132));
      }
    }
  }
  // The H200's plan (tensor-core kernel, 2 CTAs per SM: 264 on 132 SMs).
  const KernelPlan h200 = Select(kH200, kDefaultBuild);
  EXPECT_EQ(PlanDecodeSplits(h200, 1, 8, 32768).splits, 32);  // 33 fit; 1024-key pieces
  EXPECT_EQ(PlanDecodeSplits(h200, 1, 8, 512).splits, 16);    // capped by 32-key pieces
  EXPECT_EQ(PlanDecodeSplits(h200, 32, 8, 256).splits, 1);    // 256 CTAs: no second wave
  EXPECT_EQ(PlanDecodeSplits(h200, 8, 8, 4096).splits, 4);    // 256 CTAs <= 264
  EXPECT_EQ(PlanDecodeSplits(h200, 256, 8, 512).splits, 1);   // batch fills the GPU
  // The CUDA-core kernel: 3 per SM.
  EXPECT_EQ(PlanDecodeSplitsForCtas(1, 8, 32768, 3, 132).splits, 49);
  EXPECT_EQ(PlanDecodeSplitsForCtas(8, 8, 4096, 3, 132).splits, 6);  // 384 CTAs <= 396
}

TEST(KernelSelectorTest, SummaryNamesTheChoices) {
  EXPECT_EQ(Select(kH200, kDefaultBuild).Summary(),
            "code sm_90: decode attention tensor-core, prefill wgmma 128q/64k, pdl+early, "
            "gemv<=1, skinny off, tuned cold, fused");
  EXPECT_EQ(Select(kH200, kSm80Build).Summary(),
            "code sm_80: decode attention tensor-core, prefill mma.sync, no pdl, gemv<=1, skinny "
            "off, tuned cold, fused");
}

}  // namespace
}  // namespace ringserve::cuda
