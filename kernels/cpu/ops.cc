#include "kernels/cpu/ops.h"

#include <algorithm>
#include <cmath>

#include "common/dtype.h"

namespace ringserve::cpu {
namespace {

constexpr int kLanes = 8;  // independent partial sums per dot product (lets the compiler vectorize)

// Dot products of kRows rows of x (stride `in`) with one weight row, over `in` elements.
template <int kRows>
inline void DotRows(const float* x, int64_t in, const float* w, float* result) {
  float acc[kRows][kLanes] = {};
  int64_t k = 0;
  for (; k + kLanes <= in; k += kLanes) {
    for (int r = 0; r < kRows; ++r) {
      const float* xr = x + r * in + k;
      for (int l = 0; l < kLanes; ++l) acc[r][l] += xr[l] * w[k + l];
    }
  }
  for (int r = 0; r < kRows; ++r) {
    float sum = 0.0f;
    for (int l = 0; l < kLanes; ++l) sum += acc[r][l];
    for (int64_t kk = k; kk < in; ++kk) sum += x[r * in + kk] * w[kk];
    result[r] = sum;
  }
}

}  // namespace

void RmsNorm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
             float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = out + r * dim;
    double sum_sq = 0.0;
    for (int64_t i = 0; i < dim; ++i) sum_sq += static_cast<double>(xr[i]) * xr[i];
    const float inv = 1.0f / std::sqrt(static_cast<float>(sum_sq / dim) + eps);
    for (int64_t i = 0; i < dim; ++i) yr[i] = weight[i] * (xr[i] * inv);
  }
}

void MatMul(const float* x, const float* w, const float* bias, int64_t rows, int64_t in,
            int64_t out_features, float* out) {
  // Blocks of 4 input rows share each pass over a weight row, so the weights (the large
  // operand) are streamed rows/4 times instead of rows times; both operands are read
  // contiguously along `in`.
  constexpr int kBlock = 4;
  int64_t r = 0;
  float result[kBlock];
  for (; r + kBlock <= rows; r += kBlock) {
    for (int64_t n = 0; n < out_features; ++n) {
      DotRows<kBlock>(x + r * in, in, w + n * in, result);
      const float b = bias != nullptr ? bias[n] : 0.0f;
      for (int i = 0; i < kBlock; ++i) out[(r + i) * out_features + n] = result[i] + b;
    }
  }
  for (; r < rows; ++r) {
    for (int64_t n = 0; n < out_features; ++n) {
      DotRows<1>(x + r * in, in, w + n * in, result);
      out[r * out_features + n] = result[0] + (bias != nullptr ? bias[n] : 0.0f);
    }
  }
}

