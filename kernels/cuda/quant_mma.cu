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

#include <algorithm>
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

// The lane's row (A fragment) and token (B fragment) within the MMA tile: g of lane = 4 g + t.
__device__ __forceinline__ int LaneGroup() { return (threadIdx.x & 31) >> 2; }

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

// Pair i of a word of 4-bit integer codes (i, i + 4) as the exact bf16 values 128 + code:
// 0x4300 | q is the bf16 128 + q.
__device__ __forceinline__ uint32_t BiasedInt4Pair(uint32_t word, int i) {
  return ((word >> (4 * i)) & 0x000f000fu) | 0x43004300u;
}

// Pair i of a word of codes as exact bf16 values before the group scale (integers minus zero):
// 4-bit codes (i, i + 4), 8-bit codes (i, i + 2), the first in the low half.
template <QuantFormat F>
__device__ __forceinline__ uint32_t Pair(uint32_t word, int i, const Zero& z) {
  if constexpr (F == QuantFormat::kInt4) {
    return Bits(__hsub2(Bf2(BiasedInt4Pair(word, i)), Bf2(z.bf16x2)));
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

// A matrix's scale groups and code bytes per row.
struct RowStrides {
  int groups;
  int64_t row_bytes;
};
template <QuantFormat F>
__device__ __forceinline__ RowStrides StridesOf(const QuantMatrixView& w) {
  return {(w.cols + w.group_cols - 1) / w.group_cols,
          static_cast<int64_t>(w.cols) * (kFourBit<F> ? 1 : 2) / 2};
}

// The lane's rows g and g + 8 of each of R row tiles from row0 (rows past the matrix read its
// last row; their results are not stored).
template <QuantFormat F, int W, int R>
__device__ __forceinline__ Rows<F, W, R> RowsOf(const QuantMatrixView& w, RowStrides st, int row0,
                                                int lane_col) {
  const int groups = st.groups;
  const int64_t row_bytes = st.row_bytes;
  Rows<F, W, R> rows;
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = min(row0 + 16 * r + LaneGroup() + 8 * h, w.rows - 1);
      rows.codes[r][h] = w.codes + row * row_bytes + lane_col * (kFourBit<F> ? 1 : 2) / 2;
      rows.scales[r][h] =
          w.scales + static_cast<int64_t>(row) * groups * (kIntegerCodes<F> ? 2 : 1);
    }
  }
  return rows;
}

// acc += the lane's MMA fragments of column block b (codes `cur`, already loaded).
// kFoldZero (int4 only): the MMAs take the codes as 128 + code, without the subtraction of the
// zero point, and one more MMA of ones sums x over the same columns; the block's partial then
// subtracts (128 + zero) times that sum, in fp32 (fewer instructions a weight, partials tens of
// times larger before the subtraction: a few more low bits lost to the fp32 accumulation).
template <QuantFormat F, int W, int R, int NT, bool kFoldZero>
__device__ __forceinline__ void AccumulateBlock(float (&acc)[R][NT][4], const Block<W, R>& cur,
                                                const bf16* const (&xrow)[NT], int b) {
  static_assert(!kFoldZero || F == QuantFormat::kInt4, "zero folding is for int4 codes");
  constexpr int kB = kBlockCols<F, W>;
  constexpr int kV = kValuesPerWord<F>;
  Zero zero[R][2];
  if constexpr (!kFoldZero) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      zero[r][0] = MakeZero<F>(cur.zero[r][0]);
      zero[r][1] = MakeZero<F>(cur.zero[r][1]);
    }
  }
  auto pair = [&](uint32_t word, int i, const Zero& z) {
    if constexpr (kFoldZero) {
      return BiasedInt4Pair(word, i);
    } else {
      return Pair<F>(word, i, z);
    }
  };
  float part[R][NT][4];
  float x_sum[NT][4];  // kFoldZero: the sum of x over the block's columns (rows alike)
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    x_sum[n][0] = x_sum[n][1] = x_sum[n][2] = x_sum[n][3] = 0;
#pragma unroll
    for (int r = 0; r < R; ++r) part[r][n][0] = part[r][n][1] = part[r][n][2] = part[r][n][3] = 0;
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
        const uint32_t a[4] = {pair(cur.q[r][0][wd], 2 * s, zero[r][0]),
                               pair(cur.q[r][1][wd], 2 * s, zero[r][1]),
                               pair(cur.q[r][0][wd], 2 * s + 1, zero[r][0]),
                               pair(cur.q[r][1][wd], 2 * s + 1, zero[r][1])};
