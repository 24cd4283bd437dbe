#include "stage/cuda/cuda_mla_attention.h"

#include <algorithm>

#include "common/status_macros.h"
#include "fmt/format.h"

namespace ringserve::cuda {
namespace {

absl::Status Unsupported(const std::string& what) {
  return absl::InvalidArgumentError(
      fmt::format("multi-head latent attention on CUDA: unsupported {}", what));
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaMlaAttention>> CudaMlaAttention::Create(
    const ModelConfig& config, int max_tokens, int num_sms, MlaDecodeKernel kernel) {
  if (!config.mla) return Unsupported("model without multi-head latent attention");
  const MlaConfig& m = *config.mla;
  if (m.kv_lora_rank != kMlaLatentDim) {
    return Unsupported(fmt::format("kv_lora_rank {} (only {})", m.kv_lora_rank, kMlaLatentDim));
  }
  if (m.qk_rope_head_dim != kMlaRopeDim) {
    return Unsupported(
        fmt::format("qk_rope_head_dim {} (only {})", m.qk_rope_head_dim, kMlaRopeDim));
  }
  if (m.attention_bias) return Unsupported("attention_bias true");
  if (m.qk_nope_head_dim < 8 || m.qk_nope_head_dim > 256 || m.qk_nope_head_dim % 8 != 0) {
    return Unsupported(fmt::format("qk_nope_head_dim {}", m.qk_nope_head_dim));
  }
  if (m.v_head_dim < 1 || m.v_head_dim > 256) {
    return Unsupported(fmt::format("v_head_dim {}", m.v_head_dim));
  }
  const int heads = config.num_heads;
  for (const int width :
       {config.hidden_size, m.q_lora_rank, heads * m.qk_head_dim(), heads * m.v_head_dim}) {
    if (width % 8 != 0)
      return Unsupported(fmt::format("projection width {} (multiples of 8)", width));
  }
  if (max_tokens < 1 || num_sms < 1) {
    return absl::InvalidArgumentError("CudaMlaAttention: max_tokens and num_sms must be positive");
  }
  std::unique_ptr<CudaMlaAttention> a(new CudaMlaAttention());
  a->mla_ = m;
  a->hidden_ = config.hidden_size;
  a->heads_ = heads;
  a->max_tokens_ = max_tokens;
  a->num_sms_ = num_sms;
  a->kernel_ = MlaDecodeKernelFor(kernel, heads);
  // PlanMlaDecodeSplits keeps entries x splits x heads within kMlaWorkspaceRowsPerSm x SMs.
  a->workspace_floats_ = int64_t{kMlaWorkspaceRowsPerSm} * num_sms * (kMlaLatentDim + 2);
  const int64_t t = max_tokens;
  const struct {
    DeviceBuffer* buffer;
    int64_t bytes;
  } buffers[] = {
      {&a->q_a_, t * std::max(m.q_lora_rank, 8) * 2},
      {&a->q_, t * heads * m.qk_head_dim() * 2},
      {&a->kv_a_, t * kMlaRowDim * 2},
      {&a->q_absorbed_, t * heads * kMlaRowDim * 2},
      {&a->latent_out_, t * heads * kMlaLatentDim * 2},
      {&a->values_, t * heads * m.v_head_dim * 2},
      {&a->workspace_, a->workspace_floats_ * 4},
  };
  for (const auto& b : buffers) {
    RS_RETURN_IF_ERROR(b.buffer->Allocate(b.bytes));
    // Rows the decode kernel leaves unwritten (padding entries, context 0) stay finite.
    RS_CUDA_RETURN_IF_ERROR(cudaMemset(b.buffer->get(), 0, b.bytes));
    a->scratch_bytes_ += b.bytes;
  }
  return a;
}

absl::Status CudaMlaAttention::TuneGemms(const CudaMlaWeights& w, int tokens, const bf16* h,
                                         bf16* out, GemmRunner& gemm, cudaStream_t stream) {
  if (tokens < 1 || tokens > max_tokens_) {
    return absl::InvalidArgumentError(
        fmt::format("CudaMlaAttention: {} tokens (at most {})", tokens, max_tokens_));
  }
  const MlaConfig& m = mla_;
  const int qk_width = heads_ * m.qk_head_dim();
  bf16* q = static_cast<bf16*>(q_.get());
  if (m.q_lora_rank > 0) {
    bf16* q_a = static_cast<bf16*>(q_a_.get());
    RS_RETURN_IF_ERROR(
        gemm.Tune(h, w.q_a, q_a, OutType::kBF16, tokens, m.q_lora_rank, hidden_, stream));
    RS_RETURN_IF_ERROR(
        gemm.Tune(q_a, w.q_b, q, OutType::kBF16, tokens, qk_width, m.q_lora_rank, stream));
  } else {
    RS_RETURN_IF_ERROR(gemm.Tune(h, w.q, q, OutType::kBF16, tokens, qk_width, hidden_, stream));
  }
  RS_RETURN_IF_ERROR(gemm.Tune(h, w.kv_a, static_cast<bf16*>(kv_a_.get()), OutType::kBF16, tokens,
                               kMlaRowDim, hidden_, stream));
  return gemm.Tune(static_cast<bf16*>(values_.get()), w.o, out, OutType::kBF16, tokens, hidden_,
                   heads_ * m.v_head_dim, stream);
}

absl::Status CudaMlaAttention::Forward(const CudaMlaWeights& w, const MlaCacheLayer& cache,
                                       const CudaMlaTokens& tokens, const float* inv_freq,
                                       const bf16* h, bf16* out, GemmRunner& gemm,
                                       cudaStream_t stream) {
  const int n = tokens.num_tokens;
  if (n < 0 || n > max_tokens_) {
    return absl::InvalidArgumentError(
        fmt::format("CudaMlaAttention: {} tokens (at most {})", n, max_tokens_));
  }
  if (n == 0) return absl::OkStatus();
  const MlaConfig& m = mla_;
  const int qk_width = heads_ * m.qk_head_dim();
  bf16* q = static_cast<bf16*>(q_.get());
  if (m.q_lora_rank > 0) {
    bf16* q_a = static_cast<bf16*>(q_a_.get());
    RS_RETURN_IF_ERROR(
        gemm.Linear(h, w.q_a, q_a, OutType::kBF16, n, m.q_lora_rank, hidden_, stream));
    RS_RETURN_IF_ERROR(LaunchMlaRmsNorm(q_a, nullptr, w.q_a_norm, q_a, n, m.q_lora_rank, stream));
    RS_RETURN_IF_ERROR(
        gemm.Linear(q_a, w.q_b, q, OutType::kBF16, n, qk_width, m.q_lora_rank, stream));
  } else {
    RS_RETURN_IF_ERROR(gemm.Linear(h, w.q, q, OutType::kBF16, n, qk_width, hidden_, stream));
  }
  bf16* kv_a = static_cast<bf16*>(kv_a_.get());
  RS_RETURN_IF_ERROR(gemm.Linear(h, w.kv_a, kv_a, OutType::kBF16, n, kMlaRowDim, hidden_, stream));
  const MlaRope rope{.positions = tokens.positions,
                     .inv_freq = inv_freq,
                     .factor = static_cast<float>(m.rope_attention_factor),
                     .interleave = m.rope_interleave};
  RS_RETURN_IF_ERROR(LaunchMlaStoreLatent({.kv_a = kv_a,
                                           .norm = w.kv_a_norm,
                                           .rope = rope,
                                           .slots = tokens.slots,
                                           .cache = cache,
                                           .num_tokens = n},
                                          stream));
  bf16* q_absorbed = static_cast<bf16*>(q_absorbed_.get());
  RS_RETURN_IF_ERROR(LaunchMlaAbsorbQuery({.q = q,
                                           .kv_b = w.kv_b,
                                           .rope = rope,
                                           .q_out = q_absorbed,
                                           .num_tokens = n,
                                           .num_heads = heads_,
                                           .nope = m.qk_nope_head_dim,
                                           .v = m.v_head_dim},
                                          stream));
  const int max_context = std::max(1, tokens.max_context);
  MlaSplitPlan plan = PlanMlaDecodeSplits(n, heads_, max_context, num_sms_, kernel_);
  if (MlaDecodeWorkspaceFloats(n, heads_, plan.num_splits) > workspace_floats_) {
    plan = {.num_splits = 1, .partition = (max_context + 31) / 32 * 32};
  }
  bf16* latent_out = static_cast<bf16*>(latent_out_.get());
  RS_RETURN_IF_ERROR(LaunchMlaDecode(heads_, static_cast<float>(m.softmax_scale), cache, q_absorbed,
                                     latent_out,
                                     {.context_lens = tokens.context_lens,
                                      .table_rows = tokens.table_rows,
                                      .block_tables = tokens.block_tables,
                                      .max_blocks = tokens.max_blocks,
                                      .num_entries = n,
                                      .num_splits = plan.num_splits,
                                      .partition = plan.partition,
                                      .workspace = static_cast<float*>(workspace_.get()),
                                      .kernel = kernel_},
                                     stream));
  bf16* values = static_cast<bf16*>(values_.get());
  RS_RETURN_IF_ERROR(LaunchMlaUpProjectValue({.latent_out = latent_out,
                                              .kv_b = w.kv_b,
                                              .out = values,
                                              .num_tokens = n,
                                              .num_heads = heads_,
                                              .nope = m.qk_nope_head_dim,
                                              .v = m.v_head_dim},
                                             stream));
  return gemm.Linear(values, w.o, out, OutType::kBF16, n, hidden_, heads_ * m.v_head_dim, stream);
}

}  // namespace ringserve::cuda
