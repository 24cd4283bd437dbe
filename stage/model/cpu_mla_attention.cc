#include "stage/model/cpu_mla_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/ops.h"

namespace ringserve {
namespace {

const float* OrNull(const std::vector<float>& v) { return v.empty() ? nullptr : v.data(); }

// In-place softmax over scores[0, n).
void Softmax(float* scores, int64_t n) {
  float max_score = -std::numeric_limits<float>::infinity();
  for (int64_t s = 0; s < n; ++s) max_score = std::max(max_score, scores[s]);
  float sum = 0;
  for (int64_t s = 0; s < n; ++s) {
    scores[s] = std::exp(scores[s] - max_score);
    sum += scores[s];
  }
  for (int64_t s = 0; s < n; ++s) scores[s] /= sum;
}

struct Dims {
  int64_t hidden, heads, nope, rope, v, latent, qk, kv_b_row;
};

Dims DimsOf(const ModelConfig& c) {
  const MlaConfig& m = *c.mla;
  return {.hidden = c.hidden_size,
          .heads = c.num_heads,
          .nope = m.qk_nope_head_dim,
          .rope = m.qk_rope_head_dim,
          .v = m.v_head_dim,
          .latent = m.kv_lora_rank,
          .qk = m.qk_head_dim(),
          .kv_b_row = m.qk_nope_head_dim + m.v_head_dim};
}

// Attention of one chunk's queries with the up-projections absorbed.
//   q: [n, heads, qk] (rope part rotated); attn: [n, heads, v].
void AttendAbsorbed(const Dims& d, const MlaWeights& w, const SequenceChunk& chunk, float scale,
                    const LatentKvLayerView& kv, const float* q, float* attn) {
  const int64_t context = chunk.start_position + chunk.num_tokens;
  std::vector<float> q_latent(d.latent), o_latent(d.latent), scores(context);
  for (int32_t i = 0; i < chunk.num_tokens; ++i) {
    const int64_t visible = chunk.start_position + i + 1;
    for (int64_t h = 0; h < d.heads; ++h) {
      const float* q_nope = q + (i * d.heads + h) * d.qk;
      const float* q_pe = q_nope + d.nope;
      // q_latent = W_uk_h^T q_nope, W_uk_h = kv_b rows [h * kv_b_row, + nope).
      std::fill(q_latent.begin(), q_latent.end(), 0.0f);
      for (int64_t r = 0; r < d.nope; ++r) {
        const float* w_row = w.kv_b_w.data() + (h * d.kv_b_row + r) * d.latent;
        for (int64_t c = 0; c < d.latent; ++c) q_latent[c] += q_nope[r] * w_row[c];
      }
      for (int64_t s = 0; s < visible; ++s) {
        const float* row = kv.Row(chunk.block_table, static_cast<int32_t>(s));
        float dot = 0;
        for (int64_t c = 0; c < d.latent; ++c) dot += q_latent[c] * row[c];
        for (int64_t r = 0; r < d.rope; ++r) dot += q_pe[r] * row[d.latent + r];
        scores[s] = dot * scale;
      }
      Softmax(scores.data(), visible);
      std::fill(o_latent.begin(), o_latent.end(), 0.0f);
      for (int64_t s = 0; s < visible; ++s) {
        const float* row = kv.Row(chunk.block_table, static_cast<int32_t>(s));
        for (int64_t c = 0; c < d.latent; ++c) o_latent[c] += scores[s] * row[c];
      }
      // out = W_uv_h o_latent, W_uv_h = kv_b rows [h * kv_b_row + nope, + v).
      float* out = attn + (i * d.heads + h) * d.v;
      for (int64_t e = 0; e < d.v; ++e) {
        const float* w_row = w.kv_b_w.data() + (h * d.kv_b_row + d.nope + e) * d.latent;
        float sum = 0;
        for (int64_t c = 0; c < d.latent; ++c) sum += o_latent[c] * w_row[c];
        out[e] = sum;
      }
    }
  }
}

// Attention of one chunk's queries over keys and values up-projected from the cached latents.
void AttendExpanded(const Dims& d, const MlaWeights& w, const SequenceChunk& chunk, float scale,
                    const LatentKvLayerView& kv, const float* q, float* attn) {
  const int64_t context = chunk.start_position + chunk.num_tokens;
  std::vector<float> latents(context * d.latent), k_pe(context * d.rope);
  for (int64_t s = 0; s < context; ++s) {
    const float* row = kv.Row(chunk.block_table, static_cast<int32_t>(s));
    std::copy(row, row + d.latent, latents.begin() + s * d.latent);
    std::copy(row + d.latent, row + d.latent + d.rope, k_pe.begin() + s * d.rope);
  }
  // [context, heads, nope + v]: each head's key (no-rope part) and value.
  std::vector<float> kv_heads(context * d.heads * d.kv_b_row);
  cpu::MatMul(latents.data(), w.kv_b_w.data(), nullptr, context, d.latent, d.heads * d.kv_b_row,
              kv_heads.data());
  std::vector<float> scores(context);
  for (int32_t i = 0; i < chunk.num_tokens; ++i) {
    const int64_t visible = chunk.start_position + i + 1;
    for (int64_t h = 0; h < d.heads; ++h) {
      const float* q_nope = q + (i * d.heads + h) * d.qk;
      const float* q_pe = q_nope + d.nope;
      for (int64_t s = 0; s < visible; ++s) {
        const float* k_nope = kv_heads.data() + (s * d.heads + h) * d.kv_b_row;
        float dot = 0;
        for (int64_t r = 0; r < d.nope; ++r) dot += q_nope[r] * k_nope[r];
        for (int64_t r = 0; r < d.rope; ++r) dot += q_pe[r] * k_pe[s * d.rope + r];
        scores[s] = dot * scale;
      }
      Softmax(scores.data(), visible);
      float* out = attn + (i * d.heads + h) * d.v;
      std::fill(out, out + d.v, 0.0f);
      for (int64_t s = 0; s < visible; ++s) {
        const float* value = kv_heads.data() + (s * d.heads + h) * d.kv_b_row + d.nope;
        for (int64_t e = 0; e < d.v; ++e) out[e] += scores[s] * value[e];
      }
    }
  }
}

}  // namespace

MlaPath SelectMlaPath(int32_t num_tokens) {
  return num_tokens <= kMlaAbsorbedMaxTokens ? MlaPath::kAbsorbed : MlaPath::kExpanded;
}

void RotateMlaRope(float* x, int rope_dim, int32_t position, const float* inv_freq, float factor,
                   bool interleave) {
  const int half = rope_dim / 2;
  for (int i = 0; i < half; ++i) {
    const float angle = static_cast<float>(position) * inv_freq[i];
    const float cos_a = std::cos(angle) * factor;
    const float sin_a = std::sin(angle) * factor;
    float& a = interleave ? x[2 * i] : x[i];
    float& b = interleave ? x[2 * i + 1] : x[i + half];
    const float x1 = a;
    const float x2 = b;
    a = x1 * cos_a - x2 * sin_a;
    b = x2 * cos_a + x1 * sin_a;
  }
}

void MlaAttention(const MlaAttentionArgs& args, const float* h, float* out) {
  const ModelConfig& c = *args.config;
  const MlaConfig& m = *c.mla;
  const MlaWeights& w = *args.weights;
  const Dims d = DimsOf(c);
  int64_t tokens = 0;
  for (const SequenceChunk& chunk : args.chunks) tokens += chunk.num_tokens;
  const float factor = static_cast<float>(m.rope_attention_factor);
  const float scale = static_cast<float>(m.softmax_scale);

  std::vector<float> q(tokens * d.heads * d.qk);
  if (m.q_lora_rank > 0) {
    std::vector<float> q_a(tokens * m.q_lora_rank);
    cpu::MatMul(h, w.q_a_w.data(), OrNull(w.q_a_b), tokens, d.hidden, m.q_lora_rank, q_a.data());
    cpu::RmsNorm(q_a.data(), w.q_a_norm.data(), tokens, m.q_lora_rank, kMlaLatentNormEps,
                 q_a.data());
    cpu::MatMul(q_a.data(), w.q_b_w.data(), nullptr, tokens, m.q_lora_rank, d.heads * d.qk,
                q.data());
  } else {
    cpu::MatMul(h, w.q_w.data(), nullptr, tokens, d.hidden, d.heads * d.qk, q.data());
  }
  const int64_t row_dim = d.latent + d.rope;
  std::vector<float> compressed(tokens * row_dim);
  cpu::MatMul(h, w.kv_a_w.data(), OrNull(w.kv_a_b), tokens, d.hidden, row_dim, compressed.data());
  for (int64_t t = 0; t < tokens; ++t) {
    float* row = compressed.data() + t * row_dim;
    cpu::RmsNorm(row, w.kv_a_norm.data(), 1, d.latent, kMlaLatentNormEps, row);
    RotateMlaRope(row + d.latent, static_cast<int>(d.rope), args.positions[t], args.inv_freq,
                  factor, m.rope_interleave);
    for (int64_t h_i = 0; h_i < d.heads; ++h_i) {
      RotateMlaRope(q.data() + (t * d.heads + h_i) * d.qk + d.nope, static_cast<int>(d.rope),
                    args.positions[t], args.inv_freq, factor, m.rope_interleave);
    }
  }

  std::vector<float> attn(tokens * d.heads * d.v);
  int64_t offset = 0;
  for (const SequenceChunk& chunk : args.chunks) {
    for (int32_t i = 0; i < chunk.num_tokens; ++i) {
      const float* src = compressed.data() + (offset + i) * row_dim;
      std::copy(src, src + row_dim, args.kv.Row(chunk.block_table, chunk.start_position + i));
    }
    const MlaPath path = args.path.value_or(SelectMlaPath(chunk.num_tokens));
    const float* chunk_q = q.data() + offset * d.heads * d.qk;
    float* chunk_attn = attn.data() + offset * d.heads * d.v;
    if (path == MlaPath::kAbsorbed) {
      AttendAbsorbed(d, w, chunk, scale, args.kv, chunk_q, chunk_attn);
    } else {
      AttendExpanded(d, w, chunk, scale, args.kv, chunk_q, chunk_attn);
    }
    offset += chunk.num_tokens;
  }
  cpu::MatMul(attn.data(), w.o_w.data(), OrNull(w.o_b), tokens, d.heads * d.v, d.hidden, out);
}

}  // namespace ringserve
