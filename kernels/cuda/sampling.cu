#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/sampling.h"

namespace ringserve::cuda {
namespace {

constexpr int kThreads = 1024;

__device__ __forceinline__ void Better(float& best, int& best_id, float v, int id) {
  if (v > best || (v == best && id < best_id)) {
    best = v;
    best_id = id;
  }
}

__global__ void __launch_bounds__(kThreads)
    ArgmaxKernel(const float* __restrict__ logits, int vocab, int32_t* __restrict__ tokens) {
  WaitForPreviousKernel();
  __shared__ float vals[32];
  __shared__ int ids[32];
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  float best = -INFINITY;
  int best_id = INT_MAX;
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    float v = row[i];
    if (isnan(v)) v = -INFINITY;
    Better(best, best_id, v, i);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, off);
    const int oi = __shfl_xor_sync(0xffffffffu, best_id, off);
    Better(best, best_id, ov, oi);
  }
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  if (lane == 0) {
    vals[warp] = best;
    ids[warp] = best_id;
  }
  __syncthreads();
  if (warp == 0) {
    best = vals[lane];
    best_id = ids[lane];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, best, off);
      const int oi = __shfl_xor_sync(0xffffffffu, best_id, off);
      Better(best, best_id, ov, oi);
    }
    if (lane == 0) tokens[blockIdx.x] = best_id == INT_MAX ? 0 : best_id;
  }
}

// ---------------------------------------------------------------------------------------------
// LaunchSampleRows: one CTA per row. Every quantity is found by passes over the row (it stays
// in L2): no candidate buffer, so no cap on top-k or on the size of the nucleus.
//
// The candidates are ordered by (logit desc, id asc). Scaling by 1/temperature in double is
// strictly monotone on floats, so this is the CPU's (z desc, id asc) order, and a 32-bit
// order-preserving key of the (NaN-cleaned, -0 -> +0) float sorts it. Probabilities are
// fixed-point integers (weight * 2^shift, weight = exp(z - z_max) <= 1, computed in double as on
// the CPU): sums are exact and order-independent, so every pass sees the same totals and the
// result is deterministic. Everything then reduces to "the first element in the order whose
// inclusive prefix sum (of 1s, or of weights) exceeds x", found by an 8-bit radix descent on the
// key (4 histogram passes) and an ordered scan among the ties of the final key.
// ---------------------------------------------------------------------------------------------

constexpr int kSampleThreads = 512;
constexpr int kSampleWarps = kSampleThreads / 32;
constexpr int kBins = 256;
constexpr unsigned kFullMask = 0xffffffffu;

using u64 = unsigned long long;

struct SampleShared {
  u64 hist[kBins];
  u64 uscratch[32];
  double dscratch[kSampleWarps];
  float fscratch[kSampleWarps];
  int iscratch[kSampleWarps];
  u64 acc;
  unsigned bin;
  int found;
};

struct RowContext {
  const float* row;
  int vocab;
  double inv_temperature;
  double max_z;  // z of the largest logit
  double scale;  // 2^shift
};

// The first element (in the candidate order) found by a selection: its key and id.
struct Selection {
  uint32_t key;
  int id;  // -1 only if the precondition was violated
};

__device__ __forceinline__ float CleanLogit(float v) { return isnan(v) ? -INFINITY : v; }

// a > b (floats, not NaN, -0 == +0) <=> OrderKey(a) > OrderKey(b).
__device__ __forceinline__ uint32_t OrderKey(float v) {
  uint32_t bits = __float_as_uint(v);
  if ((bits & 0x7fffffffu) == 0) bits = 0;  // -0 ties with +0, as on the CPU
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

__device__ __forceinline__ uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The 53 random bits of SamplingUniform(seed, token_index) (which is bits * 2^-53).
__device__ __forceinline__ u64 UniformBits(uint64_t seed, uint64_t token_index) {
  return SplitMix64(SplitMix64(seed) ^ SplitMix64(token_index + 0x632be59bd9b4e019ull)) >> 11;
}

// floor(bits * 2^-53 * total) exactly (128-bit product); < total since bits < 2^53.
__device__ __forceinline__ u64 ScaleByUniform(u64 bits, u64 total) {
  const u64 hi = __umul64hi(bits, total);
  const u64 lo = bits * total;
  return (hi << 11) | (lo >> 53);
}

// round(exp(v / T - max / T) * 2^shift); 0 for -inf. The CPU's double operations, explicitly
// rounded (no FMA contraction) and not inlined, so every pass gets bit-identical weights.
__device__ __noinline__ u64 FixedWeight(float v, double inv_temperature, double max_z,
                                        double scale) {
  if (v == -INFINITY) return 0;
  const double z = __dsub_rn(__dmul_rn(static_cast<double>(v), inv_temperature), max_z);
  return __double2ull_rn(__dmul_rn(exp(z), scale));
}

__device__ __forceinline__ u64 ElementValue(const RowContext& c, float v, bool count_mode) {
  return count_mode ? 1ull : FixedWeight(v, c.inv_temperature, c.max_z, c.scale);
}

template <typename T>
__device__ __forceinline__ T WarpSumT(T v) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(kFullMask, v, off);
  return v;
}

