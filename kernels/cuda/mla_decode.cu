// Absorbed multi-head latent attention decode over the paged latent cache. See mla_decode.h.
#include <algorithm>
#include <cfloat>

#include "common/status_macros.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/mla_decode.h"
#include "kernels/cuda/mla_decode_sm90.h"
#include "kernels/cuda/mma_sync.cuh"

namespace ringserve::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kHeads = 16;                            // query heads per CTA: one mma row tile
constexpr int kKeys = 32;                             // keys per shared-memory tile
constexpr int kStages = 2;                            // tiles in flight
constexpr int kChunks = kMlaRowDim / 8;               // 16-byte chunks per cache row (72)
constexpr int kDimsPerWarp = kMlaLatentDim / kWarps;  // output dims per warp (128)
constexpr float kLog2e = 1.4426950408889634f;
static_assert(kKeys == 8 * kWarps, "each warp scores 8 keys of a tile");
constexpr int kThreadsPerKey = kThreads / kKeys;  // copy one key's cache row
static_assert(kThreads % kKeys == 0 && kChunks % kThreadsPerKey == 0);
static_assert(kChunks % 8 == 0, "the swizzle permutes chunks within groups of 8");

constexpr int kQElems = kHeads * kMlaRowDim;
constexpr int kTileElems = kKeys * kMlaRowDim;
constexpr int kPElems = kHeads * kKeys;
constexpr int kSmemBytes =
    (kQElems + kStages * kTileElems + kPElems) * 2 + 2 * kWarps * kHeads * sizeof(float);

using Args = MlaDecodeArgs;

// Element offset of chunk `chunk` of row `row` in a tile of kMlaRowDim-element rows, XOR-swizzled
// within groups of 8 chunks so that ldmatrix reads of 8 rows hit 8 different bank groups.
__device__ __forceinline__ int Swz(int row, int chunk) {
  return row * kMlaRowDim + ((chunk ^ (row & 7)) << 3);
}

// Grid: (16-head tile, entry, split); the head tiles of one entry and split are adjacent so they
// read the same cache rows from L2 at about the same time.
__global__ void __launch_bounds__(kThreads, 2) MlaDecodeMmaKernel(Args a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* const sq = reinterpret_cast<bf16*>(smem_raw);
  bf16* const sk = sq + kQElems;
  bf16* const sp = sk + kStages * kTileElems;
  float* const wmax = reinterpret_cast<float*>(sp + kPElems);  // [kWarps][kHeads]
  float* const wsum = wmax + kWarps * kHeads;                  // [kWarps][kHeads]

  const int tile = blockIdx.x, e = blockIdx.y, split = blockIdx.z;
  const int ctx = a.batch.context_lens[e];
  const int k_begin = split * a.batch.partition;
  if (k_begin >= ctx) return;
  const int k_end = min(ctx, k_begin + a.batch.partition);
  const int table_row = a.batch.table_rows != nullptr ? a.batch.table_rows[e] : e;
  const int32_t* table =
      a.batch.block_tables + static_cast<int64_t>(table_row) * a.batch.max_blocks;
  const MlaCacheLayer c = a.cache;
  const int head0 = tile * kHeads;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t4 = lane & 3;

  // kThreadsPerKey threads copy one key's row: each looks its block up once per tile and then
  // issues its 18 copies back to back (a block-table lookup before every 16-byte copy had made
  // the copies wait on one another: 5.1 against 2.7 ms for one layer at 32 x 32k on an H100).
  const auto load_tile = [&](int key0, int stage) {
    bf16* dst = sk + stage * kTileElems;
    const int r = threadIdx.x / kThreadsPerKey;
    const int key = key0 + r;
    const bool valid = key < k_end;
    int64_t row = 0;
    if (valid) {
      const int blk = key / c.block_size;
      row =
          table[blk] * c.block_stride + static_cast<int64_t>(key - blk * c.block_size) * kMlaRowDim;
    }
#pragma unroll
    for (int chunk = threadIdx.x % kThreadsPerKey; chunk < kChunks; chunk += kThreadsPerKey) {
      CpAsync16(dst + Swz(r, chunk), c.data + row + chunk * 8, valid);
    }
  };
  // Group 0: the query tile and key tile 0; group 1: key tile 1 (maybe empty).
  for (int i = threadIdx.x; i < kHeads * kChunks; i += kThreads) {
    const int r = i / kChunks, chunk = i - r * kChunks;
    const bool valid = head0 + r < a.num_heads;
    const bf16* src =
        valid ? a.q + (static_cast<int64_t>(e) * a.num_heads + head0 + r) * kMlaRowDim + chunk * 8
              : a.q;
    CpAsync16(sq + Swz(r, chunk), src, valid);
  }
  load_tile(k_begin, 0);
  CpAsyncCommit();
  if (k_begin + kKeys < k_end) load_tile(k_begin + kKeys, 1);
  CpAsyncCommit();

  float o[kDimsPerWarp / 8][4];
#pragma unroll
  for (int i = 0; i < kDimsPerWarp / 8; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) o[i][j] = 0.0f;
  }
  float m_row[2] = {-FLT_MAX, -FLT_MAX};  // rows g and g + 8, log2 units
  float l_row[2] = {0.0f, 0.0f};
  const float scale = a.scale * kLog2e;

  for (int j = 0; k_begin + j * kKeys < k_end; ++j) {
    const int key0 = k_begin + j * kKeys;
    const bf16* skt = sk + (j % kStages) * kTileElems;
    CpAsyncWait<1>();  // every group but the newest: tile j has landed
    __syncthreads();

    // Scores of this warp's 8 keys for the 16 heads: S = Q K^T over 576 dims.
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 6
    for (int kk = 0; kk < kChunks / 2; kk += 2) {
      uint32_t qa0[4], qa1[4], b[4];
      LdMatrixX4(qa0, sq + Swz(lane & 15, 2 * kk + (lane >> 4)));
      LdMatrixX4(qa1, sq + Swz(lane & 15, 2 * kk + 2 + (lane >> 4)));
      LdMatrixX4(b, skt + Swz(8 * warp + (lane & 7), 2 * kk + (lane >> 3)));
      Mma(s, qa0, b[0], b[1]);
      Mma(s, qa1, b[2], b[3]);
    }
    float tile_max[2];
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const int key = key0 + 8 * warp + 2 * t4 + (x & 1);
      s[x] = key < k_end ? s[x] * scale : -FLT_MAX;
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tile_max[r] = fmaxf(s[2 * r], s[2 * r + 1]);
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
      tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
      if (t4 == 0) wmax[warp * kHeads + g + 8 * r] = tile_max[r];
    }
    __syncthreads();

    // One online softmax for the CTA: every warp derives the same row maxima from wmax.
    float alpha[2], p[4];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float m_new = m_row[r];
