// MoE routing on the GPU: router logits, top-k under every scoring rule, grouping by expert and
// the weighted combine. See moe.h; the top-k follows stage/model/moe_router.cc rule by rule.
#include <cfloat>

#include "common/status_macros.h"
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/moe.h"

namespace ringserve::cuda {
namespace {

constexpr int kLogitTokens = kMoeFusedRouteTokens;  // tokens per router-logits block
constexpr int kLogitExperts = 2;                    // experts per router-logits block
constexpr int kLogitThreads = 256;                  // threads of a router-logits block
constexpr int kLogitPreloads = 2;  // float4 columns a thread loads before the wait (hidden 2048)
static_assert(kLogitExperts * kLogitTokens <= kLogitThreads);
constexpr int kRouteWarps = 4;   // tokens per top-k block (large steps)
constexpr int kSmallWarps = 32;  // the single-block router
constexpr int kMaxTopK = 32;

// Block (token block, expert block): kLogitExperts experts' fp32 rows are split over all
// kLogitThreads threads (float4 columns, several loads in flight per thread), each thread
// accumulating kLogitTokens tokens; one block reduction at the end. A decode step's 1 MB router
// (128 experts x 2048) thus streams through 64 blocks of 8 warps, not one warp per expert. Calls
// WaitForPreviousKernel (after its first router loads).
__device__ void RouterLogitsBlock(const bf16* __restrict__ x, const float* __restrict__ router,
                                  const float* __restrict__ bias, float* __restrict__ logits,
                                  int tokens, int experts, int hidden) {
  __shared__ float partial[kLogitThreads / 32][kLogitExperts * kLogitTokens];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int e0 = blockIdx.y * kLogitExperts;
  const int t0 = blockIdx.x * kLogitTokens;
  const int ne = min(kLogitExperts, experts - e0);
  const int nt = min(kLogitTokens, tokens - t0);
  const int vecs = hidden / 4;
  // The block's experts' float4 column v (zeros past the experts).
  const auto load_columns = [&](int v, float4(&wv)[kLogitExperts]) {
#pragma unroll
    for (int j = 0; j < kLogitExperts; ++j) {
      wv[j] = j < ne ? __ldg(reinterpret_cast<const float4*>(router + static_cast<int64_t>(e0 + j) *
                                                                          hidden) +
                             v)
                     : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  };
  // The router is never written by a kernel: its first columns load before the wait.
  float4 preloaded[kLogitPreloads][kLogitExperts];
#pragma unroll
  for (int p = 0; p < kLogitPreloads; ++p) {
    const int v = threadIdx.x + p * kLogitThreads;
    if (v < vecs) load_columns(v, preloaded[p]);
  }
  WaitForPreviousKernel();
  float acc[kLogitExperts][kLogitTokens];
#pragma unroll
  for (int j = 0; j < kLogitExperts; ++j) {
#pragma unroll
    for (int i = 0; i < kLogitTokens; ++i) acc[j][i] = 0.0f;
  }
  const auto accumulate = [&](int v, const float4(&wv)[kLogitExperts]) {
#pragma unroll
    for (int i = 0; i < kLogitTokens; ++i) {
      if (i >= nt) break;
      float xf[4];
      Unpack4(__ldg(reinterpret_cast<const uint2*>(x + static_cast<int64_t>(t0 + i) * hidden) + v),
              xf);
#pragma unroll
      for (int j = 0; j < kLogitExperts; ++j) {
        acc[j][i] = fmaf(wv[j].x, xf[0], acc[j][i]);
        acc[j][i] = fmaf(wv[j].y, xf[1], acc[j][i]);
        acc[j][i] = fmaf(wv[j].z, xf[2], acc[j][i]);
        acc[j][i] = fmaf(wv[j].w, xf[3], acc[j][i]);
      }
    }
  };
  // Columns in the same order as ever (v ascending per thread): the sums do not change.
#pragma unroll
  for (int p = 0; p < kLogitPreloads; ++p) {
    const int v = threadIdx.x + p * kLogitThreads;
    if (v < vecs) accumulate(v, preloaded[p]);
  }
#pragma unroll 2
  for (int v = threadIdx.x + kLogitPreloads * kLogitThreads; v < vecs; v += kLogitThreads) {
    float4 wv[kLogitExperts];
    load_columns(v, wv);
    accumulate(v, wv);
  }
#pragma unroll
  for (int j = 0; j < kLogitExperts; ++j) {
#pragma unroll
    for (int i = 0; i < kLogitTokens; ++i) {
      const float sum = WarpSum(acc[j][i]);
      if (lane == 0) partial[warp][j * kLogitTokens + i] = sum;
    }
  }
  __syncthreads();
  // One thread per (expert, token) of the block adds the warps' sums in warp order.
  const int j = threadIdx.x / kLogitTokens, i = threadIdx.x % kLogitTokens;
  if (j >= ne || i >= nt) return;
  float sum = 0.0f;
#pragma unroll
  for (int w = 0; w < kLogitThreads / 32; ++w) sum += partial[w][threadIdx.x];
  const int e = e0 + j;
  logits[static_cast<int64_t>(t0 + i) * experts + e] = sum + (bias ? bias[e] : 0.0f);
}

__global__ void __launch_bounds__(kLogitThreads)
    RouterLogitsKernel(const bf16* __restrict__ x, const float* __restrict__ router,
                       const float* __restrict__ bias, float* __restrict__ logits, int tokens,
                       int experts, int hidden) {
  RouterLogitsBlock(x, router, bias, logits, tokens, experts, hidden);
}

// (value, index) a beats b: larger value, or equal value and lower index (moe_router.cc's TopK).
__device__ __forceinline__ bool Beats(float va, int ia, float vb, int ib) {
  return va > vb || (va == vb && ia < ib);
}

// Orders floats as unsigned integers: a larger value has a larger key; -0 counts as +0 (Beats
// holds them equal).
__device__ __forceinline__ unsigned OrderKey(float v) {
  const unsigned u = __float_as_uint(v == 0.0f ? 0.0f : v);
  return (u & 0x80000000u) ? ~u : u | 0x80000000u;
}

// The warp's best (value, index) over values[0, n) not marked in `taken` (lane-owned bits: bit i
// of lane l is index l + 32 i), ties to the lower index. Every lane gets the result. Two warp
// reductions (the largest key, then the lowest index holding it) in place of shuffle rounds.
__device__ __forceinline__ int WarpArgBest(const float* values, int n, uint32_t taken,
                                           float* best) {
  const int lane = threadIdx.x & 31;
  unsigned bk = 0;
  int bi = 0x7fffffff;
  for (int i = 0, idx = lane; idx < n; ++i, idx += 32) {
    if (taken & (1u << i)) continue;
    const unsigned key = OrderKey(values[idx]);
    if (bi == 0x7fffffff || key > bk) {  // the lane's indices ascend: ties keep the lower
      bk = key;
      bi = idx;
    }
  }
  const unsigned top = __reduce_max_sync(0xffffffffu, bk);
  const int idx = __reduce_min_sync(0xffffffffu, bk == top ? bi : 0x7fffffff);
  *best = values[idx];
  return idx;
}

// Top-k of values[0, n) into ids[0, k) (lane 0 writes), largest first. Returns nothing; `vals`
// (lane 0) gets the chosen values.
__device__ __forceinline__ void WarpTopK(const float* values, int n, int k, int* ids, float* vals) {
  const int lane = threadIdx.x & 31;
  uint32_t taken = 0;
  for (int j = 0; j < k; ++j) {
    float v;
    const int idx = WarpArgBest(values, n, taken, &v);
    if ((idx & 31) == lane) taken |= 1u << (idx >> 5);
    if (lane == 0) {
      ids[j] = idx;
      vals[j] = v;
    }
  }
  __syncwarp();
}

// The topk_group best groups (ties to the lower group) as a bit mask, every lane; lane g holds
// group g's score.
__device__ __forceinline__ unsigned KeptGroups(const RouterOptions& o, float group_score) {
  const int lane = threadIdx.x & 31;
  int better = 0;
  for (int g = 0; g < o.n_group; ++g) {
    const float sg = __shfl_sync(0xffffffffu, group_score, g);
    if (lane < o.n_group && g != lane && Beats(sg, g, group_score, lane)) ++better;
  }
  return __ballot_sync(0xffffffffu, lane < o.n_group && better < o.topk_group);
}

// One token's routing by one warp. `scratch`: 2 * experts floats + 64 words of this warp's shared
// memory. Lane 0 writes ids and weights of the token (top_k each); order[0, top_k) keeps the ids
// for the caller. Global memory is only written here, never read back (a decode step's routing
// is on its critical path: every read-back is an L2 round trip).
__device__ void RouteToken(const RouterOptions& o, const float* __restrict__ row,
                           const float* __restrict__ correction_bias, float* score, float* choice,
                           int* order, int32_t* ids, float* weights) {
  const int lane = threadIdx.x & 31;
  const int e = o.num_experts, k = o.top_k;
  float* picked = reinterpret_cast<float*>(order + 32);  // [32] values of the chosen
  switch (o.scoring) {
    case RouterScoring::kSoftmaxTopK: {
      float mx = -INFINITY;
      for (int x = lane; x < e; x += 32) mx = fmaxf(mx, __ldcg(row + x));
      mx = WarpMax(mx);
      float sum = 0.0f;
      for (int x = lane; x < e; x += 32) {
        score[x] = expf(__ldcg(row + x) - mx);
        sum += score[x];
      }
      sum = WarpSum(sum);
      for (int x = lane; x < e; x += 32) score[x] /= sum;
      __syncwarp();
      if (o.topk_group < o.n_group) {
        // DeepSeek-V2's group_limited_greedy: a group scores its best expert; experts of dropped
        // groups score 0, below every probability.
        const int per_group = e / o.n_group;
        float group_score = -INFINITY;
        if (lane < o.n_group) {
          for (int i = 0; i < per_group; ++i) {
            group_score = fmaxf(group_score, score[lane * per_group + i]);
          }
        }
        const unsigned kept_mask = KeptGroups(o, group_score);
        for (int x = lane; x < e; x += 32) {
          choice[x] = kept_mask & (1u << (x / per_group)) ? score[x] : 0.0f;
        }
        __syncwarp();
        WarpTopK(choice, e, k, order, picked);
      } else {
        WarpTopK(score, e, k, order, picked);
      }
      if (lane == 0) {
        float top = 0.0f;
        for (int j = 0; j < k; ++j) top += picked[j] = score[order[j]];
        const float denominator = o.norm_topk_prob ? top : 1.0f;
        for (int j = 0; j < k; ++j) {
          weights[j] = picked[j] / denominator * o.routed_scaling_factor;
        }
      }
      break;
    }
    case RouterScoring::kTopKSoftmax: {
      for (int x = lane; x < e; x += 32) score[x] = __ldcg(row + x);
      __syncwarp();
      WarpTopK(score, e, k, order, picked);
      if (lane == 0) {
        const float top = picked[0];
        float sum = 0.0f;
        for (int j = 0; j < k; ++j) sum += picked[j] = expf(picked[j] - top);
        for (int j = 0; j < k; ++j) weights[j] = picked[j] / sum;
      }
      break;
    }
    case RouterScoring::kSigmoidGroupedTopK: {
      for (int x = lane; x < e; x += 32) {
        score[x] = 1.0f / (1.0f + expf(-__ldcg(row + x)));
        choice[x] = score[x] + (correction_bias ? correction_bias[x] : 0.0f);
      }
      __syncwarp();
      if (o.topk_group < o.n_group) {
        const int per_group = e / o.n_group;
        // Lane g scores group g: the sum of its two largest choices.
        float group_score = -INFINITY;
        if (lane < o.n_group) {
          float b0 = -INFINITY, b1 = -INFINITY;
          int i0 = -1, i1 = -1;
          for (int i = 0; i < per_group; ++i) {
            const float v = choice[lane * per_group + i];
            if (i0 < 0 || Beats(v, i, b0, i0)) {
              b1 = b0;
              i1 = i0;
              b0 = v;
              i0 = i;
            } else if (i1 < 0 || Beats(v, i, b1, i1)) {
              b1 = v;
              i1 = i;
            }
          }
          group_score = b0 + b1;
        }
        const unsigned kept_mask = KeptGroups(o, group_score);
        for (int x = lane; x < e; x += 32) {
          if (!(kept_mask & (1u << (x / per_group)))) choice[x] = -INFINITY;
        }
        __syncwarp();
      }
      WarpTopK(choice, e, k, order, picked);
      if (lane == 0) {
        float sum = 0.0f;
        for (int j = 0; j < k; ++j) sum += picked[j] = score[order[j]];
        const float denominator = o.norm_topk_prob ? sum + 1e-20f : 1.0f;
        for (int j = 0; j < k; ++j) {
          weights[j] = picked[j] / denominator * o.routed_scaling_factor;
        }
      }
      break;
    }
  }
  if (lane == 0) {
    for (int j = 0; j < k; ++j) ids[j] = order[j];
  }
  __syncwarp();
}

// Shared memory of one routing warp: score and choice [experts] floats, order/picked [64].
__host__ __device__ constexpr int WarpScratchFloats(int experts) { return 2 * experts + 64; }

// Warp-wide exclusive prefix sum of v (every lane of the warp calls it).
__device__ __forceinline__ int WarpExclusiveSum(int v) {
  const int lane = threadIdx.x & 31;
  int inclusive = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int up = __shfl_up_sync(0xffffffffu, inclusive, o);
    if (lane >= o) inclusive += up;
  }
  return inclusive - v;
}

// Shared memory of ScanCounts and ScatterEntries: offsets and first tiles [experts + 1] each, the
// insertion cursor [experts].
__host__ __device__ constexpr int GroupingInts(int experts) { return 3 * experts + 2; }
__device__ __forceinline__ int* GroupingCursor(int* sh, int experts) {
  return sh + 2 * experts + 2;
}

// Writes offsets (exclusive prefix sum of counts), the tile list, the active list and the touched
// count, and leaves the offsets in `sh` (GroupingInts(experts) ints of shared memory) as the
// cursor of ScatterEntries. Runs in one block. The scan runs in the block's first warp, each lane
// over a contiguous run of experts (a serial scan over 128 experts took several microseconds).
__device__ void ScanCounts(const MoeRouting& r, int experts, const int32_t* counts, int* sh) {
  int* offsets = sh;                   // [experts + 1]
  int* first_tile = sh + experts + 1;  // [experts + 1]
  int* cursor = GroupingCursor(sh, experts);
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x, per = (experts + 31) / 32;
    const int begin = min(lane * per, experts), end = min(begin + per, experts);
    int rows = 0, tiles = 0, touched = 0;
    for (int e = begin; e < end; ++e) {
      const int c = counts[e];
      rows += c;
      tiles += (c + kMoeTileRows - 1) / kMoeTileRows;
      touched += c > 0;
    }
    rows = WarpExclusiveSum(rows);
    tiles = WarpExclusiveSum(tiles);
    touched = WarpExclusiveSum(touched);
    for (int e = begin; e < end; ++e) {
      const int c = counts[e];
      r.offsets[e] = offsets[e] = cursor[e] = rows;
      first_tile[e] = tiles;
      rows += c;
      tiles += (c + kMoeTileRows - 1) / kMoeTileRows;
      if (c > 0) r.active[touched++] = e;
    }
    // The last lane's running sums are the totals.
    const int all_touched = __shfl_sync(0xffffffffu, touched, 31);
    if (lane == 31) {
      r.offsets[experts] = offsets[experts] = rows;
      first_tile[experts] = tiles;
      *r.num_tiles = tiles;
      if (r.experts_touched != nullptr) *r.experts_touched = touched;
    }
    for (int e = all_touched + lane; e < experts; e += 32) r.active[e] = -1;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < experts; e += blockDim.x) {
    for (int i = first_tile[e]; i < first_tile[e + 1]; ++i) {
      r.tiles[2 * i] = e;
      r.tiles[2 * i + 1] = offsets[e] + (i - first_tile[e]) * kMoeTileRows;
    }
  }
}

// Places entries [0, n) at their expert's rows: entry i of expert expert_of[i] (shared or global
// memory), by shared atomics on the cursor ScanCounts left in shared memory (GroupingCursor).
__device__ void ScatterEntries(const MoeRouting& r, const int32_t* expert_of, int n, int top_k,
                               int* cursor) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int pos = atomicAdd(&cursor[expert_of[i]], 1);
    r.row_token[pos] = i / top_k;
    r.entry_row[i] = pos;
  }
}

