// The grouped expert projections of a MoE layer (moe.h): a CUDA-core GEMV that streams the
// weights of the groups in use (decode), a tensor-core GEMM over a device-built tile list
// (prefill), the expert activation, and the load-time unstacking of gpt-oss's experts.
#include <mma.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>

#include "common/status_macros.h"
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/device_info.h"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/moe_device.cuh"
#include "kernels/cuda/moe_gemm_sm90.h"

namespace ringserve::cuda {
namespace {

// ---- Grouped GEMV ----

constexpr int kGemvWarps = 4;
constexpr int kColsPerWarp = 2;
constexpr int kGemvCols = kGemvWarps * kColsPerWarp;  // output columns per block

// Block (column block, group): warps own kColsPerWarp output columns each (with an activation,
// their gate and up rows). For each kChunk rows of the group the warp streams its weight rows once
// (16-byte loads, the next vector in flight while the current one is used) and dots them with
// the rows' inputs (read through L1).
template <bool kVec, bool kGated, int kChunk>
__global__ void __launch_bounds__(kGemvWarps * 32) GroupedGemvKernel(MoeGroupedLinear a) {
  WaitForPreviousKernel();
  int g, begin, end;
  if (!MoeGemvGroupRows(a, &g, &begin, &end)) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int col0 = blockIdx.x * kGemvCols + warp * kColsPerWarp;
  if (col0 >= a.n) return;
  constexpr int P = kGated ? 2 : 1;
  constexpr int R = kColsPerWarp * P;  // weight rows of the warp
  const int n = a.n, k = a.k;
  const bf16* wg = a.w + static_cast<int64_t>(g) * P * n * k;
  const bf16* wrow[R];
#pragma unroll
  for (int c = 0; c < kColsPerWarp; ++c) {
#pragma unroll
    for (int p = 0; p < P; ++p) {
      wrow[c * P + p] = wg + (static_cast<int64_t>(p) * n + min(col0 + c, n - 1)) * k;
    }
  }
  for (int r0 = begin; r0 < end; r0 += kChunk) {
    const int nt = min(kChunk, end - r0);
    const bf16* xr[kChunk];
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      const int r = min(r0 + i, end - 1);
      const int src = a.row_token != nullptr ? a.row_token[r] : r;
      xr[i] = a.x + static_cast<int64_t>(src) * k;
    }
    float acc[R][kChunk];
#pragma unroll
    for (int q = 0; q < R; ++q) {
#pragma unroll
      for (int i = 0; i < kChunk; ++i) acc[q][i] = 0.0f;
    }
    if constexpr (kVec) {
      const int vecs = k / 8;
      uint4 wv[R], wn[R];
#pragma unroll
      for (int q = 0; q < R; ++q) wn[q] = wv[q] = make_uint4(0, 0, 0, 0);
      if (lane < vecs) {
#pragma unroll
        for (int q = 0; q < R; ++q) wv[q] = LoadStreaming(wrow[q] + lane * 8);
      }
      for (int v = lane; v < vecs; v += 32) {
        if (v + 32 < vecs) {
#pragma unroll
          for (int q = 0; q < R; ++q) wn[q] = LoadStreaming(wrow[q] + (v + 32) * 8);
        }
        float wf[R][8];
#pragma unroll
        for (int q = 0; q < R; ++q) Unpack8(wv[q], wf[q]);
#pragma unroll
        for (int i = 0; i < kChunk; ++i) {
          if (i >= nt) break;
          float xf[8];
          Unpack8(__ldg(reinterpret_cast<const uint4*>(xr[i]) + v), xf);
#pragma unroll
          for (int q = 0; q < R; ++q) {
#pragma unroll
            for (int j = 0; j < 8; ++j) acc[q][i] = fmaf(wf[q][j], xf[j], acc[q][i]);
          }
        }
#pragma unroll
        for (int q = 0; q < R; ++q) wv[q] = wn[q];
      }
    } else {
      for (int kk = lane; kk < k; kk += 32) {
        float wf[R];
#pragma unroll
        for (int q = 0; q < R; ++q) wf[q] = __bfloat162float(wrow[q][kk]);
#pragma unroll
        for (int i = 0; i < kChunk; ++i) {
          if (i >= nt) break;
          const float xf = __bfloat162float(xr[i][kk]);
#pragma unroll
          for (int q = 0; q < R; ++q) acc[q][i] = fmaf(wf[q], xf, acc[q][i]);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kChunk; ++i) {
      if (i >= nt) break;
#pragma unroll
      for (int c = 0; c < kColsPerWarp; ++c) {
        const int col = col0 + c;
        const float s0 = WarpSum(acc[c * P][i]);
        const float s1 = kGated ? WarpSum(acc[c * P + P - 1][i]) : 0.0f;
        if (lane != 0 || col >= n) continue;
        StoreGroupedGemvOutput<kGated>(a, g, r0 + i, col, s0, s1);
      }
    }
  }
}

// ---- Grouped tensor-core GEMM ----

constexpr int kBM = kMoeTileRows, kBN = 128, kBK = 32, kLds = kBK + 8, kStages = 3;
constexpr int kGemmThreads = 256;
constexpr int kStageElems = (kBM + kBN) * kLds;
constexpr int kLdc = kBN + 4;
constexpr int kPipeBytes = kStages * kStageElems * 2;
constexpr int kEpilogueBytes = kBM * kLdc * 4;
constexpr int kGemmSmem = kPipeBytes > kEpilogueBytes ? kPipeBytes : kEpilogueBytes;

// CTA (tile, column block): a 128-row tile of one group (rows gathered through row_token) times
// 128 output columns of the group's weight, 8 warps of 64x32 (WMMA 16x16x16 bf16, fp32
// accumulators), K in steps of 32 through a 3-stage cp.async pipeline; the accumulators go
// through shared memory so the stores are row-contiguous and bounds-checked.
__global__ void __launch_bounds__(kGemmThreads)
    GroupedGemmKernel(MoeGroupedLinear a, const int32_t* tiles, const int32_t* num_tiles) {
  using namespace nvcuda;
  WaitForPreviousKernel();
  extern __shared__ __align__(128) unsigned char smem[];
  MoeGemmTile tile;
  if (!MoeGemmTileOf(a, tiles, num_tiles, kBM, tile)) return;
  const int g = tile.group, m0 = tile.m0, end = tile.end;
  const int n0 = blockIdx.y * kBN;
  const int n = a.n, k = a.k;
  const bf16* w = a.w + static_cast<int64_t>(g - a.group_begin) * n * k;
  const int tid = threadIdx.x, warp = tid >> 5;
  bf16* pipe = reinterpret_cast<bf16*>(smem);

  // Each thread copies 2 16-byte chunks of A and 2 of B per stage.
  const bf16* a_src[2];
  const bf16* b_src[2];
  bool a_ok[2], b_ok[2];
  int a_dst[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int c = tid + i * kGemmThreads;
    const int row = c >> 2, kc = (c & 3) * 8;
    const int r = m0 + row;
    a_ok[i] = r < end;
    const int src = a_ok[i] ? (a.row_token != nullptr ? a.row_token[r] : r) : 0;
    a_src[i] = a.x + static_cast<int64_t>(src) * k + kc;
    b_ok[i] = n0 + row < n;
    b_src[i] = w + static_cast<int64_t>(b_ok[i] ? n0 + row : 0) * k + kc;
    a_dst[i] = row * kLds + kc;
  }
  const int k_tiles = (k + kBK - 1) / kBK;
  const auto load = [&](int stage, int kt) {
    bf16* sa = pipe + stage * kStageElems;
    bf16* sb = sa + kBM * kLds;
    const int k0 = kt * kBK;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int kc = a_dst[i] % kLds;
      const bool in_k = k0 + kc < k;
      CpAsync16(sa + a_dst[i], in_k && a_ok[i] ? a_src[i] + k0 : a.x, in_k && a_ok[i]);
      CpAsync16(sb + a_dst[i], in_k && b_ok[i] ? b_src[i] + k0 : a.w, in_k && b_ok[i]);
    }
  };

  const int wm = (warp >> 2) * 64, wn = (warp & 3) * 32;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[4][2];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
  }
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) load(s, s);
    CpAsyncCommit();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    CpAsyncWait<kStages - 2>();
    __syncthreads();
    const int next = kt + kStages - 1;
    if (next < k_tiles) load(next % kStages, next);
    CpAsyncCommit();
    const bf16* sa = pipe + (kt % kStages) * kStageElems;
    const bf16* sb = sa + kBM * kLds;
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa[4];
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fb[2];
#pragma unroll
      for (int i = 0; i < 4; ++i)
        wmma::load_matrix_sync(fa[i], sa + (wm + i * 16) * kLds + kk, kLds);
#pragma unroll
      for (int j = 0; j < 2; ++j)
        wmma::load_matrix_sync(fb[j], sb + (wn + j * 16) * kLds + kk, kLds);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
      }
    }
  }
  CpAsyncWait<0>();
  __syncthreads();
  float* sc = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      wmma::store_matrix_sync(sc + (wm + i * 16) * kLdc + wn + j * 16, acc[i][j], kLdc,
                              wmma::mem_row_major);
    }
  }
  __syncthreads();
  const bf16* bias = a.bias != nullptr ? a.bias + static_cast<int64_t>(g) * n : nullptr;
  for (int idx = tid; idx < kBM * kBN; idx += kGemmThreads) {
    const int r = idx / kBN, c = idx % kBN;
    const int row = m0 + r, col = n0 + c;
    if (row >= end || col >= n) continue;
    const float v = sc[r * kLdc + c] + (bias ? __bfloat162float(bias[col]) : 0.0f);
    const int64_t at = static_cast<int64_t>(row) * n + col;
    if (a.out_f32) {
      static_cast<float*>(a.out)[at] = v;
    } else {
      static_cast<bf16*>(a.out)[at] = __float2bfloat16(v);
    }
  }
}

