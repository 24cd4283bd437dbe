// The skinny tensor-core GEMM (skinny_gemm.h).
//
// The block streams its 128 weight rows and the 8 NT token rows of x through a ring of kStages
// shared-memory stages of 64 k values with cp.async: each warp copies its own 32 rows (4 rows x
// 128 bytes per instruction, whole cache lines), the block the x rows; kStages - 1 stages are in
// flight and no registers wait on them. Rows are stored with their 16-byte units XOR-swizzled by
// row % 8, so the copies in and the fragment reads out are free of bank conflicts.
//
// Fragment layout (mma.sync m16n8k16, lane = 4 g + q): A holds rows g and g + 8 at k columns
// {2q, 2q + 1} (registers 0, 1) and {2q + 8, 2q + 9} (2, 3); B holds column g at the same k rows.
// Lane (g, q) reads the 8 consecutive k values [32 h + 8 q, 32 h + 8 q + 8) of its rows and of
// its tokens for each half h of a stage; words 0, 1 feed the first k16 step and words 2, 3 the
// second. Within each step A's k column 2q (+1) and B's k row 2q (+1) then name the same physical
// k, as do 2q + 8 (+9): the products summed are exactly those of the plain dot product.
#include <atomic>
#include <cstdint>

#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/mma_sync.cuh"
#include "kernels/cuda/skinny_gemm.h"

namespace ringserve::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kWarpRows = kSkinnyRowsPerBlock / kWarps;  // 32: two m16 tiles
constexpr int kStageK = kSkinnyStageK;                   // 128 bytes a row
constexpr int kStages = 4;
constexpr int kRowBytes = kStageK * 2;
constexpr int kMaxSplits = 64;

// A stage: the block's weight rows, then the x rows.
__host__ __device__ constexpr int StageBytes(int nt) {
  return (kSkinnyRowsPerBlock + 8 * nt) * kRowBytes;
}
__host__ __device__ constexpr int SmemBytes(int nt) { return kStages * StageBytes(nt); }

struct SkinnyArgs {
  const bf16* x;
  const bf16* w;
  void* y;
  float* partials;  // [splits][m][n]
  int* counters;    // [row blocks]
  int m, n, k, splits;
};

template <typename OutT>
__device__ __forceinline__ void Store(OutT* y, float v) {
  if constexpr (sizeof(OutT) == 4) {
    *y = v;
  } else {
    *y = __float2bfloat16(v);
  }
}

// Byte offset of row r's 16-byte unit j (of 8) in a block of 128-byte rows.
__device__ __forceinline__ int Swizzled(int r, int j) {
  return r * kRowBytes + ((j ^ (r & 7)) << 4);
}

// The last part of a row block to finish: y = the sum of the parts' partials, in part order.
template <typename OutT>
__device__ __forceinline__ void AddParts(const SkinnyArgs& a, int block_row) {
  constexpr int kPerThread = 4;  // independent sums per thread, their loads in flight together
  const int m = a.m, n = a.n, rows = min(kSkinnyRowsPerBlock, n - block_row);
  const int64_t part_stride = static_cast<int64_t>(m) * n;
  for (int i0 = threadIdx.x; i0 < m * kSkinnyRowsPerBlock; i0 += kPerThread * blockDim.x) {
    int64_t at[kPerThread];
    bool ok[kPerThread];
    float sum[kPerThread];
#pragma unroll
    for (int u = 0; u < kPerThread; ++u) {
      const int i = i0 + u * blockDim.x, token = i / kSkinnyRowsPerBlock;
      const int r = i % kSkinnyRowsPerBlock;
      ok[u] = i < m * kSkinnyRowsPerBlock && r < rows;
      at[u] = ok[u] ? static_cast<int64_t>(token) * n + block_row + r : 0;
      sum[u] = 0.0f;
    }
#pragma unroll 4
    for (int p = 0; p < a.splits; ++p) {
#pragma unroll
      for (int u = 0; u < kPerThread; ++u) sum[u] += __ldcg(a.partials + p * part_stride + at[u]);
    }
#pragma unroll
    for (int u = 0; u < kPerThread; ++u) {
      if (ok[u]) Store(static_cast<OutT*>(a.y) + at[u], sum[u]);
    }
  }
}

