// Causal prefill attention: the launcher that picks a kernel, and the flash-attention style
// kernel for any sm_80+ device (Hopper runs prefill_attention_sm90.cu): head_dim 128, mma.sync
// m16n8k16 bf16 with fp32 accumulation. CTA = 4 warps = 64 queries of one head; K/V tiles of 64
// keys, double-buffered with cp.async; shared-memory rows of 128 bf16 are XOR-swizzled in
// 16-byte chunks (chunk c of row r stored at c ^ (r & 7)) so ldmatrix is conflict-free.
#include <algorithm>
#include <cfloat>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/kv_cache_access.cuh"
#include "kernels/cuda/mma_sync.cuh"
#include "kernels/cuda/paged_cache.cuh"
#include "kernels/cuda/prefill_attention_sm90.h"

namespace ringserve::cuda {
namespace {

constexpr int kD = 128;
constexpr int kBq = kPrefillTile;
constexpr int kBk = 64;
constexpr int kThreads = 128;
constexpr int kTileElems = 64 * kD;
constexpr int kSmemBytes = (kTileElems * 5) * 2;  // Q + 2 x (K, V)
constexpr float kLog2e = 1.4426950408889634f;

struct PrefillArgs {
  AttentionShape shape;
  const bf16* q;
  bf16* out;
  PrefillBatch batch;
};

__device__ __forceinline__ int Swz(int row, int chunk) {
  return row * kD + ((chunk ^ (row & 7)) << 3);
}

// Loads keys [key0, key0 + 64) of kv head `kvh` into a tile; keys >= kv_end are zero. bf16:
// swizzled; e4m3 (KvT uint8_t): the codes row after row at the tile's start, for ExpandKvTile.
template <typename KvT>
__device__ __forceinline__ void LoadKvTile(bf16* dst, const KvT* cache, const int32_t* table,
                                           int key0, int kv_end, int kvh, const KvCacheLayer& c) {
  constexpr int kChunks = kD * static_cast<int>(sizeof(KvT)) / 16;  // per row
  const PagedKeys keys(c.block_size);
#pragma unroll
  for (int u = 0; u < kBk * kChunks / kThreads; ++u) {
    const int i = threadIdx.x + kThreads * u;
    const int r = i / kChunks;
    const int chunk = i % kChunks;
    const int key = key0 + r;
    const bool valid = key < kv_end;
    const KvT* src =
        valid ? cache + keys.Offset(c, table, key, kvh, kD) + chunk * (16 / sizeof(KvT)) : cache;
    CpAsync16(dst + (kKvFp8<KvT> ? i * 8 : Swz(r, chunk)), src, valid);
  }
}

// An e4m3 tile loaded by LoadKvTile, once it has landed (after the wait and a barrier), expanded
// to the swizzled bf16 tile in place; a barrier follows before it is read.
__device__ __forceinline__ void ExpandKvTile(bf16* tile) {
  ExpandFp8Tile<kBk * 8 / kThreads>(
      reinterpret_cast<const unsigned char*>(tile), threadIdx.x, kThreads,
      [&](int row, int chunk) { return tile + Swz(row, chunk); }, [] { __syncthreads(); });
}

// KvT: the cache's element type (kv_cache_access.cuh); the K scale is folded into the softmax
// scale, the V scale into the output.
template <typename KvT>
__global__ void __launch_bounds__(kThreads, 2) PrefillKernel(PrefillArgs a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* sq = reinterpret_cast<bf16*>(smem_raw);
  // K of buffer b at sq + (1 + b) tiles, V at sq + (3 + b) tiles (offsets, not a pointer array:
  // an array indexed at run time would live in local memory).
  auto sk = [&](int b) { return sq + (1 + b) * kTileElems; };
  auto sv = [&](int b) { return sq + (3 + b) * kTileElems; };

  const KvCacheLayer& c = a.shape.cache;
  const int seq = a.batch.tiles[2 * blockIdx.x];
  const int q0 = a.batch.tiles[2 * blockIdx.x + 1];
  const int head = blockIdx.y;
  const int group = a.shape.num_heads / c.num_kv_heads;
  const int kvh = head / group;
  const int q_start = a.batch.q_starts[seq];
  const int ntok = a.batch.num_tokens[seq];
  const int start_pos = a.batch.start_positions[seq];
  const int32_t* table = a.batch.block_tables + static_cast<int64_t>(seq) * a.batch.max_blocks;
  const int nq = min(kBq, ntok - q0);
  const int kv_end = start_pos + q0 + nq;
  const int num_kt = (kv_end + kBk - 1) / kBk;

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int g = lane >> 2;
  const int t4 = lane & 3;

  // Q tile.
#pragma unroll
  for (int u = 0; u < 8; ++u) {
    const int i = tid + kThreads * u;
    const int r = i >> 4;
    const int chunk = i & 15;
    const bool valid = r < nq;
    const bf16* src =
        valid ? a.q + (static_cast<int64_t>(q_start + q0 + r) * a.shape.num_heads + head) * kD +
                    chunk * 8
              : a.q;
    CpAsync16(sq + Swz(r, chunk), src, valid);
  }
  LoadKvTile(sk(0), KvKeys<KvT>(c), table, 0, kv_end, kvh, c);
  LoadKvTile(sv(0), KvValues<KvT>(c), table, 0, kv_end, kvh, c);
  CpAsyncCommit();

  uint32_t qa[8][4];
  float o[16][4];
#pragma unroll
  for (int i = 0; i < 16; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) o[i][j] = 0.0f;
  }
  float m_row[2] = {-FLT_MAX, -FLT_MAX};
  float l_row[2] = {0.0f, 0.0f};
  const float scale = a.shape.scale * kLog2e * c.k_scale;
  // Absolute positions of this thread's two query rows.
  const int qpos0 = start_pos + q0 + warp * 16 + g;
  const int qpos1 = qpos0 + 8;