#pragma unroll
      for (int w = 0; w < kWarps; ++w) m_new = fmaxf(m_new, wmax[w * kHeads + g + 8 * r]);
      alpha[r] = exp2f(m_row[r] - m_new);
      m_row[r] = m_new;
      p[2 * r] = exp2f(s[2 * r] - m_new);
      p[2 * r + 1] = exp2f(s[2 * r + 1] - m_new);
      float sum = p[2 * r] + p[2 * r + 1];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      if (t4 == 0) wsum[warp * kHeads + g + 8 * r] = sum;
    }
    *reinterpret_cast<uint32_t*>(sp + g * kKeys + 8 * warp + 2 * t4) = PackBF16(p[0], p[1]);
    *reinterpret_cast<uint32_t*>(sp + (g + 8) * kKeys + 8 * warp + 2 * t4) = PackBF16(p[2], p[3]);
    __syncthreads();
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) sum += wsum[w * kHeads + g + 8 * r];
      l_row[r] = l_row[r] * alpha[r] + sum;
    }

    // O (this warp's 128 dims) = alpha O + P V, V = the tile's latents.
#pragma unroll
    for (int nt = 0; nt < kDimsPerWarp / 8; ++nt) {
      o[nt][0] *= alpha[0];
      o[nt][1] *= alpha[0];
      o[nt][2] *= alpha[1];
      o[nt][3] *= alpha[1];
    }
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      uint32_t pa[4];
      LdMatrixX4(pa, sp + (lane & 15) * kKeys + (2 * kk + (lane >> 4)) * 8);
