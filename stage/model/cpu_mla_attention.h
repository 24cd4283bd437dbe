// CPU reference of DeepSeek-V2/V3 multi-head latent attention (MLA) over a LatentKvCache, fp32,
// host memory. Follows transformers' DeepseekV3Attention / DeepseekV2Attention:
//   q        = q_b_proj(rms(q_a_proj(h))) or q_proj(h)          [tokens, heads, nope + rope]
//   c, k_pe  = kv_a_proj_with_mqa(h) split [kv_lora_rank | rope]
//   latent   = rms(c)  (kv_a_layernorm);  k_pe, q_pe rotated (YaRN-scaled cos/sin)
//   k_nope_h = W_uk_h latent,  v_h = W_uv_h latent  (kv_b_proj's rows of head h)
//   attention softmax(scale * (q_nope . k_nope + q_pe . k_pe)) v, then o_proj.
// The cache stores (latent, k_pe) per token; keys and values of the heads are never stored.
// Two ways to attend over it, equal up to rounding:
//   absorbed: q_nope is folded into latent space (W_uk_h^T q_nope), scores and the weighted sum
//     run over cached latents, and W_uv_h maps the result out; keys and values are never
//     expanded (decode, few query tokens).
//   expanded: the context's latents are up-projected to per-head keys and values once, then
//     ordinary attention (prefill chunks, where many queries share that work).
// q_a_layernorm and kv_a_layernorm use eps 1e-6 (transformers builds them without
// rms_norm_eps).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "ring/model_config.h"
#include "stage/model/latent_kv_cache.h"
#include "stage/model/model_slice.h"

namespace ringserve {

// One layer's attention weights, fp32, checkpoint layouts ([out, in]); empty = absent.
struct MlaWeights {
  std::vector<float> q_a_w, q_a_b, q_a_norm, q_b_w;  // with q low-rank
  std::vector<float> q_w;                            // without
  std::vector<float> kv_a_w, kv_a_b, kv_a_norm, kv_b_w, o_w, o_b;
};

enum class MlaPath { kAbsorbed, kExpanded };

// The path for a chunk of `num_tokens` query tokens: absorbed for at most
// kMlaAbsorbedMaxTokens (decode, speculative verification), expanded for longer chunks.
inline constexpr int32_t kMlaAbsorbedMaxTokens = 8;
MlaPath SelectMlaPath(int32_t num_tokens);

inline constexpr float kMlaLatentNormEps = 1e-6f;

struct MlaAttentionArgs {
  const ModelConfig* config = nullptr;  // config->mla set
  const MlaWeights* weights = nullptr;
  std::span<const SequenceChunk> chunks;
  const int32_t* positions = nullptr;  // [total tokens], chunk after chunk
  const float* inv_freq = nullptr;     // [qk_rope_head_dim / 2]
  LatentKvLayerView kv;
  // Forces one path for every chunk (tests, benchmarks); unset: SelectMlaPath.
  std::optional<MlaPath> path;
};

// Runs one layer's attention: writes each chunk's (latent, k_pe) rows into the cache at its
// positions, then attends causally over positions [0, position] of its sequence.
//   h:   [total tokens, hidden] (after input_layernorm)
//   out: [total tokens, hidden] (after o_proj), must not alias h.
// The batch must have been validated (block tables cover every position).
void MlaAttention(const MlaAttentionArgs& args, const float* h, float* out);

// Rotates one rope vector x[rope_dim] at `position` in place: pairs (2i, 2i+1) if interleave,
// else (i, i + rope_dim / 2), angle position * inv_freq[i], cos and sin times `factor`.
void RotateMlaRope(float* x, int rope_dim, int32_t position, const float* inv_freq, float factor,
                   bool interleave);

}  // namespace ringserve