  for (int j = 0; j < num_kt; ++j) {
    const int buf = j & 1;
    if (j + 1 < num_kt) {
      LoadKvTile(sk(buf ^ 1), KvKeys<KvT>(c), table, (j + 1) * kBk, kv_end, kvh, c);
      LoadKvTile(sv(buf ^ 1), KvValues<KvT>(c), table, (j + 1) * kBk, kv_end, kvh, c);
      CpAsyncCommit();
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();
    if constexpr (kKvFp8<KvT>) {
      ExpandKvTile(sk(buf));
      ExpandKvTile(sv(buf));
      __syncthreads();
    }
    if (j == 0) {
#pragma unroll
      for (int kk = 0; kk < 8; ++kk) {
        LdMatrixX4(qa[kk], sq + Swz(warp * 16 + (lane & 15), 2 * kk + (lane >> 4)));
      }
    }

    // S = Q K^T for this warp's 16 rows x 64 keys.
    float s[8][4];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[i][e] = 0.0f;
    }
    const bf16* kt = sk(buf);
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
#pragma unroll
      for (int p = 0; p < 4; ++p) {
        uint32_t b[4];
        LdMatrixX4(b,
                   kt + Swz(16 * p + ((lane >> 4) << 3) + (lane & 7), 2 * kk + ((lane >> 3) & 1)));
        Mma(s[2 * p], qa[kk], b[0], b[1]);
        Mma(s[2 * p + 1], qa[kk], b[2], b[3]);
      }
    }

    // Scale, causal mask, online softmax.
    const int key_base = j * kBk;
    const bool needs_mask = key_base + kBk - 1 > start_pos + q0;
    float tile_max[2] = {-FLT_MAX, -FLT_MAX};
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = s[nt][e] * scale;
        if (needs_mask) {
          const int key = key_base + 8 * nt + 2 * t4 + (e & 1);
          const int qpos = e < 2 ? qpos0 : qpos1;
          if (key > qpos) v = -FLT_MAX;
        }
        s[nt][e] = v;
        tile_max[e >> 1] = fmaxf(tile_max[e >> 1], v);
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
    uint32_t pa[4][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      const float p0 = exp2f(s[nt][0] - m_row[0]);
      const float p1 = exp2f(s[nt][1] - m_row[0]);
      const float p2 = exp2f(s[nt][2] - m_row[1]);
      const float p3 = exp2f(s[nt][3] - m_row[1]);
      l_row[0] += p0 + p1;
      l_row[1] += p2 + p3;
      const int kk = nt >> 1;
      const int hi = nt & 1;
      pa[kk][hi * 2 + 0] = PackBF16(p0, p1);
      pa[kk][hi * 2 + 1] = PackBF16(p2, p3);
    }

    // O += P V.
    const bf16* vt = sv(buf);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
      for (int p = 0; p < 8; ++p) {
        uint32_t b[4];
        LdMatrixX4Trans(
            b, vt + Swz(16 * kk + (((lane >> 3) & 1) << 3) + (lane & 7), 2 * p + (lane >> 4)));
        Mma(o[2 * p], pa[kk], b[0], b[1]);
        Mma(o[2 * p + 1], pa[kk], b[2], b[3]);
      }
    }
    __syncthreads();
  }

  // Normalize and store.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l_row[r] += __shfl_xor_sync(0xffffffffu, l_row[r], 1);
    l_row[r] += __shfl_xor_sync(0xffffffffu, l_row[r], 2);
  }
  const float inv0 = c.v_scale / l_row[0];
  const float inv1 = c.v_scale / l_row[1];
  const int r0 = warp * 16 + g;
  const int r1 = r0 + 8;