// The whole routing of a step in the calling block (at least 2 warps): its warps take the tokens
// in turn. `smem`: RouteInBlockFloats(experts, warps, tokens * top_k) words of shared memory:
// counts [experts + 1], the entries' experts [tokens * top_k], then the warps' scratch (reused by
// the grouping, GroupingInts(experts) <= 2 * WarpScratchFloats(experts)).
__host__ __device__ constexpr int RouteInBlockFloats(int experts, int warps, int entries) {
  return experts + 1 + entries + warps * WarpScratchFloats(experts);
}
__device__ void RouteInBlock(const RouterOptions& o, const MoeRouting& r, float* smem) {
  const int warp = threadIdx.x >> 5, warps = blockDim.x >> 5, lane = threadIdx.x & 31;
  const int e = o.num_experts, k = o.top_k;
  int* counts = reinterpret_cast<int*>(smem);  // [e + 1]
  int* entry_expert = counts + e + 1;          // [tokens * k]
  float* scratch = smem + e + 1 + r.tokens * k;
  float* warp_scratch = scratch + warp * WarpScratchFloats(e);
  const int* order = reinterpret_cast<const int*>(warp_scratch + 2 * e);
  for (int x = threadIdx.x; x <= e; x += blockDim.x) counts[x] = 0;
  __syncthreads();
  for (int t = warp; t < r.tokens; t += warps) {
    RouteToken(o, r.logits + static_cast<int64_t>(t) * e, r.correction_bias, warp_scratch,
               warp_scratch + e, reinterpret_cast<int*>(warp_scratch + 2 * e), r.expert_ids + t * k,
               r.weights + t * k);
    if (lane < k) {
      entry_expert[t * k + lane] = order[lane];
      atomicAdd(&counts[order[lane]], 1);
    }
    __syncwarp();  // order is the next token's scratch
  }
  __syncthreads();
  for (int x = threadIdx.x; x < e; x += blockDim.x) r.counts[x] = counts[x];
  int* sh = reinterpret_cast<int*>(scratch);  // the warps are done with their scratch
  ScanCounts(r, e, counts, sh);
  ScatterEntries(r, entry_expert, r.tokens * k, k, GroupingCursor(sh, e));
}