__global__ void ActivationKernel(const bf16* __restrict__ gate_up, bf16* __restrict__ act,
                                 int64_t rows, int n, MoeActivationParams p) {
  WaitForPreviousKernel();
  const int64_t total = rows * n;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / n;
    const int c = static_cast<int>(i - r * n);
    const float g = __bfloat162float(gate_up[r * 2 * n + c]);
    const float u = __bfloat162float(gate_up[r * 2 * n + n + c]);
    act[i] = __float2bfloat16(MoeActivate(p, g, u));
  }
}

// dst[e, c, h] = src[e, h, 2c] (c < inter) or src[e, h, 2(c - inter) + 1].
__global__ void UnstackGateUpKernel(const bf16* src, bf16* dst, int experts, int hidden,
                                    int inter) {
  const int64_t total = static_cast<int64_t>(experts) * 2 * inter * hidden;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t h = i % hidden;
    const int64_t c = (i / hidden) % (2 * inter);
    const int64_t e = i / (static_cast<int64_t>(hidden) * 2 * inter);
    const int64_t col = c < inter ? 2 * c : 2 * (c - inter) + 1;
    dst[i] = src[(e * hidden + h) * 2 * inter + col];
  }
}

__global__ void UnstackGateUpBiasKernel(const bf16* src, bf16* dst, int experts, int inter) {
  const int64_t total = static_cast<int64_t>(experts) * 2 * inter;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = i % (2 * inter), e = i / (2 * inter);
    dst[i] = src[e * 2 * inter + (c < inter ? 2 * c : 2 * (c - inter) + 1)];
  }
}