// Block sum in a fixed order (deterministic for doubles); every thread gets it. `scratch` has
// kSampleWarps entries. Contains __syncthreads().
template <typename T>
__device__ T BlockSumT(T v, T* scratch) {
  v = WarpSumT(v);
  __syncthreads();  // a previous user of scratch may still be reading it
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  T total = 0;
  for (int w = 0; w < kSampleWarps; ++w) total += scratch[w];
  return total;
}

// Argmax over the block (ties -> lowest id); every thread gets it. Contains __syncthreads().
__device__ void BlockArgmax(float& best, int& best_id, SampleShared& s) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(kFullMask, best, off);
    const int oi = __shfl_xor_sync(kFullMask, best_id, off);
    Better(best, best_id, ov, oi);
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) {
    s.fscratch[threadIdx.x >> 5] = best;
    s.iscratch[threadIdx.x >> 5] = best_id;
  }
  __syncthreads();
  best = -INFINITY;
  best_id = INT_MAX;
  for (int w = 0; w < kSampleWarps; ++w) Better(best, best_id, s.fscratch[w], s.iscratch[w]);
}

// Inclusive prefix sum over the block in thread order; *total = the block's sum. Contains
// __syncthreads().
__device__ u64 BlockInclusiveScan(u64 v, SampleShared& s, u64* total) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const u64 t = __shfl_up_sync(kFullMask, v, off);
    if (lane >= off) v += t;
  }
  __syncthreads();  // a previous scan may still be reading uscratch
  if (lane == 31) s.uscratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    u64 w = lane < kSampleWarps ? s.uscratch[lane] : 0;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const u64 t = __shfl_up_sync(kFullMask, w, off);
      if (lane >= off) w += t;
    }
    s.uscratch[lane] = w;  // inclusive prefix over warps (each lane its own slot)
  }
  __syncthreads();
  *total = s.uscratch[kSampleWarps - 1];
  return v + (warp > 0 ? s.uscratch[warp - 1] : 0);
}

// The first id (ascending) among the elements with a value (non -inf, and key == only_key when
// filter is set) such that acc + (inclusive prefix of values in id order) > x; -1 if none.
__device__ int FirstInIdOrder(const RowContext& c, bool count_mode, bool filter, uint32_t only_key,
                              u64 acc, u64 x, SampleShared& s) {
  __syncthreads();  // earlier readers of s.found are done
  if (threadIdx.x == 0) s.found = INT_MAX;
  __syncthreads();
  for (int base = 0; base < c.vocab; base += kSampleThreads) {
    const int i = base + static_cast<int>(threadIdx.x);
    u64 value = 0;
    if (i < c.vocab) {
      const float v = CleanLogit(c.row[i]);
      if (v != -INFINITY && (!filter || OrderKey(v) == only_key)) {
        value = ElementValue(c, v, count_mode);
      }
    }
    u64 tile_total;
    const u64 inclusive = BlockInclusiveScan(value, s, &tile_total);
    if (value != 0 && acc + inclusive > x) atomicMin(&s.found, i);
    __syncthreads();
    const int found = s.found;
    if (found != INT_MAX) return found;  // uniform: every thread read the same value
    acc += tile_total;
  }
  return -1;
}

