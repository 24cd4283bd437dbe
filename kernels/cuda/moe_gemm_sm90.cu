// The grouped expert GEMM of a MoE layer on Hopper's warpgroup MMA (compiled for sm_90a only).
// See moe_gemm_sm90.h.
//
// CTA (tile, column block) = 2 warpgroups: a 128-row tile of one group (rows gathered through
// row_token) times 128 output columns of the group's weight; warpgroup w owns rows
// [64 w, 64 w + 64). K in steps of 64 (128 bytes a row: one swizzled half, wgmma.cuh) through a
// kStages-deep cp.async pipeline that all 256 threads fill; per step each warpgroup issues 4
// wgmma m64n128k16 with A (the gathered activations) and B (the weight rows, K-major) read from
// shared memory. Two CTAs share an SM (3 stages of 32 KB each), so one's loads and epilogue
// overlap the other's MMAs. The epilogue writes the fp32 accumulators (plus the bias) straight
// from registers, bounds-checked.
#include "common/status_macros.h"
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/moe_device.cuh"
#include "kernels/cuda/moe_gemm_sm90.h"
#include "kernels/cuda/wgmma.cuh"

namespace ringserve::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kBM = kMoeTileRows;  // 128
constexpr int kBN = 128;
constexpr int kBK = 64;
constexpr int kStages = 3;
constexpr int kOperandBytes = 128 * 128;  // 128 rows x 128 bytes (64 bf16)
constexpr int kStageBytes = 2 * kOperandBytes;
constexpr int kSmemBytes = kStages * kStageBytes + 1024;  // + the 1024-byte alignment
static_assert(kBM == 128 && kBN == 128, "one 128-row tile, two m64n128 warpgroups");

__global__ void __launch_bounds__(kThreads, 2)
    GroupedGemmSm90Kernel(MoeGroupedLinear a, const int32_t* tiles, const int32_t* num_tiles) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  WaitForPreviousKernel();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (SmemAddr(smem_raw) & 1023)) & 1023);
  MoeGemmTile tile;
  if (!MoeGemmTileOf(a, tiles, num_tiles, kBM, tile)) return;
  const int g = tile.group, m0 = tile.m0, end = tile.end;
  const int n0 = blockIdx.y * kBN;
  const int n = a.n, k = a.k;
  const bf16* w = a.w + static_cast<int64_t>(g - a.group_begin) * n * k;
  const int tid = threadIdx.x;

  // Thread t copies 16-byte chunk t % 8 of rows t / 8 + 32 i (i < 4) of A and of B per stage.
  const int chunk = tid & 7;
  const bf16* a_src[4];
  const bf16* b_src[4];
  bool a_ok[4], b_ok[4];
  uint32_t dst[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int row = (tid >> 3) + 32 * i;
    const int r = m0 + row;
    a_ok[i] = r < end;
    const int src = a_ok[i] ? (a.row_token != nullptr ? a.row_token[r] : r) : 0;
    a_src[i] = a.x + static_cast<int64_t>(src) * k + chunk * 8;
    b_ok[i] = n0 + row < n;
    b_src[i] = w + static_cast<int64_t>(b_ok[i] ? n0 + row : 0) * k + chunk * 8;
    dst[i] = ChunkOffset(row, chunk, kOperandBytes);
  }
  const int k_tiles = (k + kBK - 1) / kBK;
  const auto load = [&](int stage, int kt) {
    unsigned char* sa = smem + stage * kStageBytes;
    unsigned char* sb = sa + kOperandBytes;
    const int k0 = kt * kBK;
    const bool in_k = k0 + chunk * 8 < k;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      CpAsync16(sa + dst[i], in_k && a_ok[i] ? a_src[i] + k0 : a.x, in_k && a_ok[i]);
      CpAsync16(sb + dst[i], in_k && b_ok[i] ? b_src[i] + k0 : a.w, in_k && b_ok[i]);
    }
  };

  float acc[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
  const int wg = tid >> 7;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) load(s, s);
    CpAsyncCommit();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    CpAsyncWait<kStages - 2>();  // tile kt has landed (this thread's copies)
    FenceProxyAsync();
    // Every thread's copies of tile kt are visible, and both warpgroups are done with tile
    // kt - 1, whose stage now receives tile kt + kStages - 1.
    __syncthreads();
    const int next = kt + kStages - 1;
    if (next < k_tiles) load(next % kStages, next);
    CpAsyncCommit();
    const uint32_t sa = SmemAddr(smem + (kt % kStages) * kStageBytes);
    const uint32_t sb = sa + kOperandBytes;
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      WgmmaSS(acc, Descriptor(sa + wg * 64 * 128 + kk * 32, 16, 1024),
              Descriptor(sb + kk * 32, 16, 1024), 1);
    }
    WgmmaCommitAndWait();
    FenceRegisters(acc);
  }
  CpAsyncWait<0>();

  // acc[4 c + x]: row 64 wg + 16 warp + lane / 4 + 8 (x >> 1), column 8 c + 2 (lane % 4) + (x & 1).
  const int warp = (tid >> 5) & 3, lane = tid & 31;
  const bf16* bias = a.bias != nullptr ? a.bias + static_cast<int64_t>(g) * n : nullptr;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = m0 + 64 * wg + 16 * warp + (lane >> 2) + 8 * h;
    if (row >= end) continue;
#pragma unroll
    for (int c = 0; c < 16; ++c) {
      const int col = n0 + 8 * c + 2 * (lane & 3);
      if (col >= n) continue;
      float v0 = acc[4 * c + 2 * h], v1 = acc[4 * c + 2 * h + 1];
      if (bias != nullptr) {
        v0 += __bfloat162float(bias[col]);
        if (col + 1 < n) v1 += __bfloat162float(bias[col + 1]);
      }
      const int64_t at = static_cast<int64_t>(row) * n + col;
      if (a.out_f32) {
        float* out = static_cast<float*>(a.out) + at;
        out[0] = v0;
        if (col + 1 < n) out[1] = v1;
      } else if (col + 1 < n && n % 2 == 0) {
        *reinterpret_cast<uint32_t*>(static_cast<bf16*>(a.out) + at) = PackBF16(v0, v1);
      } else {
        bf16* out = static_cast<bf16*>(a.out) + at;
        out[0] = __float2bfloat16(v0);
        if (col + 1 < n) out[1] = __float2bfloat16(v1);
      }
    }
  }
#endif
}

}  // namespace

absl::Status PrepareMoeGroupedGemmSm90() {
  RS_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
      GroupedGemmSm90Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  return absl::OkStatus();
}

absl::Status LaunchMoeGroupedGemmSm90(const MoeGroupedLinear& a, const int32_t* tiles,
                                      const int32_t* num_tiles, int grid_tiles,
                                      LaunchStream stream) {
  const dim3 grid(grid_tiles, (a.n + kBN - 1) / kBN);
  LaunchDependent(GroupedGemmSm90Kernel, grid, kThreads, kSmemBytes, stream, a, tiles, num_tiles);
  return LaunchStatus("GroupedGemmSm90Kernel");
}

}  // namespace ringserve::cuda
