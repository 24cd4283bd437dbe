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
#include <cooperative_groups.h>

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
constexpr int kStages = 3;  // 2 stages in flight; 3 blocks a multiprocessor up to NT = 4
constexpr int kRowBytes = kStageK * 2;

// A stage: the block's weight rows, then the x rows.
__host__ __device__ constexpr int StageBytes(int nt) {
  return (kSkinnyRowsPerBlock + 8 * nt) * kRowBytes;
}
__host__ __device__ constexpr int SmemBytes(int nt) { return kStages * StageBytes(nt); }

struct SkinnyArgs {
  const bf16* x;
  const bf16* w;
  void* y;
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

// CpAsync16 to a shared-window address (no conversion per copy).
__device__ __forceinline__ void CpAsync16Shared(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0));
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

  // The copy plan, fixed across stages (only k moves): lane l copies unit l % 8 of the warp's
  // rows 4i + l / 8 (i < 8; 4 rows x 128 bytes per instruction) and, spread over the block, x
  // rows tid / 8 + 16 v (v < NT / 2, at least 1) unit tid % 8. Rows past n or m copy zeros.
  const int copy_row = lane >> 3, copy_unit = lane & 7;
  const bf16* w_src[kWarpRows / 4];
  uint32_t w_ok = 0;
#pragma unroll
  for (int i = 0; i < kWarpRows / 4; ++i) {
    const int row = warp_row + 4 * i + copy_row;
    w_src[i] = a.w + (row < n ? static_cast<int64_t>(row) * k : 0) + copy_unit * 8;
    w_ok |= (row < n ? 1u : 0u) << i;
  }
  // Rows 4i + copy_row are copy_row + 4 (i % 2) modulo 8: two swizzled unit offsets.
  const int w_dst = warp * kWarpRows * kRowBytes + copy_row * kRowBytes;
  const int w_unit[2] = {(copy_unit ^ copy_row) << 4, (copy_unit ^ (copy_row + 4)) << 4};
  constexpr int kXCopies = NT >= 2 ? NT / 2 : 1;
  const int x_row = threadIdx.x >> 3, x_unit = threadIdx.x & 7;
  const bf16* x_src = a.x + static_cast<int64_t>(x_row) * k + x_unit * 8;
  const int x_dst = kSkinnyRowsPerBlock * kRowBytes + x_row * kRowBytes +
                    ((x_unit ^ (x_row & 7)) << 4);  // rows x_row + 16 v: the same modulo 8
  const uint32_t ring = SmemAddr(smem);

  // Stage s into ring slot `slot`; past s1 nothing.
  const auto copy_weights = [&](int s, int slot) {
    if (s >= s1) return;
    const int kk = s * kStageK;
    const bool k_ok = kk + copy_unit * 8 < k;
    const uint32_t dst = ring + slot * StageBytes(NT) + w_dst;
#pragma unroll
    for (int i = 0; i < kWarpRows / 4; ++i) {
      const bool ok = k_ok && (w_ok >> i & 1u);
      CpAsync16Shared(dst + 4 * i * kRowBytes + w_unit[i & 1], ok ? w_src[i] + kk : a.w, ok);
    }
  };
  const auto copy_x = [&](int s, int slot) {
    if (s >= s1) return;
    const int kk = s * kStageK;
    const bool k_ok = kk + x_unit * 8 < k;
    const uint32_t dst = ring + slot * StageBytes(NT) + x_dst;
#pragma unroll
    for (int v = 0; v < kXCopies; ++v) {
      if (x_row + 16 * v >= 8 * NT) break;  // NT = 1: threads 64.. copy nothing
      const bool ok = k_ok && x_row + 16 * v < m;
      CpAsync16Shared(dst + 16 * v * kRowBytes,
                      ok ? x_src + static_cast<int64_t>(16 * v) * k + kk : a.x, ok);
    }
  };
  // The weights of the first stages go before the wait (no kernel of the step writes them), x
  // after it. Group 0 then holds those weights and stage s0's x; every later group one stage.
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) copy_weights(s0 + i, i);
  WaitForPreviousKernel();
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    copy_x(s0 + i, i);
    CpAsyncCommit();  // empty groups past s1 keep the wait counts uniform
  }

  float acc[2][NT][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[mt][t][0] = acc[mt][t][1] = acc[mt][t][2] = acc[mt][t][3] = 0;
  }
  int read_slot = 0, write_slot = kStages - 1;
  for (int s = s0; s < s1; ++s) {
    CpAsyncWait<kStages - 2>();
    __syncthreads();  // stage s landed for every thread; every warp is done with stage s - 1
    copy_weights(s + kStages - 1, write_slot);
    copy_x(s + kStages - 1, write_slot);
    CpAsyncCommit();
    write_slot = write_slot == kStages - 1 ? 0 : write_slot + 1;
    const unsigned char* slot = smem + read_slot * StageBytes(NT);
    read_slot = read_slot == kStages - 1 ? 0 : read_slot + 1;
    const unsigned char* w_stage = slot + warp * kWarpRows * kRowBytes;
    const unsigned char* x_stage = slot + kSkinnyRowsPerBlock * kRowBytes;
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

  // acc[mt][t][i]: token 8t + 2q (+ 1 for odd i) of the block's row 32 warp + 16 mt + g (+ 8 for
  // i >= 2).
  const auto for_each_acc = [&](auto&& f) {
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
      for (int t = 0; t < NT; ++t) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          f(t * 8 + 2 * q + (i & 1), warp * kWarpRows + 16 * mt + g + (i >= 2 ? 8 : 0),
            acc[mt][t][i]);
        }
      }
    }
  };
  if (a.splits == 1) {
    for_each_acc([&](int token, int r, float v) {
      const int row = block_row + r;
      if (token < m && row < n) Store(static_cast<OutT*>(a.y) + int64_t{token} * n + row, v);
    });
    return;
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // clusters (the host refuses splits > 1 below)
  // The parts of a row block form a cluster: each puts its partial sums in its shared memory
  // ([8 NT tokens][128 rows], over the ring: every copy landed above), then adds 1 / splits of
  // the tile over all parts' shared memory, in part order.
  __syncthreads();
  float* tile = reinterpret_cast<float*>(smem);
  for_each_acc([&](int token, int r, float v) { tile[token * kSkinnyRowsPerBlock + r] = v; });
  cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  cluster.sync();
  const int elems = m * kSkinnyRowsPerBlock;
  const int per_part = (elems + a.splits - 1) / a.splits;
  const int e0 = static_cast<int>(cluster.block_rank()) * per_part;
  const int e1 = min(elems, e0 + per_part);
  for (int e = e0 + threadIdx.x; e < e1; e += blockDim.x) {
    const int token = e / kSkinnyRowsPerBlock, row = block_row + e % kSkinnyRowsPerBlock;
    float sum = 0.0f;
#pragma unroll 8
    for (int p = 0; p < a.splits; ++p) sum += cluster.map_shared_rank(tile, p)[e];
    if (row < n) Store(static_cast<OutT*>(a.y) + static_cast<int64_t>(token) * n + row, sum);
  }
  cluster.sync();  // every part's tile stays until all have read it
#endif
}

