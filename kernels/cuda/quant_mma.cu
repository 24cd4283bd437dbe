// Tensor-core quantized linear (quant_mma.h).
//
// Fragments (PTX m16n8k16, lane = 4 g + t): A registers {a0a1, a2a3, a4a5, a6a7} hold rows g,
// g + 8, g, g + 8 at k slots {2t, 2t+1} and {2t+8, 2t+9}; B registers {b0b1, b2b3} hold token g
// at the same k slots; C holds rows g, g + 8 at tokens 2t, 2t + 1. The MMA sums over k, so any
// one-to-one map of k slots to matrix columns gives the same product as long as A and B use it.
// Here lane t of each quad owns the columns [c0 + t * V, c0 + (t + 1) * V) of a block of 4 V
// columns (V = values in W words of codes: 8 W for 4-bit, 4 W for 8-bit codes): it loads them as
// W contiguous words for its rows g and g + 8, and feeds them to the MMA in the order the bit
// tricks produce pairs: from a 32-bit word of 4-bit codes the pairs of columns (i, i + 4),
// i = 0..3; from a word of 8-bit codes the pairs (i, i + 2), i = 0..1. Its x values are loaded
// from the same columns and paired alike with byte permutes.
#include <cuda_bf16.h>

#include <cstdlib>
#include <cstring>
#include <string_view>

#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/mma_sync.cuh"
#include "kernels/cuda/quant_mma.h"