// dst[e, h, i] = src[e, i, h].
__global__ void TransposeDownKernel(const bf16* src, bf16* dst, int experts, int inter,
                                    int hidden) {
  const int64_t total = static_cast<int64_t>(experts) * inter * hidden;
  for (int64_t x = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; x < total;
       x += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = x % inter;
    const int64_t h = (x / inter) % hidden;
    const int64_t e = x / (static_cast<int64_t>(inter) * hidden);
    dst[x] = src[(e * inter + i) * hidden + h];
  }
}

unsigned GridFor(int64_t n) {
  const int64_t blocks = (n + 255) / 256;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > 65536 ? 65536 : blocks));
}

}  // namespace

absl::Status SetRouteSmallKernelSmem();  // moe_routing.cu

absl::Status PrepareMoeKernels() {
  static std::atomic<uint64_t> configured{0};  // bit d: device d done
  int device = 0;
  RS_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
  if (bit != 0 && (configured.load() & bit)) return absl::OkStatus();
  RS_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
      GroupedGemmKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kGemmSmem));
  RS_RETURN_IF_ERROR(SetRouteSmallKernelSmem());
#if defined(RS_HAVE_SM90_PREFILL)
  RS_ASSIGN_OR_RETURN(const DeviceInfo info, QueryDeviceInfo(device));
  if (info.compute_capability == 90) RS_RETURN_IF_ERROR(PrepareMoeGroupedGemmSm90());