#pragma unroll
        for (int n = 0; n < NT; ++n) Mma(part[r][n], a, bx[n][0], bx[n][1]);
      }
      if constexpr (kFoldZero) {
        constexpr uint32_t kOnes[4] = {0x3f803f80u, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u};
#pragma unroll
        for (int n = 0; n < NT; ++n) Mma(x_sum[n], kOnes, bx[n][0], bx[n][1]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      if constexpr (kFoldZero) {
        const float z0 = 128.0f + cur.zero[r][0], z1 = 128.0f + cur.zero[r][1];
        part[r][n][0] = fmaf(-z0, x_sum[n][0], part[r][n][0]);
        part[r][n][1] = fmaf(-z0, x_sum[n][1], part[r][n][1]);
        part[r][n][2] = fmaf(-z1, x_sum[n][2], part[r][n][2]);
        part[r][n][3] = fmaf(-z1, x_sum[n][3], part[r][n][3]);
      }
      acc[r][n][0] = fmaf(cur.scale[r][0], part[r][n][0], acc[r][n][0]);
      acc[r][n][1] = fmaf(cur.scale[r][0], part[r][n][1], acc[r][n][1]);
      acc[r][n][2] = fmaf(cur.scale[r][1], part[r][n][2], acc[r][n][2]);
      acc[r][n][3] = fmaf(cur.scale[r][1], part[r][n][3], acc[r][n][3]);
    }
  }
}

// The warps' partial sums of the tile at (row0, tok0), summed fragment by fragment through
// shared memory and stored to y. Every thread of the block calls it (it synchronizes the block);
// shared memory is free again when it returns.
template <int R, int NT, int kWarps>
__device__ __forceinline__ void StoreTile(const float (&acc)[R][NT][4], bf16* __restrict__ y,
                                          int rows, int m, int row0, int tok0) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
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
    if (row < rows && tok < m) y[static_cast<int64_t>(tok) * rows + row] = __float2bfloat16(sum);
  }
  __syncthreads();
}

template <int R, int NT>
__device__ __forceinline__ void ZeroAcc(float (&acc)[R][NT][4]) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
#pragma unroll
    for (int n = 0; n < NT; ++n) acc[r][n][0] = acc[r][n][1] = acc[r][n][2] = acc[r][n][3] = 0;
  }
}

// The x rows of the lane's token in each of NT token tiles from tok0 (null past m).
template <int NT>
__device__ __forceinline__ void XRowsOf(const bf16* (&xrow)[NT], const bf16* x, int cols, int m,
                                        int tok0, int lane_col) {
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    const int tok = tok0 + 8 * n + LaneGroup();
    xrow[n] = tok < m ? x + static_cast<int64_t>(tok) * cols + lane_col : nullptr;
  }
}

// R tiles of 16 rows x NT tiles of 8 tokens per block of kWarps warps, the warps splitting the
// column blocks; D blocks of codes in flight per lane. blockIdx.x is the token group (the blocks
// of one row tile run side by side and share its codes in L2), blockIdx.y the row tile.
template <QuantFormat F, int W, int R, int NT, int D, int kWarps, bool kFoldZero = false>
__global__ void __launch_bounds__(kWarps * 32, R == 1 ? 16 / kWarps : 1)
    QuantMmaKernel(const bf16* __restrict__ x, QuantMatrixView w, bf16* __restrict__ y, int m,
                   bool interleaved) {
  const int warp = threadIdx.x >> 5;
  const int row0 = blockIdx.y * 16 * R, tok0 = blockIdx.x * 8 * NT;
  const int lane_col = (threadIdx.x & 3) * W * kValuesPerWord<F>;  // the lane's first column
  const Rows<F, W, R> rows = RowsOf<F, W, R>(w, StridesOf<F>(w), row0, lane_col);
  const bf16* xrow[NT];
  XRowsOf<NT>(xrow, x, w.cols, m, tok0, lane_col);
  float acc[R][NT][4];
  ZeroAcc<R, NT>(acc);

  const int blocks = w.cols / kBlockCols<F, W>;
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
      AccumulateBlock<F, W, R, NT, kFoldZero>(acc, cur, xrow, b);
    }
  }
  StoreTile<R, NT, kWarps>(acc, y, w.rows, m, row0, tok0);
}

