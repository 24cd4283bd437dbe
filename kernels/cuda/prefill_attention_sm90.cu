// Causal prefill attention over the paged cache for Hopper (compiled for sm_90a only): Hopper's
// warpgroup MMA (wgmma) reads Q and K/V straight from shared memory, so the tensor cores are fed
// without ldmatrix traffic through registers.
//
// CTA = 2 warpgroups (256 threads) = 128 queries of one head; warpgroup w owns queries
// [64 w, 64 w + 64). K/V tiles of BK = 64 or 128 keys (PrefillKeyTileSm90), double-buffered with
// cp.async (all 256 threads load). Per key tile: S = Q K^T (8 wgmma m64nBKk16 from shared
// memory), online softmax in registers, O += P V (BK / 16 wgmma with P from registers, V read
// MN-major from shared memory). With 64-key tiles two CTAs share an SM (97 KB of shared memory
// and at most 128 registers each) and their phases interleave: one's softmax runs while the
// other's wgmma keep the tensor cores busy.
//
// Shared-memory tiles (R rows x 128 bf16: Q 128 rows, K and V BK rows) are stored as two
// 64-column halves of R rows x 128 bytes in the 128-byte swizzle wgmma expects: 16-byte chunk c
// of row r at half (c / 8) + r * 128 + ((c % 8 ^ (r & 7)) << 4), every tile 1024-byte aligned.
#include <cfloat>

#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/kv_cache_access.cuh"
#include "kernels/cuda/paged_cache.cuh"
#include "kernels/cuda/prefill_attention_sm90.h"
#include "kernels/cuda/wgmma.cuh"

