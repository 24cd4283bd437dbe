// Memory-bound GEMV for decode: y[m, n] = x[m, :] . w[n, :] for m <= kGemvMaxRows, and its
// decode-layer fusions (gemv.h). One warp per output column n (two, each half of k, for the
// residual-adding GEMV at k >= kSplitMinK); lanes stride over k in 16-byte vectors, kUnroll
// loads in flight. (kUnroll 8 measured worse on H200: qkv 65% of copy
// bandwidth against 73-76% with 4.)
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/rope.cuh"

namespace ringserve::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kUnroll = 4;
constexpr int kNormedInputSmemBytes = 48 * 1024;

// Where x comes from and what happens to a column's dot product.
enum class In { kBf16, kNormed };
enum class Out { kStore, kGateUpSilu, kAddResidual, kQkvRope };

struct GemvArgs {
  const bf16* x;          // In::kBf16: [m, k]
  RmsNormedInput normed;  // In::kNormed
  const bf16* w;          // [n, k], or [2n, k] for Out::kGateUpSilu
  void* y;                // [m, n] OutT; Out::kAddResidual: the fp32 residual
  const bf16* bias;       // Out::kAddResidual: [n] or null
  QkvStore rope;          // Out::kQkvRope
  int m, n, k;
};

// Out::kQkvRope: block b holds kPairsPerBlock rotary pairs of one head — warp w < kPairsPerBlock
// column `head * d + j0 + w`, warp kPairsPerBlock + w its partner `+ d / 2` — so the block can
// rotate its pairs itself (needs d % (2 * kPairsPerBlock) == 0).
constexpr int kPairsPerBlock = kWarpsPerBlock / 2;

__device__ __forceinline__ int QkvRopeColumn(int block, int warp, int d) {
  const int half = d / 2, blocks_per_head = half / kPairsPerBlock;
  const int head = block / blocks_per_head;
  const int j = (block % blocks_per_head) * kPairsPerBlock + warp % kPairsPerBlock;
  return head * d + j + (warp >= kPairsPerBlock ? half : 0);
}

// Each block writes the m normalized rows of x into shared memory `xs` ([m][k / 8] vectors):
// the values and the rounding of AddRmsNormKernel4 (elementwise.cu; the same helpers). The second
// pass reads the row again (from L1) rather than keeping a k-dependent number of values in
// registers.
__device__ __forceinline__ void NormalizeRowsToShared(const RmsNormedInput& in, int m, int k,
                                                      uint4* xs) {
  __shared__ float scratch[32];
  const int quads = k / 4;
  const uint2* weight = reinterpret_cast<const uint2*>(in.weight);
  for (int r = 0; r < m; ++r) {
    const float4* row = reinterpret_cast<const float4*>(in.residual + static_cast<int64_t>(r) * k);
    float sum_sq = 0.0f;
    for (int i = threadIdx.x; i < quads; i += blockDim.x) sum_sq += SumSquares4(__ldg(row + i));
    const float inv = rsqrtf(BlockSum(sum_sq, scratch) / k + in.eps);
    uint2* out = reinterpret_cast<uint2*>(xs) + static_cast<int64_t>(r) * quads;
    for (int i = threadIdx.x; i < quads; i += blockDim.x) {
      out[i] = NormScalePack4(__ldg(row + i), inv, __ldg(weight + i));
    }
  }
  __syncthreads();
}

// Blocks per SM the one-row kernels must fit (their register budget): every block of the
// Llama-3.1-8B-shaped decode GEMVs resident at once on a 132-SM H200 — o and down (512 blocks, 1024
// split) at 8, qkv (768) at 6; the gate/up GEMV runs several waves anyway.
constexpr int MinBlocksPerSm(int m, In in, Out out) {
  if (m != 1 || out == Out::kGateUpSilu) return 1;
  return in == In::kBf16 ? 8 : 6;
}

