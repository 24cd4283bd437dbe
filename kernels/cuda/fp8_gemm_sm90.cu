// The FP8 block-scaled GEMM on Hopper's warpgroup MMA (compiled for sm_90a only). See
// fp8_gemm_sm90.h.
//
// CTA (row tile, column block) = 2 warpgroups: 128 rows of x times 128 output columns; warpgroup
// w owns rows [64 w, 64 w + 64). K in steps of 128 (one scale group: 128 bytes of e4m3 a row, one
// swizzled half of wgmma.cuh) through a kStages-deep cp.async pipeline that all 256 threads fill:
// per stage the x and W tiles (16 KB each) and the group's 128 x scales and 128 weight-row scales.
// Per step each warpgroup issues 4 wgmma m64n128k32 (e4m3 x e4m3 -> fp32) into a fresh partial
// sum, which is then added to the accumulators times the two scales of its row and column (the
// "promotion" of DeepSeek-V3's recipe: Hopper's fp8 MMAs keep about 14 bits of their sums, so
// they never carry across groups). Two partial sums alternate, so one group's MMAs run while the
// other's is promoted. 192 accumulator registers a thread: one CTA an SM, 5 stages of 33 KB.
#include "common/status_macros.h"
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/fp8_gemm_sm90.h"
#include "kernels/cuda/wgmma.cuh"

namespace ringserve::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kBM = 128;
constexpr int kBN = 128;
constexpr int kBK = 128;  // e4m3 values: 128 bytes a row, one scale group
constexpr int kStages = 5;
constexpr int kOperandBytes = 128 * 128;  // 128 rows x 128 bytes
constexpr int kScaleBytes = 2 * 128 * 4;  // the x scales, then the weight-row scales
constexpr int kStageBytes = 2 * kOperandBytes + kScaleBytes;  // 33 KB: every stage 1024-aligned
constexpr int kSmemBytes = kStages * kStageBytes + 1024;      // + the 1024-byte alignment
static_assert(kStageBytes % 1024 == 0, "swizzled tiles need 1024-byte alignment");

// D (64 x 128 fp32) = A (64 x 32 e4m3, smem, K-major) * B (32 x 128 e4m3, smem, K-major: one
// output column per row) + (scale_d ? D : 0).
__device__ __forceinline__ void WgmmaE4m3(float* d, uint64_t desc_a, uint64_t desc_b, int scale_d) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {" RS_WGMMA_D64_REGS
      "}, %64, %65, p, 1, 1;\n}\n"
      : RS_WGMMA_D64(d)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
#endif
}