// Small steps: the whole routing in one block of kSmallWarps warps.
__global__ void __launch_bounds__(kSmallWarps * 32)
    RouteSmallKernel(RouterOptions o, MoeRouting r) {
  WaitForPreviousKernel();
  extern __shared__ float smem[];
  RouteInBlock(o, r, smem);
}

// Steps of at most kLogitTokens tokens: the router logits (RouterLogitsBlock), then the block that
// finishes last (a ticket counter, left at 0 again) routes the step — one kernel, no launch gap
// between the logits and the routing.
__global__ void __launch_bounds__(kLogitThreads)
    RouterLogitsRouteKernel(const bf16* __restrict__ x, const float* __restrict__ router,
                            const float* __restrict__ bias, int hidden, RouterOptions o,
                            MoeRouting r, int32_t* ticket) {
  RouterLogitsBlock(x, router, bias, const_cast<float*>(r.logits), r.tokens, o.num_experts, hidden);
  __shared__ bool last;
  __threadfence();  // this block's logits before its ticket
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(ticket, 1) == static_cast<int>(gridDim.x * gridDim.y) - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();  // every block's logits (read through L2 by RouteToken)
  extern __shared__ float smem[];
  RouteInBlock(o, r, smem);
  if (threadIdx.x == 0) *ticket = 0;
}