namespace ringserve::cuda {
namespace {

constexpr int kD = 128;
constexpr int kBq = kPrefillTileSm90;  // queries per CTA
constexpr int kThreads = 256;
constexpr int kQHalfBytes = kBq * 128;  // 128 rows x 64 bf16
constexpr int kQTileBytes = 2 * kQHalfBytes;
// Per key-tile size BK (128: one CTA an SM; 64: two, whose phases interleave): K and V tiles of
// BK rows x 128 bf16 as two halves of BK rows x 128 bytes.
__host__ __device__ constexpr int KvHalfBytes(int bk) { return bk * 128; }
__host__ __device__ constexpr int KvTileBytes(int bk) { return 2 * KvHalfBytes(bk); }
// Q, K x 2, V x 2, alignment slack.
__host__ __device__ constexpr int SmemBytes(int bk) {
  return kQTileBytes + 4 * KvTileBytes(bk) + 1024;
}

constexpr float kLog2e = 1.4426950408889634f;

struct Args {
  AttentionShape shape;
  const bf16* q;
  bf16* out;
  PrefillBatch batch;
};

// Where this thread's cp.async copies land and come from. A thread always copies 16-byte chunk
// (tid & 15) of rows tid / 16 + 16 u, so its shared-memory offsets are one base plus u * 2048
// (the swizzle depends on row & 7, the same for every u).
struct LoadPlan {
  uint32_t q_base;   // ChunkOffset(tid / 16, tid & 15) in the Q tile
  uint32_t kv_base;  // the same in a K or V tile
  int row;           // tid / 16
  int chunk;         // tid & 15
  PagedKeys keys;
};

template <int BK>
__device__ __forceinline__ LoadPlan MakeLoadPlan(int block_size) {
  const int row = threadIdx.x >> 4, chunk = threadIdx.x & 15;
  return {ChunkOffset(row, chunk, kQHalfBytes), ChunkOffset(row, chunk, KvHalfBytes(BK)), row,
          chunk, PagedKeys(block_size)};
}

// Queues keys [key0, key0 + BK) of kv head `kvh` into swizzled K and V tiles (one address
// computation per key for both); keys >= kv_end are zero. An e4m3 cache (KvT uint8_t): the
// codes row after row (128 bytes each) at the tiles' starts, thread t copying chunk t % 8 of rows
// t / 8 + 32 u, for ExpandKvTile.
template <int BK, typename KvT>
__device__ __forceinline__ void LoadKvTiles(unsigned char* dk, unsigned char* dv,
                                            const KvCacheLayer& c, const int32_t* table, int key0,
                                            int kv_end, int kvh, const LoadPlan& p) {
  if constexpr (kKvFp8<KvT>) {
    const int row = threadIdx.x >> 3, chunk = threadIdx.x & 7;
#pragma unroll
    for (int u = 0; u < BK / 32; ++u) {
      const int key = key0 + row + 32 * u;
      const bool valid = key < kv_end;
      const int64_t offset = valid ? p.keys.Offset(c, table, key, kvh, kD) + chunk * 16 : 0;
      const uint32_t dst = (threadIdx.x + kThreads * u) * 16;
      CpAsync16(dk + dst, c.k8 + offset, valid);
      CpAsync16(dv + dst, c.v8 + offset, valid);
    }
  } else {
#pragma unroll
    for (int u = 0; u < BK / 16; ++u) {
      const int key = key0 + p.row + 16 * u;
      const bool valid = key < kv_end;
      const int64_t offset = valid ? p.keys.Offset(c, table, key, kvh, kD) + p.chunk * 8 : 0;
      const uint32_t dst = p.kv_base + u * 2048;
      CpAsync16(dk + dst, c.k + offset, valid);
      CpAsync16(dv + dst, c.v + offset, valid);
    }
  }
}

// An e4m3 tile queued by LoadKvTiles, once it has landed and every thread passed a barrier,
// expanded in place into the swizzled bf16 tile (generic-proxy stores: the caller fences them
// for wgmma and synchronizes before the tile is read).
template <int BK>
__device__ __forceinline__ void ExpandKvTile(unsigned char* tile) {
  ExpandFp8Tile<BK * 8 / kThreads>(
      tile, threadIdx.x, kThreads,
      [&](int row, int chunk) { return tile + ChunkOffset(row, chunk, KvHalfBytes(BK)); },
      [] { __syncthreads(); });
}

// KvT: the cache's element type (kv_cache_access.cuh); the K scale is folded into the softmax
// scale, the V scale into the output.
template <int BK, typename KvT>
__global__ void __launch_bounds__(kThreads, BK == 64 ? 2 : 1) PrefillKernelSm90(Args a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // 1024-byte aligned base for the swizzle pattern.
  unsigned char* smem = smem_raw + ((1024 - (SmemAddr(smem_raw) & 1023)) & 1023);
  unsigned char* sq = smem;
  auto sk = [&](int b) { return smem + kQTileBytes + b * KvTileBytes(BK); };
  auto sv = [&](int b) { return smem + kQTileBytes + (2 + b) * KvTileBytes(BK); };

  const KvCacheLayer& c = a.shape.cache;
  const int num_heads = a.shape.num_heads;
  // Heads vary fastest: the longest tiles of every head run first, and the heads of one kv
  // group run side by side (their K/V stay in L2).
  const int tile = blockIdx.x / num_heads;
  const int head = blockIdx.x - tile * num_heads;
  const int seq = a.batch.tiles[2 * tile];
  const int q0 = a.batch.tiles[2 * tile + 1];
  const int kvh = head / (num_heads / c.num_kv_heads);
  const int q_start = a.batch.q_starts[seq];
  const int ntok = a.batch.num_tokens[seq];
  const int start_pos = a.batch.start_positions[seq];
  const int32_t* table = a.batch.block_tables + static_cast<int64_t>(seq) * a.batch.max_blocks;
  const int nq = min(kBq, ntok - q0);
  const int kv_end = start_pos + q0 + nq;
  const int num_kt = (kv_end + BK - 1) / BK;

  const int tid = threadIdx.x;
  const int wg = tid >> 7;
  const int warp = (tid >> 5) & 3;
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int t4 = lane & 3;

  const LoadPlan plan = MakeLoadPlan<BK>(c.block_size);
#pragma unroll
  for (int u = 0; u < 8; ++u) {
    const int r = plan.row + 16 * u;
    const bool valid = r < nq;
    const bf16* src = valid
                          ? a.q + (static_cast<int64_t>(q_start + q0 + r) * num_heads + head) * kD +
                                plan.chunk * 8
                          : a.q;
    CpAsync16(sq + plan.q_base + u * 2048, src, valid);
  }
  LoadKvTiles<BK, KvT>(sk(0), sv(0), c, table, 0, kv_end, kvh, plan);
  CpAsyncCommit();

  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.0f;
  float m_row[2] = {-FLT_MAX, -FLT_MAX};
  float l_row[2] = {0.0f, 0.0f};
  const float scale = a.shape.scale * kLog2e * c.k_scale;
  // This thread's two query rows (tile-relative) and their absolute positions.
  const int row0 = 64 * wg + 16 * warp + g;
  const int qpos0 = start_pos + q0 + row0;
  const int qpos1 = qpos0 + 8;
  const uint32_t q_addr = SmemAddr(sq) + 64 * wg * 128;

  for (int j = 0; j < num_kt; ++j) {
    const int buf = j & 1;
    CpAsyncWait<0>();  // tile j (the only copies in flight)
    FenceProxyAsync();
    // Tile j is visible to every warpgroup, and every warpgroup is done with tile j - 1, whose
    // buffer now receives tile j + 1 while tile j is computed.
    __syncthreads();
    if constexpr (kKvFp8<KvT>) {
      ExpandKvTile<BK>(sk(buf));
      ExpandKvTile<BK>(sv(buf));
      FenceProxyAsync();
      __syncthreads();
    }
    if (j + 1 < num_kt) {
      LoadKvTiles<BK, KvT>(sk(buf ^ 1), sv(buf ^ 1), c, table, (j + 1) * BK, kv_end, kvh, plan);
      CpAsyncCommit();
    }

    // S = Q K^T over the 128 head dims: 8 steps of 16 (4 per 64-column half, 32 bytes each).
    constexpr int kS = BK / 2;  // this thread's scores
    float s[kS];
    const uint32_t k_addr = SmemAddr(sk(buf));
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      const uint32_t off = (kk & 3) * 32;
      WgmmaScores<BK>(s, Descriptor(q_addr + (kk >> 2) * kQHalfBytes + off, 16, 1024),
                      Descriptor(k_addr + (kk >> 2) * KvHalfBytes(BK) + off, 16, 1024), kk > 0);
    }
    WgmmaCommitAndWait();
    FenceRegisters<kS>(s);

    // Scale, causal mask, online softmax. s[4 n + e]: key 8 n + 2 t4 + (e & 1) of the tile, row
    // row0 (e < 2) or row0 + 8.
    // The maximum is taken over unscaled scores (scale > 0) and the scale folded into the
    // exponent: p = 2^(s * scale - m), one FFMA per score.
    const int key_base = j * BK;
    if (key_base + BK - 1 > start_pos + q0) {
#pragma unroll
      for (int i = 0; i < kS; ++i) {
        const int key = key_base + 8 * (i >> 2) + 2 * t4 + (i & 1);
        if (key > ((i & 2) ? qpos1 : qpos0)) s[i] = -FLT_MAX;
      }
    }
    float tile_max[2] = {-FLT_MAX, -FLT_MAX};
#pragma unroll
    for (int i = 0; i < kS; ++i) tile_max[(i >> 1) & 1] = fmaxf(tile_max[(i >> 1) & 1], s[i]);
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
      const float m_new = fmaxf(m_row[r], tile_max[r] * scale);
      alpha[r] = Exp2(m_row[r] - m_new);
      m_row[r] = m_new;
      l_row[r] *= alpha[r];
    }
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] *= alpha[(i >> 1) & 1];
    // P as wgmma A fragments: keys [16 kk, 16 kk + 16) are accumulator columns n = 2 kk, 2 kk + 1.
    uint32_t pa[BK / 16][4];
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float* sv4 = s + 8 * kk + 4 * h;
        const float p0 = Exp2(fmaf(sv4[0], scale, -m_row[0]));
        const float p1 = Exp2(fmaf(sv4[1], scale, -m_row[0]));
        const float p2 = Exp2(fmaf(sv4[2], scale, -m_row[1]));
        const float p3 = Exp2(fmaf(sv4[3], scale, -m_row[1]));
        l_row[0] += p0 + p1;
        l_row[1] += p2 + p3;
        pa[kk][2 * h] = PackBF16(p0, p1);
        pa[kk][2 * h + 1] = PackBF16(p2, p3);
      }
    }

    // O += P V: BK / 16 steps of 16 keys (2048 bytes of V each).
    const uint32_t v_addr = SmemAddr(sv(buf));
    FenceRegisters(o);
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      WgmmaRS(o, pa[kk], Descriptor(v_addr + kk * 2048, KvHalfBytes(BK), 1024));
    }
    WgmmaCommitAndWait();
    FenceRegisters(o);
  }

  // Normalize and store.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_row[r] += __shfl_xor_sync(0xffffffffu, l_row[r], 1);
    l_row[r] += __shfl_xor_sync(0xffffffffu, l_row[r], 2);
  }
  const float inv[2] = {c.v_scale / l_row[0], c.v_scale / l_row[1]};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = row0 + 8 * h;
    if (r >= nq) continue;
    bf16* dst = a.out + (static_cast<int64_t>(q_start + q0 + r) * num_heads + head) * kD;
