// One DeepSeek-V2/V3 attention layer (multi-head latent attention) on the GPU, for a CUDA slice:
// q (low-rank or not) and kv_a projections (cuBLASLt), the latent cache rows stored
// (LaunchMlaStoreLatent), the query absorbed into latent space (LaunchMlaAbsorbQuery), attention
// over the compressed paged cache (LaunchMlaDecode; keys and values never expanded), the values
// up-projected (LaunchMlaUpProjectValue) and o_proj. Decode and prefill run the same way: every
// token is one entry of the attention kernel with its sequence's block table row and its causal
// context (position + 1), so a prefill chunk attends to the earlier chunks' cached latents.
// Supports kv_lora_rank 512 and qk_rope_head_dim 64 (DeepSeek-V2, V2-Lite, V3) without attention
// biases. Not thread-safe; owns its scratch buffers.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "kernels/cuda/cuda_utils.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/mla_decode.h"
#include "kernels/cuda/mla_prepare.h"
#include "ring/model_config.h"

namespace ringserve::cuda {

// One layer's weights on the device, bf16, checkpoint layouts ([out, in]); unused ones null.
struct CudaMlaWeights {
  const bf16* q_a = nullptr;        // [q_lora_rank, hidden]
  const bf16* q_a_norm = nullptr;   // [q_lora_rank]
  const bf16* q_b = nullptr;        // [heads * qk_head_dim, q_lora_rank]
  const bf16* q = nullptr;          // [heads * qk_head_dim, hidden] (no q low-rank)
  const bf16* kv_a = nullptr;       // [kv_lora_rank + qk_rope_head_dim, hidden]
  const bf16* kv_a_norm = nullptr;  // [kv_lora_rank]
  const bf16* kv_b = nullptr;       // [heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank]
  const bf16* o = nullptr;          // [hidden, heads * v_head_dim]
};

// The tokens of one step, one row per token in batch order, device memory.
struct CudaMlaTokens {
  const int32_t* positions = nullptr;     // [tokens]
  const int32_t* slots = nullptr;         // [tokens] cache slot; negative: padding
  const int32_t* context_lens = nullptr;  // [tokens] position + 1; 0 for padding
  const int32_t* table_rows = nullptr;    // [tokens] the sequence's row of block_tables
  const int32_t* block_tables = nullptr;  // [*, max_blocks]
  int max_blocks = 0;
  int num_tokens = 0;
  int max_context = 0;  // the largest context_lens entry (host value; sizes the context splits)
};

class CudaMlaAttention {
 public:
  // Scratch for up to max_tokens tokens per Forward. InvalidArgument naming what this path does
  // not support (no MLA, kv_lora_rank != 512, qk_rope_head_dim != 64, attention_bias,
  // qk_nope_head_dim not a multiple of 8 in [8, 256], v_head_dim > 256, projection widths not
  // multiples of 8). `kernel`: the KernelPlan's MLA decode kernel (the device must run it).
  static absl::StatusOr<std::unique_ptr<CudaMlaAttention>> Create(
      const ModelConfig& config, int max_tokens, int num_sms,
      MlaDecodeKernel kernel = MlaDecodeKernel::kMmaSync);

  // out = o_proj(attention(h)) for the tokens, after storing each token's latent row into
  // `cache` (every token attends to its context, its own row included).
  //   h: [num_tokens, hidden] bf16 (input_layernorm's output); out: [num_tokens, hidden] bf16;
  //   inv_freq: [qk_rope_head_dim / 2] fp32. All device memory, enqueued on `stream`.
  absl::Status Forward(const CudaMlaWeights& w, const MlaCacheLayer& cache,
                       const CudaMlaTokens& tokens, const float* inv_freq, const bf16* h, bf16* out,
                       GemmRunner& gemm, cudaStream_t stream);

  // Tunes the projections' GEMM shapes for steps of `tokens` tokens (GemmRunner::Tune; before
  // a CUDA graph capture): reads h ([tokens, hidden]), writes only scratch and out.
  absl::Status TuneGemms(const CudaMlaWeights& w, int tokens, const bf16* h, bf16* out,
                         GemmRunner& gemm, cudaStream_t stream);

  int64_t scratch_bytes() const { return scratch_bytes_; }

 private:
  CudaMlaAttention() = default;

  MlaConfig mla_;
  int hidden_ = 0;
  int heads_ = 0;
  int max_tokens_ = 0;
  int num_sms_ = 0;
  MlaDecodeKernel kernel_ = MlaDecodeKernel::kMmaSync;
  int64_t workspace_floats_ = 0;
  int64_t scratch_bytes_ = 0;
  DeviceBuffer q_a_, q_, kv_a_, q_absorbed_, latent_out_, values_, workspace_;
};

}  // namespace ringserve::cuda
