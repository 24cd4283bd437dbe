// Absorbed MLA decode on Hopper's warpgroup MMA (compiled for sm_90a only). See
// mla_decode_sm90.h for the CTA's plan and mla_decode.h for the formula.
//
// Shared memory (wgmma.cuh's swizzled halves, every tile 64 rows): the query tile (64 heads x
// 576 dims: 9 halves), two key tiles (64 keys x 576), P (64 heads x 64 keys: 1 half), the two
// warpgroups' row maxima and sums.
#include <cfloat>

#include "common/status_macros.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/mla_decode_sm90.h"
#include "kernels/cuda/wgmma.cuh"

namespace ringserve::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kHeads = kMlaHeadsSm90;              // one wgmma M tile
constexpr int kKeys = 64;                          // keys per tile; 32 per warpgroup
constexpr int kHalves = kMlaRowDim / 64;           // 64-dim column blocks of a row (9)
constexpr int kLatentHalves = kMlaLatentDim / 64;  // the value's blocks (8): 4 per warpgroup
constexpr int kHalfBytes = 64 * 128;               // 64 rows x 128 bytes
constexpr int kTileBytes = kHalves * kHalfBytes;   // 73,728
constexpr int kChunks = kMlaRowDim / 8;            // 16-byte chunks per row (72)
constexpr int kLoadThreadsPerRow = kThreads / 64;  // 4 threads copy one 64-row tile's row
constexpr int kStatsBytes = 2 * 2 * kHeads * sizeof(float);
// Query, 2 key tiles, P, statistics, slack for the 1024-byte alignment.
constexpr int kSmemBytes = 3 * kTileBytes + kHalfBytes + kStatsBytes + 1024;
constexpr float kLog2e = 1.4426950408889634f;
static_assert(kHeads == 64 && kMlaRowDim % 64 == 0 && kChunks % kLoadThreadsPerRow == 0);
static_assert(kSmemBytes <= 227 * 1024, "one CTA must fit an SM's 227 KB");

// Queues 64 rows (the tile's row r from src_row(r), nullptr: zeros) into a swizzled tile.
// Thread t copies chunks t % 4, t % 4 + 4, ... of row t / 4 (one address computation per row).
// `any` is a valid global address, named by the zero-filling copies (which read nothing).
template <typename RowFn>
__device__ __forceinline__ void LoadRows(unsigned char* tile, const bf16* any, RowFn src_row) {
  const int row = threadIdx.x / kLoadThreadsPerRow;
  const bf16* src = src_row(row);
  const bool valid = src != nullptr;
  if (!valid) src = any;
#pragma unroll
  for (int i = 0; i < kChunks / kLoadThreadsPerRow; ++i) {
    const int chunk = threadIdx.x % kLoadThreadsPerRow + kLoadThreadsPerRow * i;
    CpAsync16(tile + ChunkOffset(row, chunk, kHalfBytes), valid ? src + chunk * 8 : src, valid);
  }
}

// Grid: (64-head tile, entry, split).
__global__ void __launch_bounds__(kThreads, 1) MlaDecodeSm90Kernel(MlaDecodeArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (SmemAddr(smem_raw) & 1023)) & 1023);
  unsigned char* const sq = smem;
  auto sk = [&](int b) { return smem + (1 + b) * kTileBytes; };
  unsigned char* const sp = smem + 3 * kTileBytes;
  float* const wmax = reinterpret_cast<float*>(sp + kHalfBytes);  // [warpgroup][head]
  float* const wsum = wmax + 2 * kHeads;                          // [warpgroup][head]

  const int e = blockIdx.y, split = blockIdx.z;
  const int ctx = a.batch.context_lens[e];
  const int k_begin = split * a.batch.partition;
  if (k_begin >= ctx) return;
  const int k_end = min(ctx, k_begin + a.batch.partition);
  const int num_kt = (k_end - k_begin + kKeys - 1) / kKeys;
  const int table_row = a.batch.table_rows != nullptr ? a.batch.table_rows[e] : e;
  const int32_t* table =
      a.batch.block_tables + static_cast<int64_t>(table_row) * a.batch.max_blocks;
  const MlaCacheLayer c = a.cache;
  const int head0 = blockIdx.x * kHeads;

  const int tid = threadIdx.x;
  const int wg = tid >> 7;
  const int warp = (tid >> 5) & 3;
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int t4 = lane & 3;
  const int row0 = 16 * warp + g;  // this thread's heads in the tile: row0 and row0 + 8

  const auto key_row = [&](int key) -> const bf16* {
    if (key >= k_end) return nullptr;
    const int blk = key / c.block_size;
    return c.data + table[blk] * c.block_stride +
           static_cast<int64_t>(key - blk * c.block_size) * kMlaRowDim;
  };
  // Group 0: the query tile and key tile 0.
  LoadRows(sq, a.q, [&](int r) -> const bf16* {
    const int head = head0 + r;
    return head < a.num_heads ? a.q + (static_cast<int64_t>(e) * a.num_heads + head) * kMlaRowDim
                              : nullptr;
  });
  LoadRows(sk(0), c.data, [&](int r) { return key_row(k_begin + r); });
  CpAsyncCommit();

  float o[2][64];  // output dims 256 wg + 128 nb + ...: wgmma m64n128 accumulators
