// The attention input stage, fused: bias add (Qwen2), per-head q/k RMSNorm (Qwen3), rotary
// embedding (plain, linear or llama3-scaled frequencies: the caller passes inv_freq), and the
// store of K/V into the paged cache. One launch per layer.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_utils.h"

namespace ringserve::cuda {

// The paged KV cache of one layer, device memory. Block b, kv head h, slot s (0 <= s <
// block_size) holds the key at k + ((b * num_kv_heads + h) * block_size + s) * head_dim, the
// value likewise in v: per block [num_kv_heads, block_size, head_dim] bf16.
// An fp8 cache (ring/kv_cache_dtype.h) sets k8 and v8 instead of k and v (same layout, one
// float8_e4m3fn code per value): a key is code * k_scale, a value code * v_scale; writers store
// e4m3(x / scale). Every attention kernel and writer takes both (kv_cache_access.cuh).
struct KvCacheLayer {
  bf16* k = nullptr;
  bf16* v = nullptr;
  int num_kv_heads = 0;
  int block_size = 0;
  int head_dim = 0;
  uint8_t* k8 = nullptr;
  uint8_t* v8 = nullptr;
  float k_scale = 1.0f;
  float v_scale = 1.0f;

  bool is_fp8() const { return k8 != nullptr; }
};

struct QkvPrepareArgs {
  // [num_tokens, (num_heads + 2 * num_kv_heads) * head_dim] bf16: q heads, then k, then v heads
  // (the fused q/k/v projection's output). Read only.
  const bf16* qkv = nullptr;
  const bf16* bias = nullptr;    // [(num_heads + 2 * num_kv_heads) * head_dim] or nullptr
  const bf16* q_norm = nullptr;  // [head_dim] or nullptr (no q/k norm)
  const bf16* k_norm = nullptr;  // [head_dim]; set iff q_norm is
  float norm_eps = 1e-6f;
  const int32_t* positions = nullptr;  // [num_tokens] device
  const float* inv_freq = nullptr;     // [head_dim / 2] device
  // [num_tokens] device: cache slot (block * block_size + offset) of each token's K/V; a
  // negative slot skips the store (padding rows of a captured graph).
  const int32_t* slots = nullptr;
  bf16* q_out = nullptr;  // [num_tokens, num_heads, head_dim]
  KvCacheLayer cache;
  int num_tokens = 0;
  int num_heads = 0;
  // Partial rotary (GLM-4.5): 0 < rotary_dim < head_dim rotates the first rotary_dim values of
  // each q/k head, pairs (i, i + rotary_dim / 2) with inv_freq [rotary_dim / 2], and passes the
  // rest through; 0 or head_dim: the whole head.
  int rotary_dim = 0;
};

// Where the attention input stage puts a token's q/k/v without q/k norms (the kernels that fold
// it in: LaunchGemvNormedQkvRope, LaunchDecodeAttentionFromQkv): positions and slots have a row
// per token; q_out may be null where q goes elsewhere.
struct QkvStore {
  const bf16* bias = nullptr;  // [(num_heads + 2 * num_kv_heads) * head_dim] or nullptr
  const int32_t* positions = nullptr;
  const float* inv_freq = nullptr;  // [head_dim / 2]
  const int32_t* slots = nullptr;   // a negative slot skips the K/V store
  bf16* q_out = nullptr;            // [tokens, num_heads, head_dim]
  KvCacheLayer cache;
  int num_heads = 0;
};

// q_out = rope(norm(q + bq)); cache[slot] = (rope(norm(k + bk)), v + bv), per token and head,
// fp32 math: norm is x * rsqrt(mean(x^2) + eps) * w; rope is the "rotate half" form of
// cpu::ApplyRope with angle positions[t] * inv_freq[i]. head_dim even and <= 256.
absl::Status LaunchQkvPrepare(const QkvPrepareArgs& args, LaunchStream stream);

}  // namespace ringserve::cuda