// Large steps: one warp per token, counts by global atomics (cleared before).
__global__ void __launch_bounds__(kRouteWarps * 32) RouteTopKKernel(RouterOptions o, MoeRouting r) {
  WaitForPreviousKernel();
  extern __shared__ float smem[];
  const int warp = threadIdx.x >> 5;
  const int t = blockIdx.x * kRouteWarps + warp;
  if (t >= r.tokens) return;
  const int e = o.num_experts, k = o.top_k;
  float* scratch = smem + warp * WarpScratchFloats(e);
  RouteToken(o, r.logits + static_cast<int64_t>(t) * e, r.correction_bias, scratch, scratch + e,
             reinterpret_cast<int*>(scratch + 2 * e), r.expert_ids + t * k, r.weights + t * k);
  if ((threadIdx.x & 31) < k) atomicAdd(&r.counts[r.expert_ids[t * k + (threadIdx.x & 31)]], 1);
}

__global__ void __launch_bounds__(1024) ScanScatterKernel(int experts, int top_k, MoeRouting r) {
  WaitForPreviousKernel();
  extern __shared__ int sh[];  // GroupingInts(experts)
  ScanCounts(r, experts, r.counts, sh);
  ScatterEntries(r, r.expert_ids, r.tokens * top_k, top_k, GroupingCursor(sh, experts));
}