#pragma unroll
  for (int i = 0; i < 64; ++i) o[0][i] = o[1][i] = 0.0f;
  float m_row[2] = {-FLT_MAX, -FLT_MAX};  // log2 units, identical in both warpgroups
  float l_row[2] = {0.0f, 0.0f};          // this warpgroup's keys only
  const float scale = a.scale * kLog2e;
  const uint32_t q_addr = SmemAddr(sq);
  const uint32_t p_addr = SmemAddr(sp);

  for (int j = 0; j < num_kt; ++j) {
    const int buf = j & 1;
    CpAsyncWait<0>();  // tile j (the only copies in flight)
    FenceProxyAsync();
    // Tile j is visible to both warpgroups, and both are done with tile j - 1, whose buffer now
    // receives tile j + 1 while tile j is computed.
    __syncthreads();
    if (j + 1 < num_kt) {
      const int next = k_begin + (j + 1) * kKeys;
      LoadRows(sk(buf ^ 1), c.data, [&](int r) { return key_row(next + r); });
      CpAsyncCommit();
    }

    // S = Q K^T for this warpgroup's 32 keys: 36 steps of 16 dims (4 per half).
    const uint32_t k_addr = SmemAddr(sk(buf));
    float s[16];
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < 4 * kHalves; ++kk) {
      const uint32_t off = (kk >> 2) * kHalfBytes + (kk & 3) * 32;
      WgmmaM64N32SS(s, Descriptor(q_addr + off, 16, 1024),
                    Descriptor(k_addr + wg * 32 * 128 + off, 16, 1024), kk > 0);
    }
    WgmmaCommitAndWait();
    FenceRegisters<16>(s);

    // s[4 n + x]: key 32 wg + 8 n + 2 t4 + (x & 1) of the tile, head row0 (x < 2) or row0 + 8.
    const int key_base = k_begin + j * kKeys + 32 * wg;
    float tile_max[2] = {-FLT_MAX, -FLT_MAX};
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int key = key_base + 8 * (i >> 2) + 2 * t4 + (i & 1);
      s[i] = key < k_end ? s[i] * scale : -FLT_MAX;
      tile_max[(i >> 1) & 1] = fmaxf(tile_max[(i >> 1) & 1], s[i]);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
      if (t4 == 0) wmax[wg * kHeads + row0 + 8 * r] = tile_max[r];
    }
    __syncthreads();

    // One online softmax for the CTA (both warpgroups derive the same maxima), P to shared
    // memory as wgmma's A operand (heads x keys, K-major, one half).
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int h = row0 + 8 * r;
      const float m_new = fmaxf(m_row[r], fmaxf(wmax[h], wmax[kHeads + h]));
      alpha[r] = Exp2(m_row[r] - m_new);
      m_row[r] = m_new;
      l_row[r] *= alpha[r];
    }
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      const float p0 = Exp2(s[4 * n] - m_row[0]);
      const float p1 = Exp2(s[4 * n + 1] - m_row[0]);
      const float p2 = Exp2(s[4 * n + 2] - m_row[1]);
      const float p3 = Exp2(s[4 * n + 3] - m_row[1]);
      l_row[0] += p0 + p1;
      l_row[1] += p2 + p3;
      const int chunk = 4 * wg + n;  // keys 8 chunk .. 8 chunk + 7 of the tile
      *reinterpret_cast<uint32_t*>(sp + ChunkOffset(row0, chunk, kHalfBytes) + 4 * t4) =
          PackBF16(p0, p1);
      *reinterpret_cast<uint32_t*>(sp + ChunkOffset(row0 + 8, chunk, kHalfBytes) + 4 * t4) =
          PackBF16(p2, p3);
    }
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      o[0][i] *= alpha[(i >> 1) & 1];
      o[1][i] *= alpha[(i >> 1) & 1];
    }
    FenceProxyAsync();  // P's generic stores, before wgmma reads them
    __syncthreads();

    // O += P V: 4 steps of 16 keys; V = the tile's latent halves 4 wg .. 4 wg + 3, read MN-major.
    FenceRegisters(o[0]);
    FenceRegisters(o[1]);
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
#pragma unroll
      for (int nb = 0; nb < 2; ++nb) {
        const uint32_t v = k_addr + ((kLatentHalves / 2) * wg + 2 * nb) * kHalfBytes + kk * 2048;
        WgmmaM64N128SSTransB(o[nb], Descriptor(p_addr + kk * 32, 16, 1024),
                             Descriptor(v, kHalfBytes, 1024));
      }
    }
    WgmmaCommitAndWait();
    FenceRegisters(o[0]);
    FenceRegisters(o[1]);
  }
  CpAsyncWait<0>();

  // Both warpgroups' sums of exponentials.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_row[r] += __shfl_xor_sync(0xffffffffu, l_row[r], 1);
    l_row[r] += __shfl_xor_sync(0xffffffffu, l_row[r], 2);
    if (t4 == 0) wsum[wg * kHeads + row0 + 8 * r] = l_row[r];
  }
  __syncthreads();

  const int num_splits = gridDim.z;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int head = head0 + row0 + 8 * r;
    if (head >= a.num_heads) continue;
    const float l = wsum[row0 + 8 * r] + wsum[kHeads + row0 + 8 * r];
    const int64_t row = static_cast<int64_t>(e) * a.num_heads + head;
    const int64_t part = row * num_splits + split;
    const float inv = num_splits == 1 ? 1.0f / l : 1.0f;