// Over 48 KB of dynamic shared memory needs the opt-in, once per kernel and device (before any
// graph capture: Tune launches every variant first).
template <int NT, typename OutT>
void LaunchTiles(const SkinnyArgs& a, int device, cudaStream_t stream) {
  static std::atomic<uint64_t> opted_in{0};
  const uint64_t bit = uint64_t{1} << (device & 63);
  if ((opted_in.load() & bit) == 0) {
    cudaFuncSetAttribute(SkinnyGemmKernel<NT, OutT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         SmemBytes(NT));
    opted_in.fetch_or(bit);
  }
  // One cluster per row block: its `splits` parts (cudaLaunchKernelEx, as LaunchDependent, plus
  // the cluster shape).
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3((a.n + kSkinnyRowsPerBlock - 1) / kSkinnyRowsPerBlock, a.splits);
  config.blockDim = dim3(kWarps * 32);
  config.dynamicSmemBytes = SmemBytes(NT);
  config.stream = stream;
  cudaLaunchAttribute attributes[2];
  attributes[0].id = cudaLaunchAttributeClusterDimension;
  attributes[0].val.clusterDim.x = 1;
  attributes[0].val.clusterDim.y = a.splits;
  attributes[0].val.clusterDim.z = 1;
  attributes[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[1].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attributes;
  config.numAttrs = DependentLaunchEnabled() ? 2 : 1;
  cudaLaunchKernelEx(&config, SkinnyGemmKernel<NT, OutT>, a);
}

template <typename OutT>
void Launch(const SkinnyArgs& a, int device, cudaStream_t stream) {
  if (a.m <= 8) {
    LaunchTiles<1, OutT>(a, device, stream);
  } else if (a.m <= 16) {
    LaunchTiles<2, OutT>(a, device, stream);
  } else if (a.m <= 32) {
    LaunchTiles<4, OutT>(a, device, stream);
  } else {
    LaunchTiles<8, OutT>(a, device, stream);
  }
}

}  // namespace

absl::Status LaunchSkinnyGemm(const bf16* x, const bf16* w, void* y, OutType out, int m, int n,
                              int k, int splits, cudaStream_t stream) {
  if (m < 1 || m > kSkinnyMaxRows || n < 1 || k < 8 || k % 8 != 0 || splits < 1 ||
      splits > kSkinnyMaxSplits) {
    return absl::InvalidArgumentError(
        "skinny GEMM: need 1 <= m <= 64, n >= 1, k a multiple of 8, 1 <= splits <= 8");
  }
  int device = 0;
  RS_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  if (splits > 1) {
    int major = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    if (major < 9) {
      return absl::InvalidArgumentError(
          "skinny GEMM: splits > 1 need thread-block clusters (sm_90)");
    }
  }
  const SkinnyArgs a{.x = x, .w = w, .y = y, .m = m, .n = n, .k = k, .splits = splits};
  if (out == OutType::kF32) {
    Launch<float>(a, device, stream);
  } else {
    Launch<bf16>(a, device, stream);
  }
  return LaunchStatus("SkinnyGemmKernel");
}

}  // namespace ringserve::cuda
