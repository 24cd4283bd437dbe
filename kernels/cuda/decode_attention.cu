// Paged decode attention with split-K over the context. See attention.h.
#include <cfloat>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/device_utils.cuh"

namespace ringserve::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxGroup = 8;
constexpr int kMaxGroupDim = 1024;  // group * head_dim
constexpr int kUnroll = 4;
constexpr float kLog2e = 1.4426950408889634f;

struct DecodeArgs {
  AttentionShape shape;
  const bf16* q;
  bf16* out;
  DecodeBatch batch;
};

__device__ __forceinline__ const bf16* CacheRow(const bf16* base, const int32_t* table, int key,
                                                const KvCacheLayer& c, int kvh) {
  const int block = table[key / c.block_size];
  const int slot = key - (key / c.block_size) * c.block_size;
  return base +
         ((static_cast<int64_t>(block) * c.num_kv_heads + kvh) * c.block_size + slot) * c.head_dim;
}

__global__ void __launch_bounds__(kThreads) DecodeKernel(DecodeArgs a) {
  __shared__ float scores[kMaxGroup][kDecodePartition];
  __shared__ float partial[kWarps][kMaxGroupDim];
  __shared__ float row_max[kMaxGroup];
  __shared__ float row_sum[kMaxGroup];

  const KvCacheLayer& c = a.shape.cache;
  const int e = blockIdx.x;
  const int kvh = blockIdx.y;
  const int split = blockIdx.z;
  const int ctx = a.batch.context_lens[e];
  const int k_begin = split * a.batch.partition;
  if (k_begin >= ctx) return;
  const int k_end = min(ctx, k_begin + a.batch.partition);
  const int n = k_end - k_begin;
  const int d = c.head_dim;
  const int group = a.shape.num_heads / c.num_kv_heads;
  const int lanes_per_key = d / 8;
  const int keys_per_warp = 32 / lanes_per_key;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int sub = lane / lanes_per_key;
  const int sl = lane - sub * lanes_per_key;
  const int stride = kWarps * keys_per_warp;
  const int q_row = a.batch.q_rows[e];
  const int32_t* table =
      a.batch.block_tables + static_cast<int64_t>(a.batch.table_rows[e]) * a.batch.max_blocks;

  // q, pre-scaled so that scores are in log2 units.
  const float qscale = a.shape.scale * kLog2e;
  float qf[kMaxGroup][8];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g < group) {
      const bf16* qp =
          a.q + (static_cast<int64_t>(q_row) * a.shape.num_heads + kvh * group + g) * d + sl * 8;
      Unpack8(*reinterpret_cast<const uint4*>(qp), qf[g]);
#pragma unroll
      for (int j = 0; j < 8; ++j) qf[g][j] *= qscale;
    }
  }

  // Phase 1: scores.
  for (int wb = k_begin + warp * keys_per_warp; wb < k_end; wb += stride * kUnroll) {
    uint4 kv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int key = wb + sub + u * stride;
      kv[u] = key < k_end
                  ? *reinterpret_cast<const uint4*>(CacheRow(c.k, table, key, c, kvh) + sl * 8)
                  : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int key = wb + sub + u * stride;
      float kf[8];
      Unpack8(kv[u], kf);
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g < group) {
          float dot = 0.0f;
#pragma unroll
          for (int j = 0; j < 8; ++j) dot = fmaf(qf[g][j], kf[j], dot);
          for (int off = lanes_per_key / 2; off > 0; off >>= 1) {
            dot += __shfl_xor_sync(0xffffffffu, dot, off);
          }
          if (sl == 0 && key < k_end) scores[g][key - k_begin] = dot;
        }
      }
    }
  }
  __syncthreads();

  // Phase 2: softmax numerators per query head.
  for (int g = warp; g < group; g += kWarps) {
    float mx = -FLT_MAX;
    for (int i = lane; i < n; i += 32) mx = fmaxf(mx, scores[g][i]);
    mx = WarpMax(mx);
    float sum = 0.0f;
    for (int i = lane; i < n; i += 32) {
      const float p = exp2f(scores[g][i] - mx);
      scores[g][i] = p;
      sum += p;
    }
    sum = WarpSum(sum);
    if (lane == 0) {
      row_max[g] = mx;
      row_sum[g] = sum;
    }
  }
  __syncthreads();

  // Phase 3: p . V.
  float acc[kMaxGroup][8];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[g][j] = 0.0f;
  }
  for (int wb = k_begin + warp * keys_per_warp; wb < k_end; wb += stride * kUnroll) {
    uint4 vv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int key = wb + sub + u * stride;
      vv[u] = key < k_end
                  ? *reinterpret_cast<const uint4*>(CacheRow(c.v, table, key, c, kvh) + sl * 8)
                  : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int key = wb + sub + u * stride;
      if (key < k_end) {
        float vf[8];
        Unpack8(vv[u], vf);
#pragma unroll
        for (int g = 0; g < kMaxGroup; ++g) {
          if (g < group) {
            const float p = scores[g][key - k_begin];
#pragma unroll
            for (int j = 0; j < 8; ++j) acc[g][j] = fmaf(p, vf[j], acc[g][j]);
          }
        }
      }
    }
  }
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g < group) {
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        for (int off = lanes_per_key; off < 32; off <<= 1) {
          acc[g][j] += __shfl_xor_sync(0xffffffffu, acc[g][j], off);
        }
        if (sub == 0) partial[warp][g * d + sl * 8 + j] = acc[g][j];
      }
    }
  }
  __syncthreads();

  const int num_splits = gridDim.z;
  for (int idx = threadIdx.x; idx < group * d; idx += kThreads) {
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) v += partial[w][idx];
    const int g = idx / d;
    const int dim = idx - g * d;
    const int head = kvh * group + g;
    if (num_splits == 1) {
      a.out[(static_cast<int64_t>(q_row) * a.shape.num_heads + head) * d + dim] =
          __float2bfloat16(v / row_sum[g]);
    } else {
      const int64_t part =
          (static_cast<int64_t>(e) * a.shape.num_heads + head) * num_splits + split;
      a.batch.workspace[part * d + dim] = v;
      if (dim == 0) {
        float* ml = a.batch.workspace +
                    static_cast<int64_t>(a.batch.num_entries) * a.shape.num_heads * num_splits * d;
        ml[2 * part] = row_max[g];
        ml[2 * part + 1] = row_sum[g];
      }
    }
  }
}

