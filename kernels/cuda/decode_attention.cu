// Paged decode attention, one pass with online softmax and split-K over the context. See
// attention.h.
#include <cfloat>

#include "common/status_macros.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/decode_attention_tc.h"
#include "kernels/cuda/decode_merge.cuh"
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/kv_cache_access.cuh"
#include "kernels/cuda/paged_cache.cuh"

namespace ringserve::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxGroup = kDecodeMaxGroup;
constexpr int kMaxGroupDim = kDecodeMaxGroupDim;
constexpr int kUnroll = 4;
constexpr float kLog2e = 1.4426950408889634f;

struct DecodeArgs {
  AttentionShape shape;
  const bf16* q;
  bf16* out;
  DecodeBatch batch;
};

// One CTA per (entry, kv head, head part, split): a group of more than kDecodeMaxGroup query
// heads is cut into DecodeHeadParts(group) parts of at most DecodeHeadsPerCta(group) heads
// (grid.y = kv heads x parts), each part reading the kv head's keys itself. A key is handled by
// head_dim / 8 lanes (16 bytes of K and of V each); every lane keeps a running max / sum /
// unnormalized output per query head of the group over the keys it saw (online softmax), and the
// states are merged across lanes, then warps, at the end. K and V of kUnroll keys are loaded
// together before any math. Head dim 128 runs decode_attention_tc.cu instead (tensor cores).
// KvT: the cache's element type (kv_cache_access.cuh); the K scale is folded into q, the V scale
// into the output.
template <int G, typename KvT>
__global__ void __launch_bounds__(kThreads) DecodeKernel(DecodeArgs a) {
  using Row = KvRow8<KvT>;
  WaitForPreviousKernel();
  __shared__ float partial[kWarps][kMaxGroupDim];
  __shared__ float warp_ml[kWarps][kMaxGroup][2];

  const KvCacheLayer& c = a.shape.cache;
  const int e = blockIdx.x;
  const int full_group = a.shape.num_heads / c.num_kv_heads;
  // DecodeHeadParts / DecodeHeadsPerCta (host functions) of the group.
  const int parts = (full_group + kMaxGroup - 1) / kMaxGroup;
  const int kvh = blockIdx.y / parts;
  const int part = blockIdx.y - kvh * parts;
  // This CTA's query heads: first_head + g for g < group.
  const int per_part = (full_group + parts - 1) / parts;
  const int first_head = kvh * full_group + part * per_part;
  const int group = min(per_part, full_group - part * per_part);
  const int split = blockIdx.z;
  const int ctx = a.batch.context_lens[e];
  const int k_begin = split * a.batch.partition;
  if (k_begin >= ctx) return;
  const int k_end = min(ctx, k_begin + a.batch.partition);
  // Keys before the window are skipped (a split wholly before it leaves an empty partial).
  const int k_first =
      a.shape.sliding_window > 0 ? max(k_begin, ctx - a.shape.sliding_window) : k_begin;
  const int d = c.head_dim;
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
  const PagedKeys keys(c.block_size);

  // q, pre-scaled so that scores are in log2 units.
  const float qscale = a.shape.scale * kLog2e * c.k_scale;
  float qf[G][8];
  float m[G], l[G], acc[G][8];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = -FLT_MAX;
    l[g] = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      acc[g][j] = 0.0f;
      qf[g][j] = 0.0f;
    }
    if (g < group) {
      const bf16* qp =
          a.q + (static_cast<int64_t>(q_row) * a.shape.num_heads + first_head + g) * d + sl * 8;
      Unpack8(*reinterpret_cast<const uint4*>(qp), qf[g]);
#pragma unroll
      for (int j = 0; j < 8; ++j) qf[g][j] *= qscale;
    }
  }

  for (int wb = k_first + warp * keys_per_warp + sub; wb < k_end + sub; wb += stride * kUnroll) {
    typename Row::Raw kr[kUnroll], vr[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int key = wb + u * stride;
      if (key < k_end) {
        const int64_t off = keys.Offset(c, table, key, kvh, d) + sl * 8;
        kr[u] = Row::Load(KvKeys<KvT>(c) + off);
        vr[u] = Row::Load(KvValues<KvT>(c) + off);
      } else {
        kr[u] = Row::Zero();
        vr[u] = Row::Zero();
      }
    }
    float s[G][kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float kf[8];
      Row::Unpack(kr[u], kf);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float dot = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; ++j) dot = fmaf(qf[g][j], kf[j], dot);
        for (int o = lanes_per_key / 2; o > 0; o >>= 1) {
          dot += __shfl_xor_sync(0xffffffffu, dot, o);
        }
        s[g][u] = wb + u * stride < k_end ? dot : -INFINITY;
      }
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float mx = m[g];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) mx = fmaxf(mx, s[g][u]);
      const float corr = exp2f(m[g] - mx);
      m[g] = mx;
      l[g] *= corr;
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[g][j] *= corr;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const float p = exp2f(s[g][u] - mx);
        l[g] += p;
        float vf[8];
        Row::Unpack(vr[u], vf);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[g][j] = fmaf(p, vf[j], acc[g][j]);
      }
    }
  }

  // Merge the key subgroups of the warp (lanes with the same sl), then the warps.
  for (int o = lanes_per_key; o < 32; o <<= 1) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const float om = __shfl_xor_sync(0xffffffffu, m[g], o);
      const float ol = __shfl_xor_sync(0xffffffffu, l[g], o);
      const float mx = fmaxf(m[g], om);
      const float a0 = exp2f(m[g] - mx);
      const float a1 = exp2f(om - mx);
      m[g] = mx;
      l[g] = l[g] * a0 + ol * a1;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float oa = __shfl_xor_sync(0xffffffffu, acc[g][j], o);
        acc[g][j] = acc[g][j] * a0 + oa * a1;
      }
    }
  }
  if (sub == 0) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      if (g < group) {
#pragma unroll
        for (int j = 0; j < 8; ++j) partial[warp][g * d + sl * 8 + j] = acc[g][j] * c.v_scale;
        if (sl == 0) {
          warp_ml[warp][g][0] = m[g];
          warp_ml[warp][g][1] = l[g];
        }
      }
    }
  }
  __syncthreads();

  FinishDecodeSplit<kWarps>(&partial[0][0], &warp_ml[0][0][0], group, d, first_head, split, a.shape,
                            a.batch, a.out);
}