// The first element in the candidate order (key desc, id asc; -inf excluded) whose inclusive
// prefix sum of values (1 each in count mode, else the fixed-point weights) exceeds x.
// Precondition: x < the sum over all candidates.
__device__ Selection SelectInOrder(const RowContext& c, bool count_mode, u64 x, SampleShared& s) {
  const int tid = static_cast<int>(threadIdx.x);
  const int lane = tid & 31;
  uint32_t prefix = 0;
  uint32_t mask = 0;
  u64 acc = 0;  // sum of the values of the elements before the current key prefix
  for (int shift = 24; shift >= 0; shift -= 8) {
    __syncthreads();  // the previous pass's readers of hist / bin / acc are done
    for (int b = tid; b < kBins; b += kSampleThreads) s.hist[b] = 0;
    __syncthreads();
    for (int base = 0; base < c.vocab; base += kSampleThreads) {
      const int i = base + tid;
      int bin = -1;
      float v = -INFINITY;
      if (i < c.vocab) {
        v = CleanLogit(c.row[i]);
        if (v != -INFINITY) {
          const uint32_t key = OrderKey(v);
          if ((key & mask) == prefix) bin = static_cast<int>((key >> shift) & 0xffu);
        }
      }
      if (count_mode) {
        // Aggregate equal bins within the warp: few bins hold most logits in the first passes.
        const unsigned peers = __match_any_sync(kFullMask, bin);
        if (bin >= 0 && lane == __ffs(peers) - 1) {
          atomicAdd(&s.hist[bin], static_cast<u64>(__popc(peers)));
        }
      } else if (bin >= 0) {
        const u64 value = ElementValue(c, v, false);
        if (value != 0) atomicAdd(&s.hist[bin], value);
      }
    }
    __syncthreads();
    if (tid < 32) {
      // Lane l owns the bins 255 - 8l - j, j = 0..7 (descending key order).
      u64 local = 0;
      for (int j = 0; j < 8; ++j) local += s.hist[kBins - 1 - (8 * lane + j)];
      u64 inclusive = local;
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const u64 t = __shfl_up_sync(kFullMask, inclusive, off);
        if (lane >= off) inclusive += t;
      }
      const unsigned crossing = __ballot_sync(kFullMask, acc + inclusive > x);
      // crossing == 0 only if the precondition is violated: then take the lowest bin.
      const int owner = crossing != 0 ? __ffs(crossing) - 1 : 31;
      if (lane == owner) {
        u64 running = acc + inclusive - local;
        int chosen = kBins - 1 - (8 * lane + 7);
        for (int j = 0; j < 8; ++j) {
          const int b = kBins - 1 - (8 * lane + j);
          if (running + s.hist[b] > x) {
            chosen = b;
            break;
          }
          running += s.hist[b];
        }
        s.bin = static_cast<unsigned>(chosen);
        s.acc = running;
      }
    }
    __syncthreads();
    acc = s.acc;
    prefix |= s.bin << shift;
    mask |= 0xffu << shift;
  }
  return {prefix, FirstInIdOrder(c, count_mode, /*filter=*/true, prefix, acc, x, s)};
}

// Sum of the weights of the candidates up to and including `sel` in the candidate order.
__device__ u64 WeightThrough(const RowContext& c, Selection sel, SampleShared& s) {
  u64 sum = 0;
  for (int i = static_cast<int>(threadIdx.x); i < c.vocab; i += kSampleThreads) {
    const float v = CleanLogit(c.row[i]);
    if (v == -INFINITY) continue;
    const uint32_t key = OrderKey(v);
    if (key > sel.key || (key == sel.key && i <= sel.id)) sum += ElementValue(c, v, false);
  }
  return BlockSumT(sum, s.uscratch);
}

__global__ void __launch_bounds__(kSampleThreads)
    SampleRowsKernel(const float* __restrict__ logits, int vocab,
                     const GpuRowSampling* __restrict__ params, int32_t* __restrict__ tokens,
                     float* __restrict__ logprobs, double scale) {
  __shared__ SampleShared s;
  const int tid = static_cast<int>(threadIdx.x);
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  const GpuRowSampling p = params[blockIdx.x];

  // Pass 1: max (ties -> lowest id) and the number of candidates (non -inf).
  float best = -INFINITY;
  int best_id = INT_MAX;
  int finite = 0;
  for (int i = tid; i < vocab; i += kSampleThreads) {
    const float v = CleanLogit(row[i]);
    Better(best, best_id, v, i);
    finite += v != -INFINITY ? 1 : 0;
  }
  BlockArgmax(best, best_id, s);
  finite = BlockSumT(finite, s.iscratch);
  const int argmax = best_id == INT_MAX ? 0 : best_id;
  const bool max_is_finite = isfinite(best);

  // Greedy cases of SampleRow: temperature 0, one logit, no candidate (-> argmax = 0), +inf.
  const bool sample = p.temperature > 0.0f && vocab > 1 && finite > 0 && max_is_finite;
  const double inv_temperature = sample ? 1.0 / static_cast<double>(p.temperature) : 0.0;
  const RowContext c{row, vocab, inv_temperature,
                     __dmul_rn(static_cast<double>(best), inv_temperature), scale};

  // Pass 2: the softmax denominator of the raw logits (logprob) and the total weight.
  double sum_exp = 0.0;
  u64 total = 0;
  if (logprobs != nullptr || sample) {
    for (int i = tid; i < vocab; i += kSampleThreads) {
      const float v = CleanLogit(row[i]);
      if (logprobs != nullptr && max_is_finite) {
        sum_exp += exp(static_cast<double>(v) - static_cast<double>(best));
      }
      if (sample) total += ElementValue(c, v, false);
    }
    sum_exp = BlockSumT(sum_exp, s.dscratch);
    total = BlockSumT(total, s.uscratch);
  }

  int token = argmax;
  if (sample) {
    const bool use_top_k = p.top_k > 0 && p.top_k < finite;
    const bool use_top_p = p.top_p < 1.0f;
    const u64 bits = UniformBits(p.seed, p.token_index);
    if (!use_top_k && !use_top_p) {
      // Inverse CDF over the candidates in id order.
      token = FirstInIdOrder(c, /*count_mode=*/false, /*filter=*/false, 0, 0,
                             ScaleByUniform(bits, total), s);
    } else {
      if (use_top_k) {
        total = WeightThrough(
            c, SelectInOrder(c, /*count_mode=*/true, static_cast<u64>(p.top_k) - 1, s), s);
      }
      if (use_top_p) {
        // The smallest prefix with cumulative >= top_p * total, i.e. > ceil(top_p * total) - 1.
        const double want = ceil(static_cast<double>(p.top_p) * static_cast<double>(total));
        u64 threshold = total;
        if (!(want >= 1.0)) {
          threshold = 1;
        } else if (want < static_cast<double>(total)) {
          threshold = static_cast<u64>(want);
        }
        total = WeightThrough(c, SelectInOrder(c, /*count_mode=*/false, threshold - 1, s), s);
      }
      token = SelectInOrder(c, /*count_mode=*/false, ScaleByUniform(bits, total), s).id;
    }
    if (token < 0 || token >= vocab) token = argmax;  // only on a broken invariant
  }

  if (tid == 0) {
    tokens[blockIdx.x] = token;
    if (logprobs != nullptr) {
      const float v = CleanLogit(row[token]);
      float logprob;
      if (!max_is_finite) {
        logprob = v == best ? 0.0f : -INFINITY;
      } else {
        logprob =
            static_cast<float>(static_cast<double>(v) - static_cast<double>(best) - log(sum_exp));
      }
      logprobs[blockIdx.x] = logprob;
    }
  }
}