#pragma unroll
      for (int pp = 0; pp < kDimsPerWarp / 16; ++pp) {
        uint32_t b[4];
        LdMatrixX4Trans(b, skt + Swz(16 * kk + (((lane >> 3) & 1) << 3) + (lane & 7),
                                     (kDimsPerWarp / 8) * warp + 2 * pp + (lane >> 4)));
        Mma(o[2 * pp], pa, b[0], b[1]);
        Mma(o[2 * pp + 1], pa, b[2], b[3]);
      }
    }
    __syncthreads();  // the stage, P and the statistics are free again
    if (key0 + kStages * kKeys < k_end) load_tile(key0 + kStages * kKeys, j % kStages);
    CpAsyncCommit();
  }
  CpAsyncWait<0>();

  const int num_splits = gridDim.z;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int head = head0 + g + 8 * r;
    if (head >= a.num_heads) continue;
    const int64_t row = static_cast<int64_t>(e) * a.num_heads + head;
    if (num_splits == 1) {
      const float inv = 1.0f / l_row[r];
#pragma unroll
      for (int nt = 0; nt < kDimsPerWarp / 8; ++nt) {
        const int dim = kDimsPerWarp * warp + 8 * nt + 2 * t4;
        *reinterpret_cast<uint32_t*>(a.out + row * kMlaLatentDim + dim) =
            PackBF16(o[nt][2 * r] * inv, o[nt][2 * r + 1] * inv);
      }
    } else {
      const int64_t part = row * num_splits + split;
      float* dst = a.batch.workspace + part * kMlaLatentDim;
#pragma unroll
      for (int nt = 0; nt < kDimsPerWarp / 8; ++nt) {
        const int dim = kDimsPerWarp * warp + 8 * nt + 2 * t4;
        *reinterpret_cast<float2*>(dst + dim) = make_float2(o[nt][2 * r], o[nt][2 * r + 1]);
      }
      if (warp == 0 && t4 == 0) {
        float* ml = a.batch.workspace + static_cast<int64_t>(a.batch.num_entries) * a.num_heads *
                                            num_splits * kMlaLatentDim;
        ml[2 * part] = m_row[r];
        ml[2 * part + 1] = l_row[r];
      }
    }
  }
}

// One CTA per (entry, head): merges the splits that hold keys into the normalized output.
__global__ void __launch_bounds__(kThreads) MlaMergeKernel(Args a) {
  const int e = blockIdx.x / a.num_heads;
  const int ctx = a.batch.context_lens[e];
  if (ctx <= 0) return;
  const int S = a.batch.num_splits;
  const int used = min(S, (ctx + a.batch.partition - 1) / a.batch.partition);
  const int64_t row = blockIdx.x;
  const float* ml = a.batch.workspace +
                    static_cast<int64_t>(a.batch.num_entries) * a.num_heads * S * kMlaLatentDim;
  float mx = -FLT_MAX;
  for (int s = 0; s < used; ++s) mx = fmaxf(mx, ml[2 * (row * S + s)]);
  float sum = 0.0f;
  float acc[kMlaLatentDim / kThreads] = {};
  for (int s = 0; s < used; ++s) {
    const float f = exp2f(ml[2 * (row * S + s)] - mx);
    sum += f * ml[2 * (row * S + s) + 1];
    const float* part = a.batch.workspace + (row * S + s) * kMlaLatentDim;
#pragma unroll
    for (int i = 0; i < kMlaLatentDim / kThreads; ++i)
      acc[i] += f * part[threadIdx.x + i * kThreads];
  }
#pragma unroll
  for (int i = 0; i < kMlaLatentDim / kThreads; ++i) {
    a.out[row * kMlaLatentDim + threadIdx.x + i * kThreads] = __float2bfloat16(acc[i] / sum);
  }
}

}  // namespace

int64_t MlaDecodeWorkspaceFloats(int num_entries, int num_heads, int num_splits) {
  if (num_splits <= 1) return 0;
  return static_cast<int64_t>(num_entries) * num_heads * num_splits * (kMlaLatentDim + 2);
}

MlaDecodeKernel MlaDecodeKernelFor(MlaDecodeKernel planned, int num_heads) {
  return num_heads >= kMlaHeadsSm90 ? planned : MlaDecodeKernel::kMmaSync;
}

