// Paged decode attention on tensor cores (mma.sync, sm_80+) for head_dim 128: the query heads of
// one kv head's group are the rows of a 16-row MMA tile (rows >= group are zero), so each key
// is read once per group and QK^T and PV run as m16n8k16 MMAs instead of per-lane dot products
// and shuffle reductions.
//
// CTA = 4 warps = one (entry, kv head, split). Warp w takes the split's 16-key tiles w, w + 4,
// ...: it copies each tile's K and V into its own swizzled shared-memory buffers with cp.async,
// kStages tiles in flight, then S = Q K^T (16 x 16), online softmax over the tile, O += P V
// (16 x 128). The warps' states are merged at the end (decode_merge.cuh). Short contexts (up to
// 4 x kStages x 16 keys per split) are thus read in one round trip, longer ones pipelined.
#include <cfloat>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/decode_attention_tc.h"
#include "kernels/cuda/decode_merge.cuh"
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/kv_cache_access.cuh"
#include "kernels/cuda/mma_sync.cuh"
#include "kernels/cuda/paged_cache.cuh"
#include "kernels/cuda/rope.cuh"

namespace ringserve::cuda {
namespace {

constexpr int kD = 128;
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kKeys = 16;               // keys per warp tile
constexpr int kStages = 3;              // tiles in flight per warp
constexpr int kTileElems = kKeys * kD;  // one K or V tile
constexpr int kQElems = 16 * kD;        // the 16-row Q tile
// 100 KB: 2 CTAs per SM (KernelPlan::decode_ctas_per_sm).
constexpr int kSmemBytes = (kQElems + 2 * kStages * kWarps * kTileElems) * 2;
static_assert(kSmemBytes == kDecodeAttentionTcSmemBytes, "the selector sizes the kernel by it");
static_assert(kSmemBytes - kQElems * 2 >= kWarps * (kDecodeMaxGroupDim + 2 * kDecodeMaxGroup) * 4,
              "the merge scratch reuses the K/V buffers");
constexpr float kLog2e = 1.4426950408889634f;

struct Args {
  AttentionShape shape;
  const bf16* q;  // or null: qkv.qkv holds the unrotated projection
  DecodeQkv qkv;
  bf16* out;
  DecodeBatch batch;
};

// With Args::qkv: where the attention input stage of the entries' tokens goes (q into the
// kernel's Q tile, so no q_out).
__device__ __forceinline__ QkvStore StoreOf(const Args& a) {
  return {.bias = a.qkv.bias,
          .positions = a.qkv.positions,
          .inv_freq = a.qkv.inv_freq,
          .slots = a.qkv.slots,
          .cache = a.shape.cache,
          .num_heads = a.shape.num_heads};
}

// With Args::qkv: the newest key and value of (token t, kv head kvh) biased, rotated (the key)
// and stored in the cache, as the QKV prepare would; thread i < 64 takes the key's rotary pair
// i, thread 64 + i the value's.
__device__ __forceinline__ void StoreNewestKv(const Args& a, int t, int kvh) {
  static_assert(kThreads == kD, "one thread per rotary pair of the key and of the value");
  const int heads = a.shape.num_heads, kv_heads = a.shape.cache.num_kv_heads;
  const int half = kD / 2, j = threadIdx.x % half;
  const int head = heads + kvh + (threadIdx.x < half ? 0 : kv_heads);
  const bf16* src = a.qkv.qkv + (static_cast<int64_t>(t) * (heads + 2 * kv_heads) + head) * kD;
  StoreQkvPair(StoreOf(a), t, head, j, __bfloat162float(src[j]), __bfloat162float(src[j + half]));
}

// Element offset of 16-byte chunk `chunk` of row `row` in a tile of 128-element rows, XOR-
// swizzled so that ldmatrix reads are free of bank conflicts.
__device__ __forceinline__ int Swz(int row, int chunk) {
  return row * kD + ((chunk ^ (row & 7)) << 3);
}

// KvT: the cache's element type (kv_cache_access.cuh). An e4m3 tile is copied as codes into the
// front of its stage buffer and expanded to bf16 in place when its turn comes (the MMAs then run
// as for bf16); the K scale is folded into the softmax scale, the V scale into the output.
template <typename KvT>
__global__ void __launch_bounds__(kThreads, 2) DecodeKernelTc(Args a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sq = reinterpret_cast<bf16*>(smem_raw);
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  // Stage i of this warp: K at kv + 2 i kTileElems, V after it.
  bf16* const kv = sq + kQElems + warp * 2 * kStages * kTileElems;

  // The batch description (written before the step) and the cache rows of keys < ctx - 1
  // (written by earlier steps) do not depend on the previous kernel: they are read before
  // WaitForPreviousKernel (see the header); the query and the newest key, which the previous
  // kernel (QKV prepare) writes — or this kernel itself, from Args::qkv — after it.
  const KvCacheLayer& c = a.shape.cache;
  const int e = blockIdx.x;
  const int kvh = blockIdx.y;
  const int split = blockIdx.z;
  const int ctx = a.batch.context_lens[e];
  const int k_begin = split * a.batch.partition;
  if (k_begin >= ctx) {
    WaitForPreviousKernel();
    return;
  }
  const int k_end = min(ctx, k_begin + a.batch.partition);
  const int newest_key = ctx - 1;
  const int group = a.shape.num_heads / c.num_kv_heads;
  const int32_t* table =
      a.batch.block_tables + static_cast<int64_t>(a.batch.table_rows[e]) * a.batch.max_blocks;
  const PagedKeys keys(c.block_size);

  // Copies K and V of keys [key0, key0 + kKeys) into stage buffer `stage`: 2 x kKeys rows of
  // kChunks 16-byte chunks (bf16: swizzled; e4m3: codes, row after row, expanded later), a row's
  // cache offset computed once for both. Rows past k_end are zero-filled. `part` picks the rows:
  // all, all but the newest key (left untouched), or only the newest key.
  constexpr int kChunks = kD * static_cast<int>(sizeof(KvT)) / 16;  // per row
  constexpr int kRowsPerPass = 32 / kChunks;
  enum Part { kAllRows, kOlderRows, kNewestRow };
  const auto load_tile = [&](int key0, int stage, Part part) {
    bf16* sk = kv + 2 * stage * kTileElems;
    bf16* sv = sk + kTileElems;
#pragma unroll
    for (int u = 0; u < kKeys / kRowsPerPass; ++u) {
      const int r = lane / kChunks + kRowsPerPass * u;
      const int chunk = lane % kChunks;
      const int key = key0 + r;
      if ((part == kOlderRows && key == newest_key) || (part == kNewestRow && key != newest_key)) {
        continue;
      }
      const bool valid = key < k_end;
      const int64_t offset =
          valid ? keys.Offset(c, table, key, kvh, kD) + chunk * (16 / sizeof(KvT)) : 0;
      const int dst = kKvFp8<KvT> ? (r * kChunks + chunk) * 8 : Swz(r, chunk);
      CpAsync16(sk + dst, KvKeys<KvT>(c) + offset, valid);
      CpAsync16(sv + dst, KvValues<KvT>(c) + offset, valid);
    }
  };
  // This warp's tiles start at tile_key(j), j = 0, 1, ... while < k_end. The first kStages are
  // copied before the wait (older rows), each its own commit group.
  const auto tile_key = [&](int j) { return k_begin + (warp + kWarps * j) * kKeys; };
#pragma unroll
  for (int j = 0; j < kStages; ++j) {
    if (tile_key(j) < k_end) load_tile(tile_key(j), j, kOlderRows);
    CpAsyncCommit();
  }
  WaitForPreviousKernel();
  const int q_row = a.batch.q_rows[e];
  const bool from_qkv = a.qkv.qkv != nullptr;
  if (from_qkv && k_end == ctx) {  // this split holds the newest key: store it before the copy
    StoreNewestKv(a, q_row, kvh);
    __syncthreads();
  }
#pragma unroll
  for (int j = 0; j < kStages; ++j) {
    if (tile_key(j) < k_end) load_tile(tile_key(j), j, kNewestRow);
  }

  // Q tile: row r < group = query head kvh * group + r; rows >= group are zero.
  if (from_qkv) {  // biased and rotated here, rounded to bf16 as the QKV prepare stores q
    const int half = kD / 2;
    const bf16* src =
        a.qkv.qkv + static_cast<int64_t>(q_row) * (a.shape.num_heads + 2 * c.num_kv_heads) * kD;
    for (int i = threadIdx.x; i < 16 * half; i += kThreads) {
      const int r = i / half, j = i % half;
      float x1 = 0.0f, x2 = 0.0f;
      if (r < group) {
        const int head = kvh * group + r;
        x1 = __bfloat162float(src[head * kD + j]);
        x2 = __bfloat162float(src[head * kD + j + half]);
        BiasAndRotatePair(StoreOf(a), q_row, head, j, x1, x2);
      }
      sq[Swz(r, j / 8) + j % 8] = __float2bfloat16(x1);
      sq[Swz(r, (j + half) / 8) + j % 8] = __float2bfloat16(x2);
    }
  } else {
    for (int i = threadIdx.x; i < 16 * 16; i += kThreads) {
      const int r = i >> 4;
      const int chunk = i & 15;
      const bool valid = r < group;
      const bf16* src =
          valid ? a.q + (static_cast<int64_t>(q_row) * a.shape.num_heads + kvh * group + r) * kD +
                      chunk * 8
                : a.q;
      CpAsync16(sq + Swz(r, chunk), src, valid);
    }
  }
  CpAsyncCommit();
  CpAsyncWait<0>();
  __syncthreads();
  uint32_t qa[8][4];
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    LdMatrixX4(qa[kk], sq + Swz(lane & 15, 2 * kk + (lane >> 4)));
  }