#endif
  configured.fetch_or(bit);
  return absl::OkStatus();
}

namespace {
template <int kChunk>
void LaunchGroupedGemv(const MoeGroupedLinear& a, dim3 grid, bool vec, bool gated,
                       LaunchStream stream) {
  if (vec && gated) {
    LaunchDependent(GroupedGemvKernel<true, true, kChunk>, grid, kGemvWarps * 32, 0, stream, a);
  } else if (vec) {
    LaunchDependent(GroupedGemvKernel<true, false, kChunk>, grid, kGemvWarps * 32, 0, stream, a);
  } else if (gated) {
    LaunchDependent(GroupedGemvKernel<false, true, kChunk>, grid, kGemvWarps * 32, 0, stream, a);
  } else {
    LaunchDependent(GroupedGemvKernel<false, false, kChunk>, grid, kGemvWarps * 32, 0, stream, a);
  }
}
}  // namespace

int MoeGemvRowChunk(int max_group_rows, bool quantized) {
  if (max_group_rows == 1) return 1;
  static const int forced = [] {
    const char* env = std::getenv("RINGSERVE_MOE_GEMV_ROWS");
    const int v = env != nullptr ? std::atoi(env) : 0;
    return v == 1 || v == 2 || v == 4 || v == 8 ? v : 0;
  }();
  if (forced != 0) return forced;
  if (quantized) return 1;
  if (max_group_rows == 2) return 2;
  return max_group_rows >= 1 && max_group_rows <= 32 ? 4 : 8;
}

absl::Status LaunchMoeGroupedGemv(const MoeGroupedLinear& a, LaunchStream stream) {
  if (a.n <= 0 || a.k <= 0 || a.groups < 1 || (a.offsets == nullptr && a.groups != 1) ||
      a.rows < 0 || (a.act.kind != MoeActivation::kNone && a.out_f32) ||
      (a.active != nullptr && a.offsets == nullptr)) {
    return absl::InvalidArgumentError("LaunchMoeGroupedGemv: bad arguments");
  }
  if (a.offsets == nullptr && a.rows == 0) return absl::OkStatus();
  const int group_rows =
      a.active != nullptr && a.max_active > 0 ? std::min(a.groups, a.max_active) : a.groups;
  const dim3 grid((a.n + kGemvCols - 1) / kGemvCols, group_rows);
  const bool vec = a.k % 8 == 0;
  const bool gated = a.act.kind != MoeActivation::kNone;
  WithRowChunk(MoeGemvRowChunk(a.max_group_rows, /*quantized=*/false), [&](auto rows) {
    LaunchGroupedGemv<decltype(rows)::value>(a, grid, vec, gated, stream);
  });
  return LaunchStatus("GroupedGemvKernel");
}