// NT: 8-token tiles held (m <= 8 NT).
template <int NT, typename OutT>
__global__ void __launch_bounds__(kWarps * 32) SkinnyGemmKernel(SkinnyArgs a) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, q = lane & 3;
  const int m = a.m, n = a.n, k = a.k;
  const int block_row = blockIdx.x * kSkinnyRowsPerBlock;
  const int warp_row = block_row + warp * kWarpRows;
  const int stages = (k + kStageK - 1) / kStageK;
  const int per_split = (stages + a.splits - 1) / a.splits;
  const int s0 = blockIdx.y * per_split, s1 = min(stages, s0 + per_split);
  const auto slot_at = [&](int s) { return smem + ((s - s0) % kStages) * StageBytes(NT); };

  // Stage s's weights: instruction i moves the warp's rows 4i .. 4i + 3, lane l unit l % 8 of
  // row 4i + l / 8. Past n or k: zeros.
  const int copy_row = lane >> 3, copy_unit = lane & 7;
  const auto copy_weights = [&](int s) {
    if (s >= s1) return;
    const int kk = s * kStageK + copy_unit * 8;
    unsigned char* dst = slot_at(s) + warp * kWarpRows * kRowBytes;
#pragma unroll
    for (int i = 0; i < kWarpRows / 4; ++i) {
      const int r = 4 * i + copy_row, row = warp_row + r;
      const bool ok = row < n && kk < k;
      CpAsync16(dst + Swizzled(r, copy_unit), a.w + (ok ? static_cast<int64_t>(row) * k + kk : 0),
                ok);
    }
  };
  // Stage s's x rows (8 NT, zeros past m or k), spread over the block's threads.
  const auto copy_x = [&](int s) {
    if (s >= s1) return;
    unsigned char* dst = slot_at(s) + kSkinnyRowsPerBlock * kRowBytes;
    for (int u = threadIdx.x; u < 64 * NT; u += blockDim.x) {
      const int r = u >> 3, j = u & 7, kk = s * kStageK + 8 * j;
      const bool ok = r < m && kk < k;
      CpAsync16(dst + Swizzled(r, j), a.x + (ok ? static_cast<int64_t>(r) * k + kk : 0), ok);
    }
  };
  // The weights of the first stages go before the wait (no kernel of the step writes them), x
  // after it. Group 0 then holds those weights and stage s0's x; every later group one stage.
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) copy_weights(s0 + i);
  WaitForPreviousKernel();
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    copy_x(s0 + i);
    CpAsyncCommit();  // empty groups past s1 keep the wait counts uniform
  }

  float acc[2][NT][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[mt][t][0] = acc[mt][t][1] = acc[mt][t][2] = acc[mt][t][3] = 0;
  }
  for (int s = s0; s < s1; ++s) {
    CpAsyncWait<kStages - 2>();
    __syncthreads();  // stage s landed for every thread; every warp is done with stage s - 1
    copy_weights(s + kStages - 1);
    copy_x(s + kStages - 1);
    CpAsyncCommit();
    const unsigned char* w_stage = slot_at(s) + warp * kWarpRows * kRowBytes;
    const unsigned char* x_stage = slot_at(s) + kSkinnyRowsPerBlock * kRowBytes;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int j = ((4 * h + q) ^ g) << 4;  // rows 16 mt + g (+ 8), 8 t + g: all g modulo 8
      uint4 xv[NT];
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        xv[t] = *reinterpret_cast<const uint4*>(x_stage + (8 * t + g) * kRowBytes + j);
      }
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const uint4 wa = *reinterpret_cast<const uint4*>(w_stage + (16 * mt + g) * kRowBytes + j);
        const uint4 wb =
            *reinterpret_cast<const uint4*>(w_stage + (16 * mt + g + 8) * kRowBytes + j);
        const uint32_t a0[4] = {wa.x, wb.x, wa.y, wb.y};
        const uint32_t a1[4] = {wa.z, wb.z, wa.w, wb.w};
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          Mma(acc[mt][t], a0, xv[t].x, xv[t].y);
          Mma(acc[mt][t], a1, xv[t].z, xv[t].w);
        }
      }
    }
  }
  CpAsyncWait<0>();  // no copy outlives the block (the empty groups)

  // acc[mt][t]: rows warp_row + 16 mt + g (+ 8 for i >= 2), tokens 8t + 2q (+ 1 for odd i).
  const auto for_each_output = [&](auto&& f) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
      for (int t = 0; t < NT; ++t) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int token = t * 8 + 2 * q + (i & 1);
          const int row = warp_row + 16 * mt + g + (i >= 2 ? 8 : 0);
          if (token < m && row < n) f(static_cast<int64_t>(token) * n + row, acc[mt][t][i]);
        }
      }
    }
  };
  if (a.splits == 1) {
    for_each_output([&](int64_t at, float v) { Store(static_cast<OutT*>(a.y) + at, v); });
    return;
  }
  float* part = a.partials + static_cast<int64_t>(blockIdx.y) * m * n;
  for_each_output([&](int64_t at, float v) { __stcg(part + at, v); });
  // The last part of this row block to finish adds all parts.
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomicAdd(a.counters + blockIdx.x, 1) == a.splits - 1;
    if (last) a.counters[blockIdx.x] = 0;  // for the next launch; no block of this one reads it
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  AddParts<OutT>(a, block_row);
}