namespace {

// At least this many keys per split, so the merge and each CTA's start stay small against its
// work. (512 for the wgmma kernel left an H100 at 1 stream and 4k context with 16 CTAs: 36.6 us
// a layer against 24.9 for mma.sync's 64 CTAs.)
constexpr int kMinSplitKeys = 256;

MlaSplitPlan SplitsOf(int max_context, int splits, int key_multiple) {
  int partition = (max_context + splits - 1) / splits;
  partition = std::max(key_multiple, (partition + key_multiple - 1) / key_multiple * key_multiple);
  return {.num_splits = std::max(1, (max_context + partition - 1) / partition),
          .partition = partition};
}

// The wgmma kernel holds one CTA an SM: the split count whose waves finish soonest, a CTA
// costing its keys plus ~2 tiles of start (the query tile, the pipeline's fill).
MlaSplitPlan PlanWgmmaSplits(int num_entries, int num_heads, int max_context, int num_sms) {
  const int64_t ctas =
      static_cast<int64_t>(num_entries) * ((num_heads + kMlaHeadsSm90 - 1) / kMlaHeadsSm90);
  const int most = std::max(1, (max_context + kMinSplitKeys - 1) / kMinSplitKeys);
  MlaSplitPlan best = SplitsOf(max_context, 1, 64);
  double best_cost = 0.0;
  for (int s = 1; s <= most; ++s) {
    // The splits a count of s becomes once the partition is rounded to whole tiles.
    const MlaSplitPlan plan = SplitsOf(max_context, s, 64);
    if (plan.num_splits > 1 && static_cast<int64_t>(num_entries) * plan.num_splits * num_heads >
                                   static_cast<int64_t>(kMlaWorkspaceRowsPerSm) * num_sms) {
      break;
    }
    const int64_t waves = (ctas * plan.num_splits + num_sms - 1) / num_sms;
    const double cost = static_cast<double>(waves) * (plan.partition + 128.0);
    if (s == 1 || cost < best_cost) {
      best = plan;
      best_cost = cost;
    }
  }
  return best;
}

}  // namespace

MlaSplitPlan PlanMlaDecodeSplits(int num_entries, int num_heads, int max_context, int num_sms,
                                 MlaDecodeKernel kernel) {
  max_context = std::max(1, max_context);
  num_sms = std::max(1, num_sms);
  if (MlaDecodeKernelFor(kernel, num_heads) == MlaDecodeKernel::kWgmmaSm90) {
    return PlanWgmmaSplits(num_entries, num_heads, max_context, num_sms);
  }
  const int tiles = (num_heads + kHeads - 1) / kHeads;
  const int ctas = std::max(1, num_entries * tiles);
  const int want = std::max(1, (2 * num_sms + ctas - 1) / ctas);
  const int most = std::max(1, (max_context + kMinSplitKeys - 1) / kMinSplitKeys);
  return SplitsOf(max_context, std::min(want, most), kKeys);
}

absl::Status LaunchMlaDecode(int num_heads, float scale, const MlaCacheLayer& cache, const bf16* q,
                             bf16* out, const MlaDecodeBatch& batch, cudaStream_t stream) {
  if (num_heads < 1 || cache.block_size < 1 || batch.partition < kKeys ||
      batch.partition % kKeys != 0 || batch.num_splits < 1 ||
      (batch.num_splits > 1 && batch.workspace == nullptr)) {
    return absl::InvalidArgumentError(
        "LaunchMlaDecode: needs num_heads >= 1, block_size >= 1, a partition that is a positive "
        "multiple of 32 and, with splits, a workspace");
  }
  const bool wgmma = batch.kernel == MlaDecodeKernel::kWgmmaSm90;
  if (wgmma && num_heads < kMlaHeadsSm90) {
    return absl::InvalidArgumentError(
        "LaunchMlaDecode: the wgmma kernel needs at least 64 heads (MlaDecodeKernelFor)");
  }
  if (batch.num_entries == 0) return absl::OkStatus();
  const Args args{num_heads, scale, cache, q, out, batch};
  if (wgmma) {
#if defined(RS_HAVE_SM90_PREFILL)
    RS_RETURN_IF_ERROR(LaunchMlaDecodeSm90(args, stream));
#else
    return absl::InvalidArgumentError(
        "LaunchMlaDecode: the wgmma kernel needs a build for sm_90 (its sm_90a code)");
#endif
  } else {
    static const cudaError_t attribute_error = cudaFuncSetAttribute(
        MlaDecodeMmaKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
    RS_CUDA_RETURN_IF_ERROR(attribute_error);
    const dim3 grid((num_heads + kHeads - 1) / kHeads, batch.num_entries, batch.num_splits);
    MlaDecodeMmaKernel<<<grid, kThreads, kSmemBytes, stream>>>(args);
    RS_RETURN_IF_ERROR(LaunchStatus("MlaDecodeMmaKernel"));
  }
  if (batch.num_splits > 1) {
    MlaMergeKernel<<<batch.num_entries * num_heads, kThreads, 0, stream>>>(args);
    RS_RETURN_IF_ERROR(LaunchStatus("MlaMergeKernel"));
  }
  return absl::OkStatus();
}

}  // namespace ringserve::cuda
