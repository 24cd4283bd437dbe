// The CPU reference ops: plain fp32 math on host memory, written to be obviously correct. They
// define the semantics every other backend is tested against (the CUDA kernels must match them
// within their own dtype's tolerance). All tensors are row-major, dense, fp32, host memory, and
// follow Hugging Face transformers' definitions (Llama/Qwen): shapes are given per argument.
// Pointers must be valid for the stated sizes; outputs must not alias inputs unless stated.
// Functions are pure apart from writing their outputs; safe to call concurrently on disjoint
// outputs. Preconditions are programmer contracts (checked by the caller), not runtime errors.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace ringserve::cpu {

// out[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * weight[:]
//   x, out: [rows, dim]; weight: [dim]. out may equal x (in place).
// With rows = tokens * heads and dim = head_dim this is Qwen3's per-head q/k norm.
void RmsNorm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps, float* out);

// out[r, n] = sum_k x[r, k] * w[n, k] (+ bias[n])   -- torch.nn.Linear: y = x W^T + b
//   x: [rows, in]; w: [out_features, in] (the checkpoint layout); bias: [out_features] or
//   nullptr; out: [rows, out_features], must not alias x or w.
void MatMul(const float* x, const float* w, const float* bias, int64_t rows, int64_t in,
            int64_t out_features, float* out);

// The logits of selected rows: out[r, :] = head(RmsNorm(x[rows[r], :], norm)), as a model's
// final norm and lm_head (or an MTP layer's shared head) on the rows that need logits.
//   x: [tokens, hidden]; norm: [hidden]; head: [vocab, hidden]. Returns [rows.size(), vocab].
std::vector<float> NormAndProjectRows(const float* x, std::span<const int64_t> rows,
                                      const float* norm, const float* head, int64_t hidden,
                                      int64_t vocab, float eps);

// out[i] = silu(gate[i]) * up[i], silu(x) = x / (1 + exp(-x)); n elements. out may equal gate.
void SiluMul(const float* gate, const float* up, int64_t n, float* out);

// x[i] += y[i] for n elements (residual add).
void Add(float* x, const float* y, int64_t n);

// out[t, :] = table[ids[t], :]. table: [vocab, hidden]; ids: [n] each in [0, vocab);
// out: [n, hidden].
void Embed(const float* table, int64_t hidden, const int32_t* ids, int64_t n, float* out);

// RoPE inverse frequencies, [head_dim / 2]: inv_freq[i] = 1 / theta^(2i / head_dim).
std::vector<float> RopeInvFreq(int head_dim, double theta);
// Llama 3.1 scaling of `inv_freq` in place (transformers' _compute_llama3_parameters): long
// wavelengths (> original_max / low_freq_factor) are divided by `factor`, short ones
// (< original_max / high_freq_factor) kept, the band between interpolated smoothly.
void ApplyLlama3RopeScaling(std::span<float> inv_freq, double factor, double low_freq_factor,
                            double high_freq_factor, int original_max_position_embeddings);

// Rotary embedding in place, "rotate half" (NeoX/HF Llama) layout: for each token t, head h and
// i < head_dim / 2, with a = positions[t] * inv_freq[i], (x1, x2) = (x[i], x[i + head_dim/2]):
//   x[i] = x1 cos a - x2 sin a;  x[i + head_dim/2] = x2 cos a + x1 sin a.
//   x: [num_tokens, num_heads, head_dim]; positions: [num_tokens]; inv_freq: [head_dim / 2].
void ApplyRope(float* x, int64_t num_tokens, int num_heads, int head_dim, const int32_t* positions,
               const float* inv_freq);
// Partial rotary (GLM-4.5): ApplyRope over the first rotary_dim values of each head (pairs
// (i, i + rotary_dim / 2)); the remaining head_dim - rotary_dim values pass through.
//   inv_freq: [rotary_dim / 2]; rotary_dim even, <= head_dim.
void ApplyPartialRope(float* x, int64_t num_tokens, int num_heads, int head_dim, int rotary_dim,
                      const int32_t* positions, const float* inv_freq);

// One layer's view of a paged KV cache. Block b's keys for position slot s (0 <= s <
// block_size) and kv head h start at k + b * block_stride + (s * num_kv_heads + h) * head_dim;
// values likewise from v. I.e. within a block: [block_size, num_kv_heads, head_dim] for K and
// for V; blocks are `block_stride` floats apart.
// An fp8 cache (ring/kv_cache_dtype.h) sets k8/v8 instead of k/v: the same layout in bytes
// (block_stride bytes apart), each a float8_e4m3fn code; the value is code * k_scale (keys) or
// code * v_scale (values). WriteKv stores FloatToFp8E4M3(x / scale) (common/dtype.h).
struct KvLayerView {
  float* k = nullptr;
  float* v = nullptr;
  int64_t block_stride = 0;
  int block_size = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  uint8_t* k8 = nullptr;
  uint8_t* v8 = nullptr;
  float k_scale = 1.0f;
  float v_scale = 1.0f;
};

// Stores K/V rows of `num_tokens` tokens at positions [start_position, start_position +
// num_tokens) into the blocks named by `block_table` (entry i holds positions
// [i * block_size, (i + 1) * block_size)). k, v: [num_tokens, num_kv_heads, head_dim].
// block_table must cover start_position + num_tokens positions with valid block ids.
void WriteKv(const KvLayerView& kv, std::span<const int32_t> block_table, int32_t start_position,
             int64_t num_tokens, const float* k, const float* v);

// Causal grouped-query attention of one sequence's chunk over the paged cache (which must
// already hold this chunk's K/V, see WriteKv). Query t sits at position start_position + t and
// attends to positions [0, start_position + t]; query head h uses kv head
// h / (num_heads / num_kv_heads). softmax(q . k * scale) . v, in fp32 with max subtraction.
//   q, out: [num_tokens, num_heads, head_dim]; num_heads a multiple of kv.num_kv_heads.
void PagedAttention(const float* q, int64_t num_tokens, int num_heads, const KvLayerView& kv,
                    std::span<const int32_t> block_table, int32_t start_position, float scale,
                    float* out);

// Attention variants of gpt-oss (and any sliding-window model).
struct AttentionVariant {
  // > 0: query at position p sees positions (p - sliding_window, p] only.
  int sliding_window = 0;
  // [num_heads] or nullptr: head h's softmax gets one more logit, sinks[h] (not scaled), that
  // has no value: out = sum_pos exp(s_pos) v_pos / (sum_pos exp(s_pos) + exp(sinks[h])).
  const float* sinks = nullptr;
};
// PagedAttention with `variant`; the plain overload is this one with a default variant.
void PagedAttention(const float* q, int64_t num_tokens, int num_heads, const KvLayerView& kv,
                    std::span<const int32_t> block_table, int32_t start_position, float scale,
                    const AttentionVariant& variant, float* out);

}  // namespace ringserve::cpu