template <bool kToResidual>
__global__ void __launch_bounds__(256) CombineKernel(MoeCombine a) {
  WaitForPreviousKernel();
  __shared__ float scratch[32];
  __shared__ int rows[32];
  __shared__ float w[32];
  const int t = blockIdx.x;
  if (threadIdx.x < a.top_k) {
    rows[threadIdx.x] = a.entry_row[t * a.top_k + threadIdx.x];
    w[threadIdx.x] = a.weights[t * a.top_k + threadIdx.x];
  }
  float gate = 1.0f;
  if (a.shared_gate != nullptr) {
    float dot = 0.0f;
    for (int h = threadIdx.x; h < a.hidden; h += blockDim.x) {
      dot += __bfloat162float(a.x[static_cast<int64_t>(t) * a.hidden + h]) * a.shared_gate[h];
    }
    dot = BlockSum(dot, scratch);
    gate = 1.0f / (1.0f + expf(-dot));
  }
  __syncthreads();
  for (int h = threadIdx.x; h < a.hidden; h += blockDim.x) {
    float y = 0.0f;
    for (int j = 0; j < a.top_k; ++j) {
      y = fmaf(w[j], __bfloat162float(a.expert_out[static_cast<int64_t>(rows[j]) * a.hidden + h]),
               y);
    }
    const int64_t at = static_cast<int64_t>(t) * a.hidden + h;
    if (a.shared_out != nullptr) y = fmaf(gate, __bfloat162float(a.shared_out[at]), y);
    if constexpr (kToResidual) {
      a.residual[at] += y;
    } else {
      a.out[at] = __float2bfloat16(y);
    }
  }
}

}  // namespace