// Over 48 KB of dynamic shared memory needs the opt-in, once per kernel and device (before any
// graph capture: Tune launches every variant first).
template <int NT, typename OutT>
void LaunchTiles(const SkinnyArgs& a, cudaStream_t stream) {
  static std::atomic<uint64_t> opted_in{0};
  int device = 0;
  cudaGetDevice(&device);
  const uint64_t bit = uint64_t{1} << (device & 63);
  if ((opted_in.load() & bit) == 0) {
    cudaFuncSetAttribute(SkinnyGemmKernel<NT, OutT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         SmemBytes(NT));
    opted_in.fetch_or(bit);
  }
  const dim3 grid((a.n + kSkinnyRowsPerBlock - 1) / kSkinnyRowsPerBlock, a.splits);
  LaunchDependent(SkinnyGemmKernel<NT, OutT>, grid, kWarps * 32, SmemBytes(NT), stream, a);
}

template <typename OutT>
void Launch(const SkinnyArgs& a, cudaStream_t stream) {
  if (a.m <= 8) {
    LaunchTiles<1, OutT>(a, stream);
  } else if (a.m <= 16) {
    LaunchTiles<2, OutT>(a, stream);
  } else if (a.m <= 32) {
    LaunchTiles<4, OutT>(a, stream);
  } else {
    LaunchTiles<8, OutT>(a, stream);
  }
}

}  // namespace

size_t SkinnyGemmPartialBytes(int m, int n, int splits) {
  return splits <= 1 ? 0 : static_cast<size_t>(splits) * m * n * sizeof(float);
}

int SkinnyGemmCounters(int n) { return (n + kSkinnyRowsPerBlock - 1) / kSkinnyRowsPerBlock; }

absl::Status LaunchSkinnyGemm(const bf16* x, const bf16* w, void* y, OutType out, int m, int n,
                              int k, int splits, float* partials, size_t partial_bytes,
                              int* counters, int num_counters, cudaStream_t stream) {
  if (m < 1 || m > kSkinnyMaxRows || n < 1 || k < 8 || k % 8 != 0 || splits < 1 ||
      splits > kMaxSplits) {
    return absl::InvalidArgumentError(
        "skinny GEMM: need 1 <= m <= 64, n >= 1, k a multiple of 8, 1 <= splits <= 64");
  }
  if (splits > 1 && (partials == nullptr || partial_bytes < SkinnyGemmPartialBytes(m, n, splits) ||
                     counters == nullptr || num_counters < SkinnyGemmCounters(n))) {
    return absl::InvalidArgumentError("skinny GEMM: partials or counters too small for the split");
  }
  const SkinnyArgs a{.x = x,
                     .w = w,
                     .y = y,
                     .partials = partials,
                     .counters = counters,
                     .m = m,
                     .n = n,
                     .k = k,
                     .splits = splits};
  if (out == OutType::kF32) {
    Launch<float>(a, stream);
  } else {
    Launch<bf16>(a, stream);
  }
  return LaunchStatus("SkinnyGemmKernel");
}

}  // namespace ringserve::cuda