#pragma unroll
    for (int n = 0; n < 16; ++n) {
      *reinterpret_cast<__nv_bfloat162*>(dst + 8 * n + 2 * t4) =
          __floats2bfloat162_rn(o[4 * n + 2 * h] * inv[h], o[4 * n + 2 * h + 1] * inv[h]);
    }
  }
#endif
}

}  // namespace

namespace {
template <int BK, typename KvT>
absl::Status Launch(const Args& args, int num_ctas, cudaStream_t stream) {
  // Once per process and kernel (one stage process drives one device).
  static const cudaError_t attribute_error = cudaFuncSetAttribute(
      PrefillKernelSm90<BK, KvT>, cudaFuncAttributeMaxDynamicSharedMemorySize, SmemBytes(BK));
  RS_CUDA_RETURN_IF_ERROR(attribute_error);
  PrefillKernelSm90<BK, KvT><<<num_ctas, kThreads, SmemBytes(BK), stream>>>(args);
  return LaunchStatus("PrefillKernelSm90");
}

template <typename KvT>
absl::Status LaunchFor(const Args& args, int num_ctas, cudaStream_t stream) {
  return args.batch.key_tile == 64 ? Launch<64, KvT>(args, num_ctas, stream)
                                   : Launch<128, KvT>(args, num_ctas, stream);
}
}  // namespace

absl::Status LaunchPrefillAttentionSm90(const AttentionShape& shape, const bf16* q, bf16* out,
                                        const PrefillBatch& batch, cudaStream_t stream) {
  const Args args{shape, q, out, batch};
  const int ctas = batch.num_tiles * shape.num_heads;
  return shape.cache.k8 != nullptr ? LaunchFor<uint8_t>(args, ctas, stream)
                                   : LaunchFor<bf16>(args, ctas, stream);
}

}  // namespace ringserve::cuda
