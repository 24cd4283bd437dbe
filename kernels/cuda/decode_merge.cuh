// Internal to the decode attention kernels (decode_attention.cu, decode_attention_tc.cu): the
// end of one CTA's work on one (entry, kv head, split). Each warp has left, per query head g of
// the group, its unnormalized output partial[w * kDecodeMaxGroupDim + g * d + dim] and its
// (running max, sum of exponentials) in warp_ml[(w * kDecodeMaxGroup + g) * 2 + {0, 1}], in
// log2 units, in shared memory, followed by a __syncthreads(); g is query head first_head + g
// (the CTA's heads: a kv head's group, or a part of it). FinishDecodeSplit merges the
// warps and writes the normalized bf16 output (one split) or the unnormalized output and its
// (max, sum) into the workspace; then, with batch.split_tickets, the CTA of an (entry, head set)
// that finishes last merges the splits (MergeDecodeSplits) — else the split-merging kernel does.
// Every thread of the CTA calls it.
#pragma once

#include <cfloat>
#include <cstdint>

#include "kernels/cuda/attention.h"

namespace ringserve::cuda {

// kDecodeMaxGroup and kDecodeMaxGroupDim (group * head_dim) are in kernel_selector.h.

// The splits [0, used) of (entry e, query head) merged, dimension dim: out = sum_s 2^(m_s - M)
// o_s / (sum_s 2^(m_s - M) l_s + sink), read through L2 (other CTAs wrote them).
__device__ __forceinline__ float MergeDecodeSplits(const AttentionShape& shape,
                                                   const DecodeBatch& batch, int e, int head,
                                                   int dim, int used) {
  const int d = shape.cache.head_dim;
  const int num_splits = batch.num_splits;
  const int64_t part0 = (static_cast<int64_t>(e) * shape.num_heads + head) * num_splits;
  const float* ml =
      batch.workspace + static_cast<int64_t>(batch.num_entries) * shape.num_heads * num_splits * d;
  float mx = -FLT_MAX;
  for (int s = 0; s < used; ++s) mx = fmaxf(mx, __ldcg(ml + 2 * (part0 + s)));
  float denom = shape.sinks != nullptr ? exp2f(shape.sinks[head] * 1.4426950408889634f - mx) : 0.0f;
  for (int s = 0; s < used; ++s) {
    denom += exp2f(__ldcg(ml + 2 * (part0 + s)) - mx) * __ldcg(ml + 2 * (part0 + s) + 1);
  }
  float v = 0.0f;
  for (int s = 0; s < used; ++s) {
    v += exp2f(__ldcg(ml + 2 * (part0 + s)) - mx) * __ldcg(batch.workspace + (part0 + s) * d + dim);
  }
  return v / denom;
}

template <int kWarps>
__device__ __forceinline__ void FinishDecodeSplit(const float* partial, const float* warp_ml,
                                                  int group, int d, int first_head, int split,
                                                  const AttentionShape& shape,
                                                  const DecodeBatch& batch, bf16* out) {
  const int e = blockIdx.x;
  const int q_row = batch.q_rows[e];
  const int num_splits = gridDim.z;
  for (int idx = threadIdx.x; idx < group * d; idx += blockDim.x) {
    const int g = idx / d;
    const int dim = idx - g * d;
    float mx = -FLT_MAX;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, warp_ml[(w * kDecodeMaxGroup + g) * 2]);
    float v = 0.0f, sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float f = exp2f(warp_ml[(w * kDecodeMaxGroup + g) * 2] - mx);
      v += f * partial[w * kDecodeMaxGroupDim + idx];
      sum += f * warp_ml[(w * kDecodeMaxGroup + g) * 2 + 1];
    }
    const int head = first_head + g;
    if (num_splits == 1) {
      // A sink (a logit without a value) only enlarges the denominator.
      if (shape.sinks != nullptr) sum += exp2f(shape.sinks[head] * 1.4426950408889634f - mx);
      out[(static_cast<int64_t>(q_row) * shape.num_heads + head) * d + dim] =
          __float2bfloat16(v / sum);
    } else {
      const int64_t part = (static_cast<int64_t>(e) * shape.num_heads + head) * num_splits + split;
      batch.workspace[part * d + dim] = v;
      if (dim == 0) {
        float* ml = batch.workspace +
                    static_cast<int64_t>(batch.num_entries) * shape.num_heads * num_splits * d;
        ml[2 * part] = mx;
        ml[2 * part + 1] = sum;
      }
    }
  }
  if (num_splits == 1 || batch.split_tickets == nullptr) return;
  // The CTAs of this (entry, head set) with keys count in; the last merges their splits.
  __shared__ bool merges;
  __threadfence();  // this CTA's partials before its ticket
  __syncthreads();
  const int used = (batch.context_lens[e] + batch.partition - 1) / batch.partition;
  if (threadIdx.x == 0) {
    int32_t* ticket = batch.split_tickets + static_cast<int64_t>(e) * gridDim.y + blockIdx.y;
    merges = atomicAdd(ticket, 1) == used - 1;
    if (merges) *ticket = 0;  // zero again for the next launch
  }
  __syncthreads();
  if (!merges) return;
  __threadfence();  // the other CTAs' partials
  for (int idx = threadIdx.x; idx < group * d; idx += blockDim.x) {
    const int g = idx / d;
    const int head = first_head + g;
    out[(static_cast<int64_t>(q_row) * shape.num_heads + head) * d + idx - g * d] =
        __float2bfloat16(MergeDecodeSplits(shape, batch, e, head, idx - g * d, used));
  }
}

}  // namespace ringserve::cuda