namespace ringserve::cuda {
namespace {

template <QuantFormat F>
constexpr bool kFourBit = F == QuantFormat::kInt4 || F == QuantFormat::kFp4;
template <QuantFormat F>
constexpr bool kIntegerCodes = F == QuantFormat::kInt4 || F == QuantFormat::kInt8;
// Columns one word of codes holds, and MMA k-steps (16 columns) per word.
template <QuantFormat F>
constexpr int kValuesPerWord = kFourBit<F> ? 8 : 4;
template <QuantFormat F>
constexpr int kStepsPerWord = kFourBit<F> ? 2 : 1;
// Columns of one block: four lanes of W words each. A block never straddles a scale group.
template <QuantFormat F, int W>
constexpr int kBlockCols = 4 * W* kValuesPerWord<F>;

__device__ __forceinline__ uint32_t Bits(__nv_bfloat162 v) {
  uint32_t u;
  memcpy(&u, &v, 4);
  return u;
}
__device__ __forceinline__ __nv_bfloat162 Bf2(uint32_t u) {
  __nv_bfloat162 v;
  memcpy(&v, &u, 4);
  return v;
}

// Streamed once: keep L1 for the activations.
__device__ __forceinline__ uint4 LoadStreaming(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// The group's zero point in the form Pair subtracts it (integer formats).
struct Zero {
  uint32_t bf16x2 = 0;  // int4: bf16(128 + zero) twice
  float f32 = 0;        // int8: 2^23 + zero
};

template <QuantFormat F>
__device__ __forceinline__ Zero MakeZero(float zero) {
  Zero z;
  if constexpr (F == QuantFormat::kInt4) {
    z.bf16x2 = Bits(__float2bfloat162_rn(128.0f + zero));
  } else if constexpr (F == QuantFormat::kInt8) {
    z.f32 = 8388608.0f + zero;
  }
  return z;
}

// Pair i of a word of codes as exact bf16 values before the group scale (integers minus zero):
// 4-bit codes (i, i + 4), 8-bit codes (i, i + 2), the first in the low half.
template <QuantFormat F>
__device__ __forceinline__ uint32_t Pair(uint32_t word, int i, const Zero& z) {
  if constexpr (F == QuantFormat::kInt4) {
    // 0x4300 | q is the bf16 128 + q.
    const uint32_t h = ((word >> (4 * i)) & 0x000f000fu) | 0x43004300u;
    return Bits(__hsub2(Bf2(h), Bf2(z.bf16x2)));
  } else if constexpr (F == QuantFormat::kInt8) {
    // 0x4b0000qq is the fp32 2^23 + q.
    const float lo = __uint_as_float(__byte_perm(word, 0x4b000000u, 0x7650 + i)) - z.f32;
    const float hi = __uint_as_float(__byte_perm(word, 0x4b000000u, 0x7652 + i)) - z.f32;
    return Bits(__floats2bfloat162_rn(lo, hi));
  } else if constexpr (F == QuantFormat::kFp8) {
    // e4m3 bits shifted into bf16 are the value times 2^-120 (subnormals too); 0x7b80 is 2^120.
    const uint32_t b = word >> (8 * i);
    const uint32_t h = ((b & 0x007f007fu) << 4) | ((b & 0x00800080u) << 8);
    return Bits(__hmul2(Bf2(h), Bf2(0x7b807b80u)));
  } else {
    // e2m1 likewise times 2^-126; 0x7e80 is 2^126.
    const uint32_t b = word >> (4 * i);
    const uint32_t h = ((b & 0x00070007u) << 6) | ((b & 0x00080008u) << 12);
    return Bits(__hmul2(Bf2(h), Bf2(0x7e807e80u)));
  }
}

// The x values of the same columns as Pair i, from the word's x values xs (8 bf16 in 4 words for
// 4-bit codes, 4 bf16 in 2 words for 8-bit).
template <QuantFormat F>
__device__ __forceinline__ uint32_t XPair(const uint32_t* xs, int i) {
  if constexpr (kFourBit<F>) {
    return __byte_perm(xs[i / 2], xs[i / 2 + 2], (i & 1) ? 0x7632 : 0x5410);
  } else {
    return __byte_perm(xs[0], xs[1], (i & 1) ? 0x7632 : 0x5410);
  }
}

// What one lane loads for one block: W words of codes of its rows g and g + 8 in each of R row
// tiles, and their group scales (and zero points).
template <int W, int R>
struct Block {
  uint32_t q[R][2][W];
  float scale[R][2];
  float zero[R][2];
};

template <QuantFormat F, int W, int R>
struct Rows {
  const uint8_t* codes[R][2];  // the lane's first byte in block 0
  const float* scales[R][2];   // the row's first group

  __device__ __forceinline__ void Load(Block<W, R>& b, int block, int group_cols) const {
    constexpr int kBlockBytes = kBlockCols<F, W> * (kFourBit<F> ? 1 : 2) / 2;
    const int group = block * kBlockCols<F, W> / group_cols;
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint8_t* p = codes[r][h] + static_cast<int64_t>(block) * kBlockBytes;
        if constexpr (W == 4) {
          const uint4 v = LoadStreaming(p);
          b.q[r][h][0] = v.x;
          b.q[r][h][1] = v.y;
          b.q[r][h][2] = v.z;
          b.q[r][h][3] = v.w;
        } else {
          b.q[r][h][0] = __ldg(reinterpret_cast<const uint32_t*>(p));
        }
        if constexpr (kIntegerCodes<F>) {
          const float2 sz = __ldg(reinterpret_cast<const float2*>(scales[r][h]) + group);
          b.scale[r][h] = sz.x;
          b.zero[r][h] = sz.y;
        } else {
          b.scale[r][h] = __ldg(scales[r][h] + group);
          b.zero[r][h] = 0;
        }
      }
    }
  }
};

// Loads the x values of one word of codes for the lane's token of each of NT token tiles.
template <QuantFormat F, int NT>
__device__ __forceinline__ void LoadX(uint32_t (&xs)[NT][4], const bf16* const (&xrow)[NT],
                                      int col) {
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    if (xrow[n] == nullptr) {
      xs[n][0] = xs[n][1] = xs[n][2] = xs[n][3] = 0;
    } else if constexpr (kFourBit<F>) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(xrow[n] + col));
      xs[n][0] = v.x;
      xs[n][1] = v.y;
      xs[n][2] = v.z;
      xs[n][3] = v.w;
    } else {
      const uint2 v = __ldg(reinterpret_cast<const uint2*>(xrow[n] + col));
      xs[n][0] = v.x;
      xs[n][1] = v.y;
    }
  }
}