// M is the register capacity (rows); the runtime row count m <= M. Out::kGateUpSilu: w holds 2n
// rows (the MLP's gate rows, then its up rows) and a warp computes both dot products of output
// column col — g with row col, u with row col + n — and stores bf16(silu(g) * u) with g and u
// rounded to bf16 first, exactly what the GEMM into gate_up followed by LaunchSiluMul stores.
// (Issuing the first weight loads before WaitForPreviousKernel: +0.7-0.8% at 1 stream on an
// H200 once the norms were folded in, six A/B pairs in one call; neutral before.)
template <int M, typename OutT, In kIn, Out kOut, int kSplit>
__global__ void __launch_bounds__(kWarpsPerBlock * 32, MinBlocksPerSm(M, kIn, kOut))
    GemvKernel(GemvArgs a) {
  constexpr int P = kOut == Out::kGateUpSilu ? 2 : 1;  // weight rows per warp
  constexpr int kCols = kWarpsPerBlock / kSplit;       // output columns per block
  static_assert(kSplit == 1 || (kSplit == 2 && P == 1 && kOut != Out::kQkvRope));
  extern __shared__ uint4 normed_x[];  // In::kNormed: [m][k / 8]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int col = kOut == Out::kQkvRope ? QkvRopeColumn(blockIdx.x, warp, a.rope.cache.head_dim)
                                        : blockIdx.x * kCols + warp % kCols;
  const int m = a.m, n = a.n, k = a.k;
  const int vecs = k / 8;
  // kSplit 2: warps kCols.. take the second half of k, added to the first half's in the epilogue.
  const int part = warp / kCols, part_vecs = (vecs + kSplit - 1) / kSplit;
  const int v0 = part * part_vecs;
  const int v1 = col < n ? min(vecs, v0 + part_vecs) : v0;
  const uint4* wrow[P];
#pragma unroll
  for (int p = 0; p < P; ++p) {
    wrow[p] = reinterpret_cast<const uint4*>(a.w + (static_cast<int64_t>(col) + p * n) * k);
  }
  uint4 wv[P][kUnroll];
  const auto load_weights = [&](int i) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int p = 0; p < P; ++p) {
        if (i + 32 * u < v1) wv[p][u] = LoadStreaming(wrow[p] + i + 32 * u);
      }
    }
  };
  // The weights are never written by a kernel of the step: their first loads are issued before
  // the wait, so they overlap the previous kernel's tail (and the norm prologue).
  load_weights(v0 + lane);  // nothing past n (v1 = v0)
  WaitForPreviousKernel();
  if constexpr (kIn == In::kNormed) {
    NormalizeRowsToShared(a.normed, m, k, normed_x);  // every thread: it synchronizes the block
  }
  // Never under Out::kQkvRope (n % kWarpsPerBlock == 0) or kSplit 2: they synchronize below.
  if (kSplit == 1 && col >= n) return;
  const auto load_x = [&](int r, int i) {
    if constexpr (kIn == In::kNormed) {
      return normed_x[r * vecs + i];
    } else {
      return __ldg(reinterpret_cast<const uint4*>(a.x) + static_cast<int64_t>(r) * vecs + i);
    }
  };
  float acc[P][M];
#pragma unroll
  for (int p = 0; p < P; ++p) {
#pragma unroll
    for (int r = 0; r < M; ++r) acc[p][r] = 0.0f;
  }

  for (int i = v0 + lane; i < v1; i += 32 * kUnroll) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (i + 32 * u >= v1) break;
      float wf[P][8];
#pragma unroll
      for (int p = 0; p < P; ++p) Unpack8(wv[p][u], wf[p]);
