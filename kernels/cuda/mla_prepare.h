// The data path around the absorbed MLA decode kernel (mla_decode.h) for DeepSeek-V2/V3, bf16 in
// and out, fp32 math, device memory:
//   LaunchMlaStoreLatent: kv_a_proj_with_mqa's output -> the cache row of each token:
//     [rms(latent) * kv_a_layernorm | rope(k_pe)].
//   LaunchMlaAbsorbQuery: q_b_proj's (or q_proj's) output -> the absorbed query of each head:
//     [W_uk_h^T q_nope_h | rope(q_pe_h)]   (W_uk_h = kv_b_proj rows [h (nope + v), + nope)).
//   LaunchMlaUpProjectValue: the decode kernel's latent output -> each head's value:
//     W_uv_h o_h   (W_uv_h = kv_b_proj rows [h (nope + v) + nope, + v)), the input of o_proj.
// Rope: angle position * inv_freq[i] on pairs (2i, 2i + 1) when interleave (DeepSeek-V2, V3's
// rope_interleave), else (i, i + 32); cos and sin times `rope_factor` (YaRN's attention factor),
// as stage/model/cpu_mla_attention.h's RotateMlaRope. The latent norm's eps is 1e-6.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_utils.h"
#include "kernels/cuda/mla_decode.h"

namespace ringserve::cuda {

struct MlaRope {
  const int32_t* positions = nullptr;  // [tokens] device
  const float* inv_freq = nullptr;     // [kMlaRopeDim / 2] device
  float factor = 1.0f;
  bool interleave = true;
};

struct MlaStoreLatentArgs {
  const bf16* kv_a = nullptr;       // [tokens, kMlaRowDim]
  const bf16* kv_a_bias = nullptr;  // [kMlaRowDim] or nullptr
  const bf16* norm = nullptr;       // [kMlaLatentDim] kv_a_layernorm
  MlaRope rope;
  // [tokens] device: cache slot (block * block_size + offset); a negative slot skips the token.
  const int32_t* slots = nullptr;
  MlaCacheLayer cache;
  int num_tokens = 0;
};
absl::Status LaunchMlaStoreLatent(const MlaStoreLatentArgs& args, cudaStream_t stream);

struct MlaAbsorbQueryArgs {
  const bf16* q = nullptr;     // [tokens, heads, nope + kMlaRopeDim]
  const bf16* kv_b = nullptr;  // [heads * (nope + v), kMlaLatentDim]
  MlaRope rope;
  bf16* q_out = nullptr;  // [tokens, heads, kMlaRowDim]
  int num_tokens = 0;
  int num_heads = 0;
  int nope = 0;  // qk_nope_head_dim, a multiple of 8 in [8, 256]
  int v = 0;     // v_head_dim
};
absl::Status LaunchMlaAbsorbQuery(const MlaAbsorbQueryArgs& args, cudaStream_t stream);

struct MlaUpProjectValueArgs {
  const bf16* latent_out = nullptr;  // [tokens, heads, kMlaLatentDim] (LaunchMlaDecode's out)
  const bf16* kv_b = nullptr;        // [heads * (nope + v), kMlaLatentDim]
  bf16* out = nullptr;               // [tokens, heads, v]
  int num_tokens = 0;
  int num_heads = 0;
  int nope = 0;
  int v = 0;  // v_head_dim in [1, 256]
};
absl::Status LaunchMlaUpProjectValue(const MlaUpProjectValueArgs& args, cudaStream_t stream);

// out[r] = rms(x[r] + bias) * w over `dim` values per row (q_a_layernorm; eps 1e-6 as
// transformers builds it). x, out: [rows, dim] bf16 (may alias); bias: [dim] or nullptr.
absl::Status LaunchMlaRmsNorm(const bf16* x, const bf16* bias, const bf16* w, bf16* out, int rows,
                              int dim, cudaStream_t stream);

}  // namespace ringserve::cuda