__global__ void __launch_bounds__(kThreads, 1) Fp8BlockGemmSm90Kernel(Fp8GemmArgs a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  WaitForPreviousKernel();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (SmemAddr(smem_raw) & 1023)) & 1023);
  const int m0 = blockIdx.x * kBM, n0 = blockIdx.y * kBN;
  const int m = a.m, n = a.n, k = a.k;
  const int tid = threadIdx.x;

  // Thread t copies 16-byte chunk t % 8 of rows t / 8 + 32 i (i < 4) of x and of W per stage;
  // threads 0-31 copy the stage's 128 x scales, threads 32-63 its 128 weight-row scales.
  const int chunk = tid & 7;
  const uint8_t* x_src[4];
  const uint8_t* w_src[4];
  bool x_ok[4], w_ok[4];
  uint32_t dst[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int row = (tid >> 3) + 32 * i;
    x_ok[i] = m0 + row < m;
    x_src[i] = a.x_codes + static_cast<int64_t>(x_ok[i] ? m0 + row : 0) * k + chunk * 16;
    w_ok[i] = n0 + row < n;
    w_src[i] = a.w_codes + static_cast<int64_t>(w_ok[i] ? n0 + row : 0) * k + chunk * 16;
    dst[i] = ChunkOffset(row, chunk, kOperandBytes);
  }
  const bool loads_x_scales = tid < 32, loads_w_scales = tid >= 32 && tid < 64;
  const int scale_at = 4 * (tid & 31);  // this thread's 4 scales of the 128
  const float* scale_src = loads_x_scales ? a.x_scales + m0 + scale_at : a.w_scales + n0 + scale_at;
  const int64_t scale_step = loads_x_scales ? m : n;  // one group to the next
  const bool scale_ok = loads_x_scales ? m0 + scale_at < m : n0 + scale_at < n;
  const int k_tiles = k / kBK;
  const auto load = [&](int stage, int kt) {
    unsigned char* sx = smem + stage * kStageBytes;
    unsigned char* sw = sx + kOperandBytes;
    const int k0 = kt * kBK;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      CpAsync16(sx + dst[i], x_ok[i] ? x_src[i] + k0 : a.x_codes, x_ok[i]);
      CpAsync16(sw + dst[i], w_ok[i] ? w_src[i] + k0 : a.w_codes, w_ok[i]);
    }
    if (loads_x_scales || loads_w_scales) {
      float* scales = reinterpret_cast<float*>(sw + kOperandBytes) + (loads_w_scales ? 128 : 0);
      CpAsync16(scales + scale_at, scale_ok ? scale_src + kt * scale_step : a.x_scales, scale_ok);
    }
  };

  const int wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  // acc[4 c + x]: row 64 wg + 16 warp + lane / 4 + 8 (x >> 1), column 8 c + 2 (lane % 4) + (x & 1).
  const int my_row = 64 * wg + 16 * warp + (lane >> 2);
  const int my_col = 2 * (lane & 3);
  // Two partial sums in turn: tile kt + 1's MMAs run while tile kt's sum is promoted.
  float acc[64], part0[64], part1[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = part0[i] = part1[i] = 0.0f;

  // Loads run kStages - 2 tiles ahead: of the other two stages one feeds the MMAs in flight and
  // one holds the tile being promoted (its scales).
  for (int s = 0; s < kStages - 2; ++s) {
    if (s < k_tiles) load(s, s);
    CpAsyncCommit();
  }
  // Makes tile kt visible to both warpgroups and refills the stage of tile kt - 2 (every thread
  // has waited for its MMAs and promoted it by now).
  const auto arrive = [&](int kt) {
    CpAsyncWait<kStages - 3>();
    FenceProxyAsync();
    __syncthreads();
    const int next = kt + kStages - 2;
    if (next < k_tiles) load(next % kStages, next);
    CpAsyncCommit();
  };
  const auto issue = [&](int kt, float* part) {
    const uint32_t sx = SmemAddr(smem + (kt % kStages) * kStageBytes);
    const uint32_t sw = sx + kOperandBytes;
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kBK / 32; ++kk) {
      WgmmaE4m3(part, Descriptor(sx + wg * 64 * 128 + kk * 32, 16, 1024),
                Descriptor(sw + kk * 32, 16, 1024), kk > 0);
    }
    WgmmaCommit();
  };
  const auto promote = [&](int kt, float* part) {
    const float* scales =
        reinterpret_cast<const float*>(smem + (kt % kStages) * kStageBytes + 2 * kOperandBytes);
    const float x_lo = scales[my_row], x_hi = scales[my_row + 8];
#pragma unroll
    for (int c = 0; c < 16; ++c) {
      const float2 w = *reinterpret_cast<const float2*>(scales + 128 + 8 * c + my_col);
      acc[4 * c + 0] += part[4 * c + 0] * (x_lo * w.x);
      acc[4 * c + 1] += part[4 * c + 1] * (x_lo * w.y);
      acc[4 * c + 2] += part[4 * c + 2] * (x_hi * w.x);
      acc[4 * c + 3] += part[4 * c + 3] * (x_hi * w.y);
    }
  };
  arrive(0);
  issue(0, part0);
  int kt = 0;
  for (; kt + 2 < k_tiles; kt += 2) {  // tile kt in flight in part0; kt + 1 and kt + 2 exist
    arrive(kt + 1);
    issue(kt + 1, part1);
    WgmmaWait<1>();
    FenceRegisters(part0);
    promote(kt, part0);
    arrive(kt + 2);
    issue(kt + 2, part0);
    WgmmaWait<1>();
    FenceRegisters(part1);
    promote(kt + 1, part1);
  }
  if (kt + 1 < k_tiles) {  // the last two tiles
    arrive(kt + 1);
    issue(kt + 1, part1);
    WgmmaWait<1>();
    FenceRegisters(part0);
    promote(kt, part0);
    WgmmaWait<0>();
    FenceRegisters(part1);
    promote(kt + 1, part1);
  } else {
    WgmmaWait<0>();
    FenceRegisters(part0);
    promote(kt, part0);
  }
  CpAsyncWait<0>();

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = m0 + my_row + 8 * h;
    if (row >= m) continue;
#pragma unroll
    for (int c = 0; c < 16; ++c) {
      const int col = n0 + 8 * c + my_col;
      if (col >= n) continue;  // n is even: col + 1 < n too
      *reinterpret_cast<uint32_t*>(a.y + static_cast<int64_t>(row) * n + col) =
          PackBF16(acc[4 * c + 2 * h], acc[4 * c + 2 * h + 1]);
    }
  }
#endif
}

}  // namespace

absl::Status PrepareFp8BlockGemmSm90() {
  RS_CUDA_RETURN_IF_ERROR(cudaFuncSetAttribute(
      Fp8BlockGemmSm90Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  return absl::OkStatus();
}

absl::Status LaunchFp8BlockGemmSm90(const Fp8GemmArgs& a, LaunchStream stream) {
  if (a.m < 1 || a.n < 1 || a.k < kBK || a.k % kBK != 0 || a.m % 4 != 0 || a.n % 4 != 0) {
    return absl::InvalidArgumentError(
        "LaunchFp8BlockGemmSm90: m and n must be positive multiples of 4, k of 128");
  }
  const dim3 grid((a.m + kBM - 1) / kBM, (a.n + kBN - 1) / kBN);
  LaunchDependent(Fp8BlockGemmSm90Kernel, grid, kThreads, kSmemBytes, stream, a);
  return LaunchStatus("Fp8BlockGemmSm90Kernel");
}

}  // namespace ringserve::cuda