// The single-block router's shared memory at kMoeMaxExperts (moe_gemm.cu sets its GEMM's).
absl::Status SetRouteSmallKernelSmem() {
  return CudaStatus(
      cudaFuncSetAttribute(
          RouteSmallKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
          RouteInBlockFloats(kMoeMaxExperts, kSmallWarps, kMoeSmallRouteTokens * kMaxTopK) *
              static_cast<int>(sizeof(float))),
      "cudaFuncSetAttribute(RouteSmallKernel)");
}

absl::Status LaunchMoeRouterLogits(const bf16* x, const float* router, const float* bias,
                                   float* logits, int tokens, int experts, int hidden,
                                   LaunchStream stream) {
  if (tokens < 0 || experts <= 0 || hidden <= 0 || hidden % 4 != 0) {
    return absl::InvalidArgumentError("LaunchMoeRouterLogits: bad shape (hidden % 4 == 0)");
  }
  if (tokens == 0) return absl::OkStatus();
  const dim3 grid((tokens + kLogitTokens - 1) / kLogitTokens,
                  (experts + kLogitExperts - 1) / kLogitExperts);
  LaunchDependent(RouterLogitsKernel, grid, kLogitThreads, 0, stream, x, router, bias, logits,
                  tokens, experts, hidden);
  return LaunchStatus("RouterLogitsKernel");
}