// R tiles of 16 rows x NT tiles of 8 tokens per block of kWarps warps, the warps splitting the
// column blocks; D blocks of codes in flight per lane. blockIdx.x is the token group (the blocks
// of one row tile run side by side and share its codes in L2), blockIdx.y the row tile.
template <QuantFormat F, int W, int R, int NT, int D, int kWarps>
__global__ void __launch_bounds__(kWarps * 32, R == 1 ? 16 / kWarps : 1)
    QuantMmaKernel(const bf16* __restrict__ x, QuantMatrixView w, bf16* __restrict__ y, int m,
                   bool interleaved) {
  constexpr int kB = kBlockCols<F, W>;
  constexpr int kV = kValuesPerWord<F>;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int row0 = blockIdx.y * 16 * R, tok0 = blockIdx.x * 8 * NT;
  const int groups = (w.cols + w.group_cols - 1) / w.group_cols;
  const int64_t row_bytes = static_cast<int64_t>(w.cols) * (kFourBit<F> ? 1 : 2) / 2;
  const int lane_col = t * W * kV;  // the lane's first column in a block

  Rows<F, W, R> rows;
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // Rows past the matrix read its last row; their results are not stored.
      const int row = min(row0 + 16 * r + g + 8 * h, w.rows - 1);
      rows.codes[r][h] = w.codes + row * row_bytes + lane_col * (kFourBit<F> ? 1 : 2) / 2;
      rows.scales[r][h] =
          w.scales + static_cast<int64_t>(row) * groups * (kIntegerCodes<F> ? 2 : 1);
    }
  }
  const bf16* xrow[NT];
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    const int tok = tok0 + 8 * n + g;
    xrow[n] = tok < m ? x + static_cast<int64_t>(tok) * w.cols + lane_col : nullptr;
  }

  float acc[R][NT][4];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int n = 0; n < NT; ++n) acc[r][n][0] = acc[r][n][1] = acc[r][n][2] = acc[r][n][3] = 0;
  }

  const int blocks = w.cols / kB;
  // The warp's blocks: begin, begin + step, ... below end. Interleaved, the warps of the block
  // read neighbouring blocks at a time (longer contiguous runs of each row).
  const int begin = interleaved ? warp : blocks * warp / kWarps;
  const int end = interleaved ? blocks : blocks * (warp + 1) / kWarps;
  const int step = interleaved ? kWarps : 1;
  Block<W, R> ring[D];
#pragma unroll
  for (int i = 0; i < D; ++i) {
    if (begin + i * step < end) rows.Load(ring[i], begin + i * step, w.group_cols);
  }
  // The weights are never written by a kernel: their first loads overlap the kernel before.
  WaitForPreviousKernel();
  for (int b0 = begin; b0 < end; b0 += D * step) {
#pragma unroll
    for (int i = 0; i < D; ++i) {
      const int b = b0 + i * step;
      if (b >= end) break;
      const Block<W, R> cur = ring[i];
      if (b + D * step < end) rows.Load(ring[i], b + D * step, w.group_cols);
      Zero zero[R][2];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        zero[r][0] = MakeZero<F>(cur.zero[r][0]);
        zero[r][1] = MakeZero<F>(cur.zero[r][1]);
      }
      float part[R][NT][4];
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          part[r][n][0] = part[r][n][1] = part[r][n][2] = part[r][n][3] = 0;
        }
      }
#pragma unroll
      for (int wd = 0; wd < W; ++wd) {
        uint32_t xs[NT][4];
        LoadX<F, NT>(xs, xrow, b * kB + wd * kV);
#pragma unroll
        for (int s = 0; s < kStepsPerWord<F>; ++s) {
          uint32_t bx[NT][2];
#pragma unroll
          for (int n = 0; n < NT; ++n) {
            bx[n][0] = XPair<F>(xs[n], 2 * s);
            bx[n][1] = XPair<F>(xs[n], 2 * s + 1);
          }
#pragma unroll
          for (int r = 0; r < R; ++r) {
            const uint32_t a[4] = {Pair<F>(cur.q[r][0][wd], 2 * s, zero[r][0]),
                                   Pair<F>(cur.q[r][1][wd], 2 * s, zero[r][1]),
                                   Pair<F>(cur.q[r][0][wd], 2 * s + 1, zero[r][0]),
                                   Pair<F>(cur.q[r][1][wd], 2 * s + 1, zero[r][1])};
#pragma unroll
            for (int n = 0; n < NT; ++n) Mma(part[r][n], a, bx[n][0], bx[n][1]);
          }
        }
      }
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          acc[r][n][0] = fmaf(cur.scale[r][0], part[r][n][0], acc[r][n][0]);
          acc[r][n][1] = fmaf(cur.scale[r][0], part[r][n][1], acc[r][n][1]);
          acc[r][n][2] = fmaf(cur.scale[r][1], part[r][n][2], acc[r][n][2]);
          acc[r][n][3] = fmaf(cur.scale[r][1], part[r][n][3], acc[r][n][3]);
        }
      }
    }
  }

  // The warps' partial sums, fragment by fragment.
  constexpr int kFragments = R * NT * 4;
  __shared__ float partial[kWarps][kFragments][32];
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
      for (int j = 0; j < 4; ++j) partial[warp][(r * NT + n) * 4 + j][lane] = acc[r][n][j];
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < kFragments * 32; e += kWarps * 32) {
    const int l = e % 32, f = e / 32;
    float sum = 0;
#pragma unroll
    for (int v = 0; v < kWarps; ++v) sum += partial[v][f][l];
    const int j = f % 4, n = (f / 4) % NT, r = f / (4 * NT);
    const int row = row0 + 16 * r + l / 4 + (j >= 2 ? 8 : 0);
    const int tok = tok0 + 8 * n + 2 * (l % 4) + (j & 1);
    if (row < w.rows && tok < m)
      y[static_cast<int64_t>(tok) * w.rows + row] = __float2bfloat16(sum);
  }
}