// Merges the splits of one (entry, head): out = sum_s 2^(m_s - M) o_s / sum_s 2^(m_s - M) l_s.
__global__ void DecodeReduceKernel(DecodeArgs a) {
  WaitForPreviousKernel();
  const int e = blockIdx.x;
  const int head = blockIdx.y;
  const int ctx = a.batch.context_lens[e];
  if (ctx <= 0) return;
  const int d = a.shape.cache.head_dim;
  const int used = (ctx + a.batch.partition - 1) / a.batch.partition;
  const int q_row = a.batch.q_rows[e];
  for (int dim = threadIdx.x; dim < d; dim += blockDim.x) {
    a.out[(static_cast<int64_t>(q_row) * a.shape.num_heads + head) * d + dim] =
        __float2bfloat16(MergeDecodeSplits(a.shape, a.batch, e, head, dim, used));
  }
}

}  // namespace

int64_t DecodeSplitTickets(int num_entries, int num_heads) {
  return static_cast<int64_t>(num_entries) * num_heads;  // a CTA's head set per (entry, grid row)
}

int64_t DecodeWorkspaceFloats(int num_entries, int num_heads, int head_dim, int num_splits) {
  return static_cast<int64_t>(num_entries) * num_heads * num_splits * (head_dim + 2);
}