absl::Status LaunchMoeGroupedGemm(const MoeGroupedLinear& a, const int32_t* tiles,
                                  const int32_t* num_tiles, int max_tiles, LaunchStream stream) {
  if (a.n <= 0 || a.k <= 0 || a.k % 8 != 0 || a.act.kind != MoeActivation::kNone ||
      (tiles == nullptr) != (a.offsets == nullptr) || (tiles != nullptr && num_tiles == nullptr) ||
      a.rows < 0 || max_tiles < 0 || a.group_begin < 0 ||
      (a.group_end >= 0 && a.group_end < a.group_begin) ||
      (tiles == nullptr && a.group_begin != 0)) {
    return absl::InvalidArgumentError(
        "LaunchMoeGroupedGemm: bad arguments (k % 8 == 0, no activation, tiles with offsets)");
  }
  const int grid_tiles = tiles != nullptr ? max_tiles : (a.rows + kBM - 1) / kBM;
  if (grid_tiles == 0) return absl::OkStatus();
  RS_RETURN_IF_ERROR(PrepareMoeKernels());  // both kernels' shared memory limits, once a device
  if (a.gemm_kernel == MoeGemmKernel::kWgmmaSm90) {
#if defined(RS_HAVE_SM90_PREFILL)
    return LaunchMoeGroupedGemmSm90(a, tiles, num_tiles, grid_tiles, stream);
#else
    return absl::InvalidArgumentError(
        "LaunchMoeGroupedGemm: the wgmma kernel needs a build for sm_90 (its sm_90a code)");
#endif
  }
  const dim3 grid(grid_tiles, (a.n + kBN - 1) / kBN);
  LaunchDependent(GroupedGemmKernel, grid, kGemmThreads, kGemmSmem, stream, a, tiles, num_tiles);
  return LaunchStatus("GroupedGemmKernel");
}

absl::Status LaunchMoeActivation(const bf16* gate_up, bf16* act, int rows, int n,
                                 const MoeActivationParams& params, LaunchStream stream) {
  if (rows < 0 || n <= 0 || params.kind == MoeActivation::kNone) {
    return absl::InvalidArgumentError("LaunchMoeActivation: bad arguments");
  }
  if (rows == 0) return absl::OkStatus();
  LaunchDependent(ActivationKernel, dim3(GridFor(static_cast<int64_t>(rows) * n)), 256, 0, stream,
                  gate_up, act, static_cast<int64_t>(rows), n, params);
  return LaunchStatus("ActivationKernel");
}

absl::Status LaunchMoeUnstackGateUp(const bf16* src, bf16* dst, int experts, int hidden, int inter,
                                    LaunchStream stream) {
  UnstackGateUpKernel<<<GridFor(int64_t{experts} * 2 * inter * hidden), 256, 0, stream>>>(
      src, dst, experts, hidden, inter);
  return LaunchStatus("UnstackGateUpKernel");
}

absl::Status LaunchMoeUnstackGateUpBias(const bf16* src, bf16* dst, int experts, int inter,
                                        LaunchStream stream) {
  UnstackGateUpBiasKernel<<<GridFor(int64_t{experts} * 2 * inter), 256, 0, stream>>>(
      src, dst, experts, inter);
  return LaunchStatus("UnstackGateUpBiasKernel");
}

absl::Status LaunchMoeTransposeDown(const bf16* src, bf16* dst, int experts, int inter, int hidden,
                                    LaunchStream stream) {
  TransposeDownKernel<<<GridFor(int64_t{experts} * inter * hidden), 256, 0, stream>>>(
      src, dst, experts, inter, hidden);
  return LaunchStatus("TransposeDownKernel");
}

}  // namespace ringserve::cuda