// The kernel shapes (quant_mma.h: QuantMmaShape).
template <QuantFormat F, int W>
void LaunchOf(const bf16* x, const QuantMatrixView& w, bf16* y, int m, const QuantMmaShape& shape,
              LaunchStream s) {
  const int tiles16 = (w.rows + 15) / 16, groups8 = (m + 7) / 8;
  if (m > 8 && shape.large_tiles) {
    LaunchDependent(QuantMmaKernel<F, W, 2, 4, 2, 8>, dim3((m + 31) / 32, (w.rows + 31) / 32),
                    dim3(256), 0, s, x, w, y, m, shape.interleaved);
  } else if (shape.warps == 4) {
    LaunchDependent(QuantMmaKernel<F, W, 1, 1, 4, 4>, dim3(groups8, tiles16), dim3(128), 0, s, x, w,
                    y, m, shape.interleaved);
  } else {
    LaunchDependent(QuantMmaKernel<F, W, 1, 1, 4, 8>, dim3(groups8, tiles16), dim3(256), 0, s, x, w,
                    y, m, shape.interleaved);
  }
}

template <QuantFormat F>
void LaunchFormat(const bf16* x, const QuantMatrixView& w, bf16* y, int m,
                  const QuantMmaShape& shape, LaunchStream s) {
  // 16-byte blocks where the groups and columns allow, else 4-byte ones.
  constexpr int kWide = kBlockCols<F, 4>;
  if (w.group_cols % kWide == 0 && w.cols % kWide == 0) {
    LaunchOf<F, 4>(x, w, y, m, shape, s);
  } else {
    LaunchOf<F, 1>(x, w, y, m, shape, s);
  }
}

}  // namespace

QuantMmaShape QuantMmaShapeFromEnv() {
  QuantMmaShape shape;
  if (const char* v = std::getenv("RS_QUANT_MMA_WARPS"); v != nullptr && std::atoi(v) == 4) {
    shape.warps = 4;
  }
  if (const char* v = std::getenv("RS_QUANT_MMA_LARGE"); v != nullptr) {
    shape.large_tiles = std::string_view(v) == "tiles";
  }
  if (const char* v = std::getenv("RS_QUANT_MMA_SPLIT"); v != nullptr) {
    shape.interleaved = std::string_view(v) == "interleaved";
  }
  return shape;
}

absl::Status LaunchQuantMma(const bf16* x, const QuantMatrixView& w, bf16* y, int m,
                            LaunchStream stream) {
  if (!QuantMatrixSupported(w.format, w.rows, w.cols, w.group_cols) || w.codes == nullptr ||
      w.scales == nullptr || reinterpret_cast<uintptr_t>(w.codes) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(x) % 16 != 0) {
    return absl::InvalidArgumentError(
        "LaunchQuantMma: rows positive, cols and group_cols multiples of the format's chunk, "
        "16-byte aligned codes and x needed");
  }
  if (m < 1 || m > kQuantMmaMaxRows) {
    return absl::InvalidArgumentError("LaunchQuantMma: m must be in [1, 64]");
  }
  const QuantMmaShape shape = QuantMmaShapeFromEnv();
  switch (w.format) {
    case QuantFormat::kInt4:
      LaunchFormat<QuantFormat::kInt4>(x, w, y, m, shape, stream);
      break;
    case QuantFormat::kInt8:
      LaunchFormat<QuantFormat::kInt8>(x, w, y, m, shape, stream);
      break;
    case QuantFormat::kFp8:
      LaunchFormat<QuantFormat::kFp8>(x, w, y, m, shape, stream);
      break;
    case QuantFormat::kFp4:
      LaunchFormat<QuantFormat::kFp4>(x, w, y, m, shape, stream);
      break;
  }
  return LaunchStatus("QuantMma");
}

}  // namespace ringserve::cuda