// Merges the splits of one (entry, head): out = sum_s 2^(m_s - M) o_s / sum_s 2^(m_s - M) l_s.
__global__ void DecodeReduceKernel(DecodeArgs a) {
  const int e = blockIdx.x;
  const int head = blockIdx.y;
  const int ctx = a.batch.context_lens[e];
  if (ctx <= 0) return;
  const int d = a.shape.cache.head_dim;
  const int num_splits = a.batch.num_splits;
  const int used = (ctx + a.batch.partition - 1) / a.batch.partition;
  const int64_t part0 = (static_cast<int64_t>(e) * a.shape.num_heads + head) * num_splits;
  const float* ml = a.batch.workspace +
                    static_cast<int64_t>(a.batch.num_entries) * a.shape.num_heads * num_splits * d;
  float mx = -FLT_MAX;
  for (int s = 0; s < used; ++s) mx = fmaxf(mx, ml[2 * (part0 + s)]);
  float denom = 0.0f;
  for (int s = 0; s < used; ++s) denom += exp2f(ml[2 * (part0 + s)] - mx) * ml[2 * (part0 + s) + 1];
  const int q_row = a.batch.q_rows[e];
  for (int dim = threadIdx.x; dim < d; dim += blockDim.x) {
    float v = 0.0f;
    for (int s = 0; s < used; ++s) {
      v += exp2f(ml[2 * (part0 + s)] - mx) * a.batch.workspace[(part0 + s) * d + dim];
    }
    a.out[(static_cast<int64_t>(q_row) * a.shape.num_heads + head) * d + dim] =
        __float2bfloat16(v / denom);
  }
}

}  // namespace

int64_t DecodeWorkspaceFloats(int num_entries, int num_heads, int head_dim, int num_splits) {
  return static_cast<int64_t>(num_entries) * num_heads * num_splits * (head_dim + 2);
}

absl::Status LaunchDecodeAttention(const AttentionShape& shape, const bf16* q, bf16* out,
                                   const DecodeBatch& batch, cudaStream_t stream) {
  const KvCacheLayer& c = shape.cache;
  const int d = c.head_dim;
  if (c.num_kv_heads <= 0 || shape.num_heads % c.num_kv_heads != 0 ||
      shape.num_heads / c.num_kv_heads > kMaxGroup ||
      !(d == 16 || d == 32 || d == 64 || d == 128 || d == 256) ||
      (shape.num_heads / c.num_kv_heads) * d > kMaxGroupDim || batch.num_splits < 1 ||
      (batch.num_splits > 1 && batch.workspace == nullptr) || c.block_size <= 0 ||
      batch.partition < 1 || batch.partition > kDecodePartition) {
    return absl::InvalidArgumentError(
        "LaunchDecodeAttention: unsupported shape (head_dim in {16,32,64,128,256}, group <= 8, "
        "group * head_dim <= 1024)");
  }
  if (batch.num_entries == 0) return absl::OkStatus();
  const DecodeArgs args{shape, q, out, batch};
  const dim3 grid(batch.num_entries, c.num_kv_heads, batch.num_splits);
  DecodeKernel<<<grid, kThreads, 0, stream>>>(args);
  if (batch.num_splits > 1) {
    DecodeReduceKernel<<<dim3(batch.num_entries, shape.num_heads), 128, 0, stream>>>(args);
  }
  return LaunchStatus("DecodeKernel");
}

}  // namespace ringserve::cuda