#pragma unroll
    for (int nb = 0; nb < 2; ++nb) {
#pragma unroll
      for (int n = 0; n < 16; ++n) {
        const int dim = (kMlaLatentDim / 2) * wg + 128 * nb + 8 * n + 2 * t4;
        const float v0 = o[nb][4 * n + 2 * r] * inv, v1 = o[nb][4 * n + 2 * r + 1] * inv;
        if (num_splits == 1) {
          *reinterpret_cast<uint32_t*>(a.out + row * kMlaLatentDim + dim) = PackBF16(v0, v1);
        } else {
          *reinterpret_cast<float2*>(a.batch.workspace + part * kMlaLatentDim + dim) =
              make_float2(v0, v1);
        }
      }
    }
    if (num_splits > 1 && wg == 0 && t4 == 0) {
      float* ml = a.batch.workspace + static_cast<int64_t>(a.batch.num_entries) * a.num_heads *
                                          num_splits * kMlaLatentDim;
      ml[2 * part] = m_row[r];
      ml[2 * part + 1] = l;
    }
  }
#endif
}

}  // namespace

absl::Status LaunchMlaDecodeSm90(const MlaDecodeArgs& args, cudaStream_t stream) {
  // Once per process (one stage process drives one device).
  static const cudaError_t attribute_error = cudaFuncSetAttribute(
      MlaDecodeSm90Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  RS_CUDA_RETURN_IF_ERROR(attribute_error);
  const dim3 grid((args.num_heads + kHeads - 1) / kHeads, args.batch.num_entries,
                  args.batch.num_splits);
  MlaDecodeSm90Kernel<<<grid, kThreads, kSmemBytes, stream>>>(args);
  return LaunchStatus("MlaDecodeSm90Kernel");
}

}  // namespace ringserve::cuda