namespace {

absl::Status CheckDecodeShape(const AttentionShape& shape, const DecodeBatch& batch) {
  const KvCacheLayer& c = shape.cache;
  const int d = c.head_dim;
  if (c.num_kv_heads <= 0 || shape.num_heads % c.num_kv_heads != 0 ||
      !(d == 8 || d == 16 || d == 32 || d == 64 || d == 128 || d == 256) ||
      DecodeHeadsPerCta(shape.num_heads / c.num_kv_heads) * d > kMaxGroupDim ||
      batch.num_splits < 1 || (batch.num_splits > 1 && batch.workspace == nullptr) ||
      c.block_size <= 0 || batch.partition < 1) {
    return absl::InvalidArgumentError(
        "LaunchDecodeAttention: unsupported shape (head_dim in {8,16,32,64,128,256}, "
        "DecodeHeadsPerCta(group) * head_dim <= 1024)");
  }
  if (batch.kernel == DecodeAttentionKernel::kTensorCore &&
      (d != 128 || shape.sliding_window > 0 || shape.num_heads / c.num_kv_heads > kMaxGroup)) {
    return absl::InvalidArgumentError(
        "LaunchDecodeAttention: the tensor-core kernel needs head_dim 128, at most 8 query heads "
        "per kv head and no sliding window");
  }
  return absl::OkStatus();
}

// The CUDA-core kernel for the group size, on a cache of KvT.
template <typename KvT>
void LaunchDecodeKernel(int group, dim3 grid, const DecodeArgs& args, LaunchStream stream) {
  if (group == 1) {
    LaunchDependent(DecodeKernel<1, KvT>, grid, kThreads, 0, stream, args);
  } else if (group == 2) {
    LaunchDependent(DecodeKernel<2, KvT>, grid, kThreads, 0, stream, args);
  } else if (group <= 4) {
    LaunchDependent(DecodeKernel<4, KvT>, grid, kThreads, 0, stream, args);
  } else {
    LaunchDependent(DecodeKernel<8, KvT>, grid, kThreads, 0, stream, args);
  }
}

// The split tickets dropped above kMaxSplitsMergedByCta splits: the merging CTA's threads each
// loop over every split for each of their outputs, where the merge kernel spreads the heads over
// blocks.
DecodeBatch WithSplitMergePolicy(DecodeBatch batch) {
  if (batch.num_splits > kMaxSplitsMergedByCta) batch.split_tickets = nullptr;
  return batch;
}

// The kernel that merges the splits, after the attention kernel (none with split tickets).
absl::Status LaunchMergeIfSplit(const DecodeArgs& args, LaunchStream stream) {
  if (args.batch.num_splits > 1 && args.batch.split_tickets == nullptr) {
    LaunchDependent(DecodeReduceKernel, dim3(args.batch.num_entries, args.shape.num_heads), 128, 0,
                    stream, args);
  }
  return LaunchStatus("DecodeKernel");
}

}  // namespace

absl::Status LaunchDecodeAttention(const AttentionShape& shape, const bf16* q, bf16* out,
                                   const DecodeBatch& requested, LaunchStream stream) {
  const DecodeBatch batch = WithSplitMergePolicy(requested);
  RS_RETURN_IF_ERROR(CheckDecodeShape(shape, batch));
  if (batch.num_entries == 0) return absl::OkStatus();
  const KvCacheLayer& c = shape.cache;
  const DecodeArgs args{shape, q, out, batch};
  const int full_group = shape.num_heads / c.num_kv_heads;
  const dim3 grid(batch.num_entries, c.num_kv_heads * DecodeHeadParts(full_group),
                  batch.num_splits);
  const int group = DecodeHeadsPerCta(full_group);
  if (batch.kernel == DecodeAttentionKernel::kTensorCore) {
    RS_RETURN_IF_ERROR(LaunchDecodeAttentionTc(shape, q, {}, out, batch, stream));
  } else if (c.k8 != nullptr) {
    LaunchDecodeKernel<uint8_t>(group, grid, args, stream);
  } else {
    LaunchDecodeKernel<bf16>(group, grid, args, stream);
  }
  return LaunchMergeIfSplit(args, stream);
}

absl::Status LaunchDecodeAttentionFromQkv(const AttentionShape& shape, const DecodeQkv& qkv,
                                          bf16* out, const DecodeBatch& requested,
                                          LaunchStream stream) {
  const DecodeBatch batch = WithSplitMergePolicy(requested);
  RS_RETURN_IF_ERROR(CheckDecodeShape(shape, batch));
  if (batch.kernel != DecodeAttentionKernel::kTensorCore || qkv.qkv == nullptr ||
      qkv.positions == nullptr || qkv.slots == nullptr || qkv.inv_freq == nullptr) {
    return absl::InvalidArgumentError(
        "LaunchDecodeAttentionFromQkv: needs head_dim 128 on the tensor-core kernel and the "
        "projection, positions, slots and frequencies");
  }
  if (batch.num_entries == 0) return absl::OkStatus();
  RS_RETURN_IF_ERROR(LaunchDecodeAttentionTc(shape, nullptr, qkv, out, batch, stream));
  return LaunchMergeIfSplit({shape, nullptr, out, batch}, stream);
}

}  // namespace ringserve::cuda