void SiluMul(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void Add(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void Embed(const float* table, int64_t hidden, const int32_t* ids, int64_t n, float* out) {
  for (int64_t t = 0; t < n; ++t) {
    std::copy_n(table + static_cast<int64_t>(ids[t]) * hidden, hidden, out + t * hidden);
  }
}

std::vector<float> RopeInvFreq(int head_dim, double theta) {
  std::vector<float> inv_freq(static_cast<size_t>(head_dim / 2));
  for (int i = 0; i < head_dim / 2; ++i) {
    inv_freq[i] = static_cast<float>(1.0 / std::pow(theta, (2.0 * i) / head_dim));
  }
  return inv_freq;
}

void ApplyLlama3RopeScaling(std::span<float> inv_freq, double factor, double low_freq_factor,
                            double high_freq_factor, int original_max_position_embeddings) {
  const double old_context = original_max_position_embeddings;
  const double low_freq_wavelen = old_context / low_freq_factor;
  const double high_freq_wavelen = old_context / high_freq_factor;
  for (float& f : inv_freq) {
    const double freq = f;
    const double wavelen = 2.0 * M_PI / freq;
    double scaled;
    if (wavelen > low_freq_wavelen) {
      scaled = freq / factor;
    } else if (wavelen < high_freq_wavelen) {
      scaled = freq;
    } else {
      const double smooth =
          (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
      scaled = (1.0 - smooth) * freq / factor + smooth * freq;
    }
    f = static_cast<float>(scaled);
  }
}

void ApplyRope(float* x, int64_t num_tokens, int num_heads, int head_dim, const int32_t* positions,
               const float* inv_freq) {
  ApplyPartialRope(x, num_tokens, num_heads, head_dim, head_dim, positions, inv_freq);
}

void ApplyPartialRope(float* x, int64_t num_tokens, int num_heads, int head_dim, int rotary_dim,
                      const int32_t* positions, const float* inv_freq) {
  const int half = rotary_dim / 2;
  std::vector<float> cos_a(half), sin_a(half);
  for (int64_t t = 0; t < num_tokens; ++t) {
    // fp32 angle, as transformers computes it (position * inv_freq in float32).
    for (int i = 0; i < half; ++i) {
      const float angle = static_cast<float>(positions[t]) * inv_freq[i];
      cos_a[i] = std::cos(angle);
      sin_a[i] = std::sin(angle);
    }
    for (int h = 0; h < num_heads; ++h) {
      float* v = x + (t * num_heads + h) * head_dim;
      for (int i = 0; i < half; ++i) {
        const float x1 = v[i];
        const float x2 = v[i + half];
        v[i] = x1 * cos_a[i] - x2 * sin_a[i];
        v[i + half] = x2 * cos_a[i] + x1 * sin_a[i];
      }
    }
  }
}

void WriteKv(const KvLayerView& kv, std::span<const int32_t> block_table, int32_t start_position,
             int64_t num_tokens, const float* k, const float* v) {
  const int64_t row = static_cast<int64_t>(kv.num_kv_heads) * kv.head_dim;
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t pos = start_position + t;
    const int64_t block = block_table[pos / kv.block_size];
    const int64_t offset = block * kv.block_stride + (pos % kv.block_size) * row;
    if (kv.k8 != nullptr) {
      for (int64_t i = 0; i < row; ++i) {
        kv.k8[offset + i] = FloatToFp8E4M3(k[t * row + i] / kv.k_scale);
        kv.v8[offset + i] = FloatToFp8E4M3(v[t * row + i] / kv.v_scale);
      }
      continue;
    }
    std::copy_n(k + t * row, row, kv.k + offset);
    std::copy_n(v + t * row, row, kv.v + offset);
  }
}

void PagedAttention(const float* q, int64_t num_tokens, int num_heads, const KvLayerView& kv,
                    std::span<const int32_t> block_table, int32_t start_position, float scale,
                    float* out) {
  PagedAttention(q, num_tokens, num_heads, kv, block_table, start_position, scale,
                 AttentionVariant{}, out);
}

void PagedAttention(const float* q, int64_t num_tokens, int num_heads, const KvLayerView& kv,
                    std::span<const int32_t> block_table, int32_t start_position, float scale,
                    const AttentionVariant& variant, float* out) {
  const int d = kv.head_dim;
  const int group = num_heads / kv.num_kv_heads;
  const int64_t row = static_cast<int64_t>(kv.num_kv_heads) * d;
  const int64_t context = start_position + num_tokens;
  // Offset of each cached position's K/V row, resolved through the block table once.
  std::vector<int64_t> row_offset(static_cast<size_t>(context));
  for (int64_t pos = 0; pos < context; ++pos) {
    row_offset[pos] =
        block_table[pos / kv.block_size] * kv.block_stride + (pos % kv.block_size) * row;
  }
  // An fp8 cache is read through fp32 copies of its rows (the chunk's context, dequantized).
  std::vector<float> k_rows, v_rows;
  const float* k_base = kv.k;
  const float* v_base = kv.v;
  if (kv.k8 != nullptr) {
    k_rows.resize(static_cast<size_t>(context * row));
    v_rows.resize(static_cast<size_t>(context * row));
    for (int64_t pos = 0; pos < context; ++pos) {
      for (int64_t i = 0; i < row; ++i) {
        k_rows[pos * row + i] = Fp8E4M3ToFloat(kv.k8[row_offset[pos] + i]) * kv.k_scale;
        v_rows[pos * row + i] = Fp8E4M3ToFloat(kv.v8[row_offset[pos] + i]) * kv.v_scale;
      }
      row_offset[pos] = pos * row;
    }
    k_base = k_rows.data();
    v_base = v_rows.data();
  }
  std::vector<float> scores(static_cast<size_t>(context));
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t visible = start_position + t + 1;  // causal: positions [0, start + t]
    const int64_t first =
        variant.sliding_window > 0 ? std::max<int64_t>(0, visible - variant.sliding_window) : 0;
    for (int h = 0; h < num_heads; ++h) {
      const float* qh = q + (t * num_heads + h) * d;
      const int64_t head_offset = static_cast<int64_t>(h / group) * d;
      float max_score = variant.sinks != nullptr ? variant.sinks[h] : -INFINITY;
      for (int64_t pos = first; pos < visible; ++pos) {
        const float* kh = k_base + row_offset[pos] + head_offset;
        float dot = 0.0f;
        for (int i = 0; i < d; ++i) dot += qh[i] * kh[i];
        scores[pos] = dot * scale;
        max_score = std::max(max_score, scores[pos]);
      }
      float denom = variant.sinks != nullptr ? std::exp(variant.sinks[h] - max_score) : 0.0f;
      for (int64_t pos = first; pos < visible; ++pos) {
        scores[pos] = std::exp(scores[pos] - max_score);
        denom += scores[pos];
      }
      float* oh = out + (t * num_heads + h) * d;
      std::fill_n(oh, d, 0.0f);
      for (int64_t pos = first; pos < visible; ++pos) {
        const float p = scores[pos] / denom;
        const float* vh = v_base + row_offset[pos] + head_offset;
        for (int i = 0; i < d; ++i) oh[i] += p * vh[i];
      }
    }
  }
}

std::vector<float> NormAndProjectRows(const float* x, std::span<const int64_t> rows,
                                      const float* norm, const float* head, int64_t hidden,
                                      int64_t vocab, float eps) {
  const int64_t num_rows = static_cast<int64_t>(rows.size());
  std::vector<float> selected(num_rows * hidden);
  for (int64_t r = 0; r < num_rows; ++r) {
    RmsNorm(x + rows[r] * hidden, norm, 1, hidden, eps, selected.data() + r * hidden);
  }
  std::vector<float> logits(num_rows * vocab);
  MatMul(selected.data(), head, nullptr, num_rows, hidden, vocab, logits.data());
  return logits;
}

}  // namespace ringserve::cpu