namespace {
absl::Status CheckRouteArgs(const RouterOptions& o, const MoeRouting& r) {
  const int e = o.num_experts;
  if (e <= 0 || e > kMoeMaxExperts || o.top_k < 1 || o.top_k > kMaxTopK || o.top_k > e ||
      o.n_group < 1 || o.n_group > 32 || e % o.n_group != 0 || r.tokens < 0) {
    return absl::InvalidArgumentError(
        "LaunchMoeRoute: need 1 <= top_k <= min(32, experts), experts <= 512, n_group <= 32");
  }
  return absl::OkStatus();
}
}  // namespace

absl::Status LaunchMoeRouterLogitsAndRoute(const bf16* x, const float* router, const float* bias,
                                           int hidden, const RouterOptions& o, const MoeRouting& r,
                                           int32_t* ticket, LaunchStream stream) {
  RS_RETURN_IF_ERROR(CheckRouteArgs(o, r));
  if (r.tokens > kMoeFusedRouteTokens || hidden <= 0 || hidden % 4 != 0 || ticket == nullptr) {
    return absl::InvalidArgumentError(
        "LaunchMoeRouterLogitsAndRoute: tokens <= kMoeFusedRouteTokens, hidden % 4 == 0, a ticket");
  }
  if (r.tokens == 0) return absl::OkStatus();
  const dim3 grid(1, (o.num_experts + kLogitExperts - 1) / kLogitExperts);
  const size_t smem =
      RouteInBlockFloats(o.num_experts, kLogitThreads / 32, r.tokens * o.top_k) * sizeof(float);
  LaunchDependent(RouterLogitsRouteKernel, grid, kLogitThreads, smem, stream, x, router, bias,
                  hidden, o, r, ticket);
  return LaunchStatus("RouterLogitsRouteKernel");
}

absl::Status LaunchMoeRoute(const RouterOptions& o, const MoeRouting& r, LaunchStream stream) {
  const int e = o.num_experts;
  RS_RETURN_IF_ERROR(CheckRouteArgs(o, r));
  if (r.tokens == 0) return absl::OkStatus();
  if (r.tokens <= kMoeSmallRouteTokens) {
    const size_t smem = RouteInBlockFloats(e, kSmallWarps, r.tokens * o.top_k) * sizeof(float);
    RS_RETURN_IF_ERROR(PrepareMoeKernels());
    LaunchDependent(RouteSmallKernel, dim3(1), kSmallWarps * 32, smem, stream, o, r);
    return LaunchStatus("RouteSmallKernel");
  }
  RS_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(r.counts, 0, e * sizeof(int32_t), stream));
  const size_t smem = kRouteWarps * WarpScratchFloats(e) * sizeof(float);
  LaunchDependent(RouteTopKKernel, dim3((r.tokens + kRouteWarps - 1) / kRouteWarps),
                  kRouteWarps * 32, smem, stream, o, r);
  RS_RETURN_IF_ERROR(LaunchStatus("RouteTopKKernel"));
  LaunchDependent(ScanScatterKernel, dim3(1), 1024, GroupingInts(e) * sizeof(int), stream, e,
                  o.top_k, r);
  return LaunchStatus("ScanScatterKernel");
}

absl::Status LaunchMoeCombine(const MoeCombine& a, LaunchStream stream) {
  if (a.tokens < 0 || a.top_k < 1 || a.top_k > 32 || a.hidden <= 0 ||
      (a.residual == nullptr) == (a.out == nullptr) ||
      (a.shared_gate != nullptr && (a.x == nullptr || a.shared_out == nullptr))) {
    return absl::InvalidArgumentError("LaunchMoeCombine: bad arguments");
  }
  if (a.tokens == 0) return absl::OkStatus();
  if (a.residual != nullptr) {
    LaunchDependent(CombineKernel<true>, dim3(a.tokens), 256, 0, stream, a);
  } else {
    LaunchDependent(CombineKernel<false>, dim3(a.tokens), 256, 0, stream, a);
  }
  return LaunchStatus("CombineKernel");
}

}  // namespace ringserve::cuda