// The same product for at most 8 tokens (NT = 1, R = 1) with fewer blocks than row tiles: block
// blockIdx.y takes the tiles blockIdx.y + j * gridDim.y, and each warp's ring of D loads runs on
// from one tile into the next, so the next tile's codes are in flight while a tile is summed and
// stored (a launch is then no longer waves of blocks that each wait one memory round trip).
// Every warp walks `per_warp` slots a tile (its blocks, then empty slots), so the block reaches
// each tile's end, and StoreTile's barriers, at the same step.
template <QuantFormat F, int W, int D, int kWarps, bool kFoldZero = false>
__global__ void __launch_bounds__(kWarps * 32, 16 / kWarps)
    QuantMmaPersistentKernel(const bf16* __restrict__ x, QuantMatrixView w, bf16* __restrict__ y,
                             int m, bool interleaved) {
  const int warp = threadIdx.x >> 5;
  const int lane_col = (threadIdx.x & 3) * W * kValuesPerWord<F>;
  const bf16* xrow[1];
  XRowsOf<1>(xrow, x, w.cols, m, 0, lane_col);

  const int tiles = (w.rows + 15) / 16;
  const int my_tiles = (tiles - static_cast<int>(blockIdx.y) + gridDim.y - 1) / gridDim.y;
  const int blocks = w.cols / kBlockCols<F, W>;
  const int per_warp = (blocks + kWarps - 1) / kWarps;
  const int first = interleaved ? warp : blocks * warp / kWarps;
  const int last = interleaved ? blocks : blocks * (warp + 1) / kWarps;  // exclusive
  const int step = interleaved ? kWarps : 1;
  // The warp's block in slot j of a tile, or -1 for an empty slot.
  auto block_of = [&](int j) {
    const int b = first + j * step;
    return b < last ? b : -1;
  };
  const int slots = my_tiles * per_warp;
  const RowStrides strides = StridesOf<F>(w);
  int load_row0 = blockIdx.y * 16, load_slot = 0;  // the next slot to load
  auto load_next = [&](Block<W, 1>& into) {
    const int b = block_of(load_slot);
    if (b >= 0) RowsOf<F, W, 1>(w, strides, load_row0, lane_col).Load(into, b, w.group_cols);
    if (++load_slot == per_warp) load_slot = 0, load_row0 += gridDim.y * 16;
  };

  Block<W, 1> ring[D];
#pragma unroll
  for (int i = 0; i < D; ++i) {
    if (i < slots) load_next(ring[i]);
  }
  WaitForPreviousKernel();
  float acc[1][1][4];
  ZeroAcc<1, 1>(acc);
  int tile = 0, slot = 0;  // the slot being summed
  for (int k0 = 0; k0 < slots; k0 += D) {
#pragma unroll
    for (int i = 0; i < D; ++i) {
      if (k0 + i >= slots) break;
      const Block<W, 1> cur = ring[i];
      if (k0 + i + D < slots) load_next(ring[i]);
      const int b = block_of(slot);
      if (b >= 0) AccumulateBlock<F, W, 1, 1, kFoldZero>(acc, cur, xrow, b);
      if (++slot == per_warp) {
        StoreTile<1, 1, kWarps>(acc, y, w.rows, m, (blockIdx.y + tile * gridDim.y) * 16, 0);
        ZeroAcc<1, 1>(acc);
        slot = 0;
        ++tile;
      }
    }
  }
}

// Blocks for a persistent launch of `kernel` over `tiles` row tiles: as many as the device holds
// at once, then trimmed so that every block takes the same number of tiles.
template <typename Kernel>
int PersistentBlocks(Kernel kernel, int threads, int tiles) {
  static const int resident = [&] {
    int device = 0, sms = 0, per_sm = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0);
    return std::max(1, sms * per_sm);
  }();
  const int per_block = (tiles + resident - 1) / resident;
  return (tiles + per_block - 1) / per_block;
}

// Up to 8 tokens on 8 warps, one block a row tile or persistent blocks.
template <QuantFormat F, int W, bool kFoldZero>
void LaunchFewTokens(const bf16* x, const QuantMatrixView& w, bf16* y, int m,
                     const QuantMmaShape& shape, LaunchStream s) {
  const int tiles16 = (w.rows + 15) / 16;
  if (shape.persistent) {
    constexpr auto kKernel = QuantMmaPersistentKernel<F, W, 4, 8, kFoldZero>;
    LaunchDependent(kKernel, dim3(1, PersistentBlocks(kKernel, 256, tiles16)), dim3(256), 0, s, x,
                    w, y, m, shape.interleaved);
  } else {
    LaunchDependent(QuantMmaKernel<F, W, 1, 1, 4, 8, kFoldZero>, dim3(1, tiles16), dim3(256), 0, s,
                    x, w, y, m, shape.interleaved);
  }
}

// The kernel shapes (quant_mma.h: QuantMmaShape).
template <QuantFormat F, int W>
void LaunchOf(const bf16* x, const QuantMatrixView& w, bf16* y, int m, const QuantMmaShape& shape,
              LaunchStream s) {
  const int tiles16 = (w.rows + 15) / 16, groups8 = (m + 7) / 8;
  if (m <= 8 && shape.warps == 8) {
    if constexpr (F == QuantFormat::kInt4) {
      if (shape.fold_zero) return LaunchFewTokens<F, W, true>(x, w, y, m, shape, s);
    }
    LaunchFewTokens<F, W, false>(x, w, y, m, shape, s);
  } else if (m > 8 && shape.large_tiles) {
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
  if (const char* v = std::getenv("RS_QUANT_MMA_PERSIST"); v != nullptr) {
    shape.persistent = std::string_view(v) == "1";
  }
  if (const char* v = std::getenv("RS_QUANT_MMA_FOLD_ZERO"); v != nullptr) {
    shape.fold_zero = std::string_view(v) == "1";
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