#pragma unroll
  for (int nt = 0; nt < 16; ++nt) {
    const int dim = 8 * nt + 2 * t4;
    if (r0 < nq) {
      bf16* dst = a.out + (static_cast<int64_t>(q_start + q0 + r0) * a.shape.num_heads + head) * kD;
      *reinterpret_cast<__nv_bfloat162*>(dst + dim) =
          __floats2bfloat162_rn(o[nt][0] * inv0, o[nt][1] * inv0);
    }
    if (r1 < nq) {
      bf16* dst = a.out + (static_cast<int64_t>(q_start + q0 + r1) * a.shape.num_heads + head) * kD;
      *reinterpret_cast<__nv_bfloat162*>(dst + dim) =
          __floats2bfloat162_rn(o[nt][2] * inv1, o[nt][3] * inv1);
    }
  }
}

}  // namespace

void MakePrefillTiles(const std::vector<int32_t>& num_tokens,
                      const std::vector<int32_t>& start_positions, std::vector<int32_t>* tiles,
                      int tile_rows) {
  struct Tile {
    int32_t seq, q0, keys;
  };
  std::vector<Tile> list;
  for (size_t s = 0; s < num_tokens.size(); ++s) {
    for (int32_t q0 = 0; q0 < num_tokens[s]; q0 += tile_rows) {
      const int32_t nq = std::min(tile_rows, num_tokens[s] - q0);
      list.push_back({static_cast<int32_t>(s), q0, start_positions[s] + q0 + nq});
    }
  }
  std::stable_sort(list.begin(), list.end(),
                   [](const Tile& x, const Tile& y) { return x.keys > y.keys; });
  for (const Tile& t : list) {
    tiles->push_back(t.seq);
    tiles->push_back(t.q0);
  }
}

namespace {

template <typename KvT>
absl::Status LaunchPrefill(const PrefillArgs& args, LaunchStream stream) {
  // Once per process and element type (one stage process drives one device).
  static const cudaError_t attribute_error = cudaFuncSetAttribute(
      PrefillKernel<KvT>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
  RS_CUDA_RETURN_IF_ERROR(attribute_error);
  PrefillKernel<KvT>
      <<<dim3(args.batch.num_tiles, args.shape.num_heads), kThreads, kSmemBytes, stream>>>(args);
  return LaunchStatus("PrefillKernel");
}

}  // namespace

absl::Status LaunchPrefillAttention(const AttentionShape& shape, const bf16* q, bf16* out,
                                    const PrefillBatch& batch, LaunchStream stream) {
  const KvCacheLayer& c = shape.cache;
  if (c.head_dim != kD || c.num_kv_heads <= 0 || shape.num_heads % c.num_kv_heads != 0 ||
      c.block_size <= 0) {
    return absl::InvalidArgumentError("LaunchPrefillAttention: needs head_dim 128 and GQA shape");
  }
  if (shape.sinks != nullptr || shape.sliding_window > 0) {
    return absl::InvalidArgumentError(
        "LaunchPrefillAttention: no sinks or sliding window (the decode kernel runs them)");
  }
  if (batch.num_tiles == 0) return absl::OkStatus();
  if (batch.tile_rows == kPrefillTileSm90) {
#if defined(RS_HAVE_SM90_PREFILL)
    if (batch.key_tile != 64 && batch.key_tile != 128) {
      return absl::InvalidArgumentError(
          absl::StrCat("LaunchPrefillAttention: key_tile must be 64 or 128, got ", batch.key_tile));
    }
    return LaunchPrefillAttentionSm90(shape, q, out, batch, stream);
#else
    return absl::InvalidArgumentError(
        "LaunchPrefillAttention: 128-query tiles need a build for sm_90 (the sm_90a kernel)");
#endif
  }
  if (batch.tile_rows != kPrefillTile) {
    return absl::InvalidArgumentError(absl::StrCat("LaunchPrefillAttention: tile_rows must be ",
                                                   kPrefillTile, " or ", kPrefillTileSm90, ", got ",
                                                   batch.tile_rows));
  }
  const PrefillArgs args{shape, q, out, batch};
  return c.k8 != nullptr ? LaunchPrefill<uint8_t>(args, stream) : LaunchPrefill<bf16>(args, stream);
}

}  // namespace ringserve::cuda