  const int g = lane >> 2;
  const int t4 = lane & 3;
  float o[16][4];
#pragma unroll
  for (int i = 0; i < 16; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) o[i][j] = 0.0f;
  }
  float m_row[2] = {-FLT_MAX, -FLT_MAX};
  float l_row[2] = {0.0f, 0.0f};
  const float scale = a.shape.scale * kLog2e * c.k_scale;

  for (int j = 0; tile_key(j) < k_end; ++j) {
    const int key0 = tile_key(j);
    const int stage = j % kStages;
    // Tiles < kStages arrived with Q; tile j >= kStages was committed kStages - 1 groups ago.
    if (j >= kStages) CpAsyncWait<kStages - 1>();
    __syncwarp();
    const bf16* sk = kv + 2 * stage * kTileElems;
    const bf16* sv = sk + kTileElems;
    if constexpr (kKvFp8<KvT>) {
      for (int h = 0; h < 2; ++h) {  // K, then V
        bf16* tile = kv + (2 * stage + h) * kTileElems;
        ExpandFp8Tile<kKeys * 8 / 32>(
            reinterpret_cast<const unsigned char*>(tile), lane, 32,
            [&](int row, int chunk) { return tile + Swz(row, chunk); }, [] { __syncwarp(); });
        __syncwarp();
      }
    }

    // S = Q K^T: 16 rows x kKeys keys (kKeys / 8 n-tiles of 8 keys).
    constexpr int kNt = kKeys / 8;
    float s[kNt][4];
#pragma unroll
    for (int i = 0; i < kNt; ++i) {
#pragma unroll
      for (int j2 = 0; j2 < 4; ++j2) s[i][j2] = 0.0f;
    }
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
#pragma unroll
      for (int p = 0; p < kKeys / 16; ++p) {
        uint32_t b[4];
        LdMatrixX4(b,
                   sk + Swz(16 * p + ((lane >> 4) << 3) + (lane & 7), 2 * kk + ((lane >> 3) & 1)));
        Mma(s[2 * p], qa[kk], b[0], b[1]);
        Mma(s[2 * p + 1], qa[kk], b[2], b[3]);
      }
    }