#pragma unroll
      for (int r = 0; r < M; ++r) {
        if (r >= m) break;
        float xf[8];
        Unpack8(load_x(r, i + 32 * u), xf);
#pragma unroll
        for (int p = 0; p < P; ++p) {
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[p][r] = fmaf(wf[p][j], xf[j], acc[p][r]);
        }
      }
    }
    if (i + 32 * kUnroll < v1) load_weights(i + 32 * kUnroll);
  }
  __shared__ float second_half[kSplit == 2 ? M : 1][kCols];  // kSplit 2: the upper warps' sums
  if constexpr (kSplit == 2) {
#pragma unroll
    for (int r = 0; r < M; ++r) {
      if (r >= m) break;
      const float sum = WarpSum(acc[0][r]);
      if (part == 1 && lane == 0) second_half[r][warp - kCols] = sum;
    }
    __syncthreads();
    if (part == 1 || col >= n) return;
  }
  if constexpr (kOut == Out::kQkvRope) {
    __shared__ float dots[M][kWarpsPerBlock];  // bf16-rounded, as the qkv buffer holds them
#pragma unroll
    for (int r = 0; r < M; ++r) {
      if (r >= m) break;
      const float sum = WarpSum(acc[0][r]);
      if (lane == 0) dots[r][warp] = __bfloat162float(__float2bfloat16(sum));
    }
    __syncthreads();
    const int r = threadIdx.x / kPairsPerBlock, pair = threadIdx.x % kPairsPerBlock;
    if (r < m) {
      const int d = a.rope.cache.head_dim;
      const int c = QkvRopeColumn(blockIdx.x, pair, d);
      StoreQkvPair(a.rope, r, c / d, c % d, dots[r][pair], dots[r][pair + kPairsPerBlock]);
    }
  } else {
#pragma unroll
    for (int r = 0; r < M; ++r) {
      if (r >= m) break;
      const float sum = WarpSum(acc[0][r]) + (kSplit == 2 ? second_half[r][warp] : 0.0f);
      float value = sum;
      if constexpr (kOut == Out::kGateUpSilu) {
        const float g = __bfloat162float(__float2bfloat16(sum));
        const float u = __bfloat162float(__float2bfloat16(WarpSum(acc[P - 1][r])));
        value = g / (1.0f + __expf(-g)) * u;
      }
      if (lane != 0) continue;
      OutT* y = static_cast<OutT*>(a.y) + static_cast<int64_t>(r) * n + col;
      if constexpr (kOut == Out::kAddResidual) {
        const float delta = __bfloat162float(__float2bfloat16(sum)) +
                            (a.bias != nullptr ? __bfloat162float(a.bias[col]) : 0.0f);
        *y += delta;
      } else if constexpr (sizeof(OutT) == 4) {
        *y = value;
      } else {
        *y = __float2bfloat16(value);
      }
    }
  }
}

// k >= kSplitMinK (the MLP's down projection): two warps per output column, half of k each.
// Twice the warps (and loads in flight) for a matrix whose n alone gives too few.
constexpr int kSplitMinK = 8192;

template <int M, typename OutT, In kIn, Out kOut>
void Launch(const GemvArgs& a, LaunchStream stream) {
  const size_t smem = kIn == In::kNormed ? static_cast<size_t>(a.m) * a.k * sizeof(bf16) : 0;
  if constexpr (kIn == In::kBf16 && kOut == Out::kAddResidual) {
    if (a.k >= kSplitMinK) {
      constexpr int kCols = kWarpsPerBlock / 2;
      LaunchDependent(GemvKernel<M, OutT, kIn, kOut, 2>, dim3((a.n + kCols - 1) / kCols),
                      kWarpsPerBlock * 32, smem, stream, a);
      return;
    }
  }
  LaunchDependent(GemvKernel<M, OutT, kIn, kOut, 1>,
                  dim3((a.n + kWarpsPerBlock - 1) / kWarpsPerBlock), kWarpsPerBlock * 32, smem,
                  stream, a);
}