__global__ void FeedTokensKernel(const int32_t* src, const int32_t* pairs, int count,
                                 int32_t* dst) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < count) dst[pairs[2 * i]] = src[pairs[2 * i + 1]];
}

}  // namespace

absl::Status LaunchArgmax(const float* logits, int rows, int vocab, int32_t* tokens,
                          LaunchStream stream) {
  if (rows < 0 || vocab <= 0) return absl::InvalidArgumentError("LaunchArgmax: bad shape");
  if (rows == 0) return absl::OkStatus();
  LaunchDependent(ArgmaxKernel, rows, kThreads, 0, stream, logits, vocab, tokens);
  return LaunchStatus("ArgmaxKernel");
}

size_t SampleRowsWorkspaceBytes(int /*rows*/, int /*vocab*/) { return 0; }

absl::Status LaunchSampleRows(const float* logits, int rows, int vocab,
                              const GpuRowSampling* params, int32_t* tokens, float* logprobs,
                              void* /*workspace*/, size_t workspace_bytes, LaunchStream stream) {
  if (rows < 0 || vocab <= 0 || vocab > INT_MAX - kSampleThreads) {
    return absl::InvalidArgumentError("LaunchSampleRows: bad shape");
  }
  if (rows == 0) return absl::OkStatus();
  if (logits == nullptr || params == nullptr || tokens == nullptr) {
    return absl::InvalidArgumentError("LaunchSampleRows: null logits, params or tokens");
  }
  if (workspace_bytes < SampleRowsWorkspaceBytes(rows, vocab)) {
    return absl::InvalidArgumentError("LaunchSampleRows: workspace too small");
  }
  // Fixed-point scale: vocab weights <= 1 each sum to < 2^62, so no u64 sum can overflow.
  int bit_width = 0;
  while (bit_width < 31 && (static_cast<uint32_t>(vocab) >> bit_width) != 0) ++bit_width;
  const double scale = std::ldexp(1.0, 62 - bit_width);
  SampleRowsKernel<<<rows, kSampleThreads, 0, stream>>>(logits, vocab, params, tokens, logprobs,
                                                        scale);
  return LaunchStatus("SampleRowsKernel");
}

absl::Status LaunchFeedTokens(const int32_t* src, const int32_t* pairs, int count, int32_t* dst,
                              LaunchStream stream) {
  if (count < 0) return absl::InvalidArgumentError("LaunchFeedTokens: negative count");
  if (count == 0) return absl::OkStatus();
  if (src == nullptr || pairs == nullptr || dst == nullptr) {
    return absl::InvalidArgumentError("LaunchFeedTokens: null pointer");
  }
  constexpr int kFeedThreads = 128;
  FeedTokensKernel<<<(count + kFeedThreads - 1) / kFeedThreads, kFeedThreads, 0, stream>>>(
      src, pairs, count, dst);
  return LaunchStatus("FeedTokensKernel");
}

}  // namespace ringserve::cuda