    // Online softmax; keys >= k_end (zero rows of the last tile) are masked.
    float tile_max[2] = {-FLT_MAX, -FLT_MAX};
#pragma unroll
    for (int nt = 0; nt < kNt; ++nt) {
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const int key = key0 + 8 * nt + 2 * t4 + (x & 1);
        s[nt][x] = key < k_end ? s[nt][x] * scale : -FLT_MAX;
        tile_max[x >> 1] = fmaxf(tile_max[x >> 1], s[nt][x]);
      }
    }
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
      const float m_new = fmaxf(m_row[r], tile_max[r]);
      alpha[r] = exp2f(m_row[r] - m_new);
      m_row[r] = m_new;
      l_row[r] *= alpha[r];
    }
#pragma unroll
    for (int nt = 0; nt < 16; ++nt) {
      o[nt][0] *= alpha[0];
      o[nt][1] *= alpha[0];
      o[nt][2] *= alpha[1];
      o[nt][3] *= alpha[1];
    }
    // P as A fragments: keys [16 kk, 16 kk + 16) are n-tiles 2 kk and 2 kk + 1.
    uint32_t pa[kKeys / 16][4];
#pragma unroll
    for (int nt = 0; nt < kNt; ++nt) {
      const float p0 = exp2f(s[nt][0] - m_row[0]);
      const float p1 = exp2f(s[nt][1] - m_row[0]);
      const float p2 = exp2f(s[nt][2] - m_row[1]);
      const float p3 = exp2f(s[nt][3] - m_row[1]);
      l_row[0] += p0 + p1;
      l_row[1] += p2 + p3;
      pa[nt >> 1][(nt & 1) * 2] = PackBF16(p0, p1);
      pa[nt >> 1][(nt & 1) * 2 + 1] = PackBF16(p2, p3);
    }

    // O += P V: 16 rows x 128 dims, steps of 16 keys.
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
#pragma unroll
      for (int p = 0; p < 8; ++p) {
        uint32_t b[4];
        LdMatrixX4Trans(
            b, sv + Swz(16 * kk + (((lane >> 3) & 1) << 3) + (lane & 7), 2 * p + (lane >> 4)));
        Mma(o[2 * p], pa[kk], b[0], b[1]);
        Mma(o[2 * p + 1], pa[kk], b[2], b[3]);
      }
    }
    __syncwarp();  // every lane is done with this stage before the next copies land
    if (tile_key(j + kStages) < k_end) load_tile(tile_key(j + kStages), stage, kAllRows);
    CpAsyncCommit();  // one group per iteration, empty or not, for the wait count above
  }

  // The warp's state for rows (query heads) g < group: row sums across the 4 lanes of a row.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_row[r] += __shfl_xor_sync(0xffffffffu, l_row[r], 1);
    l_row[r] += __shfl_xor_sync(0xffffffffu, l_row[r], 2);
  }
  __syncthreads();  // the K/V buffers become the merge scratch
  float* partial = reinterpret_cast<float*>(smem_raw + kQElems * 2);  // [kWarps][MaxGroupDim]
  float* warp_ml = partial + kWarps * kDecodeMaxGroupDim;             // [kWarps][MaxGroup][2]
  if (g < group) {
#pragma unroll
    for (int nt = 0; nt < 16; ++nt) {
      partial[warp * kDecodeMaxGroupDim + g * kD + 8 * nt + 2 * t4] = o[nt][0] * c.v_scale;
      partial[warp * kDecodeMaxGroupDim + g * kD + 8 * nt + 2 * t4 + 1] = o[nt][1] * c.v_scale;
    }
    if (t4 == 0) {
      warp_ml[(warp * kDecodeMaxGroup + g) * 2] = m_row[0];
      warp_ml[(warp * kDecodeMaxGroup + g) * 2 + 1] = l_row[0];
    }
  }
  __syncthreads();
  FinishDecodeSplit<kWarps>(partial, warp_ml, group, kD, kvh * group, split, a.shape, a.batch,
                            a.out);
}

}  // namespace

namespace {

template <typename KvT>
absl::Status LaunchTc(const Args& args, LaunchStream stream) {
  // Once per process and element type (one stage process drives one device).
  static const cudaError_t attribute_error = cudaFuncSetAttribute(
      DecodeKernelTc<KvT>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  RS_CUDA_RETURN_IF_ERROR(attribute_error);
  LaunchDependent(
      DecodeKernelTc<KvT>,
      dim3(args.batch.num_entries, args.shape.cache.num_kv_heads, args.batch.num_splits), kThreads,
      kSmemBytes, stream, args);
  return LaunchStatus("DecodeKernelTc");
}

}  // namespace

absl::Status LaunchDecodeAttentionTc(const AttentionShape& shape, const bf16* q,
                                     const DecodeQkv& qkv, bf16* out, const DecodeBatch& batch,
                                     LaunchStream stream) {
  const Args args{shape, q, qkv, out, batch};
  return shape.cache.k8 != nullptr ? LaunchTc<uint8_t>(args, stream) : LaunchTc<bf16>(args, stream);
}

}  // namespace ringserve::cuda