// Three register capacities keep compile time down; a smaller m runs predicated.
template <typename OutT, In kIn, Out kOut>
absl::Status Dispatch(const GemvArgs& a, LaunchStream stream) {
  if (a.m < 1 || a.m > kGemvMaxRows || a.n < 1 || a.k < 8 || a.k % 8 != 0) {
    return absl::InvalidArgumentError("GEMV: need 1 <= m <= 8, n >= 1, k a multiple of 8");
  }
  if (kIn == In::kNormed && !GemvNormedInputFits(a.m, a.k)) {
    return absl::InvalidArgumentError("GEMV: normalized input rows exceed 48 KiB");
  }
  if (a.m == 1) {
    Launch<1, OutT, kIn, kOut>(a, stream);
  } else if (a.m <= 4) {
    Launch<4, OutT, kIn, kOut>(a, stream);
  } else {
    Launch<8, OutT, kIn, kOut>(a, stream);
  }
  return LaunchStatus("GemvKernel");
}

}  // namespace

static_assert(GemvNormedInputFits(1, kNormedInputSmemBytes / 2) &&
                  !GemvNormedInputFits(1, kNormedInputSmemBytes / 2 + 1),
              "GemvNormedInputFits (kernel_selector.h) must match the kernels' shared memory");

absl::Status LaunchGemv(const bf16* x, const bf16* w, void* y, OutType out, int m, int n, int k,
                        LaunchStream stream) {
  const GemvArgs a{.x = x, .w = w, .y = y, .m = m, .n = n, .k = k};
  return out == OutType::kF32 ? Dispatch<float, In::kBf16, Out::kStore>(a, stream)
                              : Dispatch<bf16, In::kBf16, Out::kStore>(a, stream);
}

absl::Status LaunchGemvGateUpSilu(const bf16* x, const bf16* w_gate_up, bf16* act, int m, int inter,
                                  int k, LaunchStream stream) {
  const GemvArgs a{.x = x, .w = w_gate_up, .y = act, .m = m, .n = inter, .k = k};
  return Dispatch<bf16, In::kBf16, Out::kGateUpSilu>(a, stream);
}

absl::Status LaunchGemvNormed(const RmsNormedInput& x, const bf16* w, bf16* y, int m, int n, int k,
                              LaunchStream stream) {
  const GemvArgs a{.normed = x, .w = w, .y = y, .m = m, .n = n, .k = k};
  return Dispatch<bf16, In::kNormed, Out::kStore>(a, stream);
}

absl::Status LaunchGemvGateUpSiluNormed(const RmsNormedInput& x, const bf16* w_gate_up, bf16* act,
                                        int m, int inter, int k, LaunchStream stream) {
  const GemvArgs a{.normed = x, .w = w_gate_up, .y = act, .m = m, .n = inter, .k = k};
  return Dispatch<bf16, In::kNormed, Out::kGateUpSilu>(a, stream);
}

absl::Status LaunchGemvNormedQkvRope(const RmsNormedInput& x, const bf16* w_qkv,
                                     const QkvStore& out, int m, int k, LaunchStream stream) {
  const int d = out.cache.head_dim;
  if (d <= 0 || d % (2 * kPairsPerBlock) != 0 || out.num_heads <= 0 ||
      out.cache.num_kv_heads <= 0 || out.cache.block_size <= 0) {
    return absl::InvalidArgumentError("GEMV qkv rope: need head_dim a multiple of 8, heads > 0");
  }
  const GemvArgs a{.normed = x,
                   .w = w_qkv,
                   .rope = out,
                   .m = m,
                   .n = (out.num_heads + 2 * out.cache.num_kv_heads) * d,
                   .k = k};
  return Dispatch<bf16, In::kNormed, Out::kQkvRope>(a, stream);
}

absl::Status LaunchGemvAddResidual(const bf16* x, const bf16* w, const bf16* bias, float* residual,
                                   int m, int n, int k, LaunchStream stream) {
  const GemvArgs a{.x = x, .w = w, .y = residual, .bias = bias, .m = m, .n = n, .k = k};
  return Dispatch<float, In::kBf16, Out::kAddResidual>(a, stream);
}

}  // namespace ringserve::cuda
