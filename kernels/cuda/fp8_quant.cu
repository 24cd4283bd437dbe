// Per-token, per-128-column dynamic e4m3 quantization of activations (fp8_block_gemm.h).
#include <cuda_fp8.h>

#include <cstring>

#include "kernels/cuda/fp8_block_gemm.h"

namespace ringserve::cuda {
namespace {

constexpr int kWarps = 8;

// One warp per (token, group): lane l holds columns 4 l .. 4 l + 3 of the group.
__global__ void __launch_bounds__(kWarps * 32)
    QuantizeFp8GroupsKernel(const bf16* __restrict__ x, uint8_t* __restrict__ codes,
                            float* __restrict__ scales, int m, int k) {
  const int groups = k / kFp8Block;
  const int64_t unit = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (unit >= static_cast<int64_t>(m) * groups) return;
  const int lane = threadIdx.x % 32;
  const int token = static_cast<int>(unit / groups), group = static_cast<int>(unit % groups);
  const int64_t at = static_cast<int64_t>(token) * k + group * kFp8Block + 4 * lane;
  const uint2 packed = *reinterpret_cast<const uint2*>(x + at);
  __nv_bfloat162 pairs[2];
  memcpy(pairs, &packed, 8);
  const float2 a = __bfloat1622float2(pairs[0]), b = __bfloat1622float2(pairs[1]);
  float amax = fmaxf(fmaxf(fabsf(a.x), fabsf(a.y)), fmaxf(fabsf(b.x), fabsf(b.y)));
#pragma unroll
  for (int o = 16; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float scale = amax > 0 ? amax / 448.0f : 1.0f;
  const __nv_fp8x2_storage_t lo =
      __nv_cvt_float2_to_fp8x2(make_float2(a.x / scale, a.y / scale), __NV_SATFINITE, __NV_E4M3);
  const __nv_fp8x2_storage_t hi =
      __nv_cvt_float2_to_fp8x2(make_float2(b.x / scale, b.y / scale), __NV_SATFINITE, __NV_E4M3);
  *reinterpret_cast<uint32_t*>(codes + at) =
      static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
  if (lane == 0) scales[static_cast<int64_t>(group) * m + token] = scale;
}

}  // namespace

absl::Status LaunchQuantizeFp8Groups(const bf16* x, uint8_t* codes, float* scales, int m, int k,
                                     LaunchStream stream) {
  if (m < 1 || k < kFp8Block || k % kFp8Block != 0) {
    return absl::InvalidArgumentError("LaunchQuantizeFp8Groups: m >= 1, k a multiple of 128");
  }
  const int64_t units = static_cast<int64_t>(m) * (k / kFp8Block);
  QuantizeFp8GroupsKernel<<<static_cast<unsigned>((units + kWarps - 1) / kWarps), kWarps * 32, 0,
                            stream>>>(x, codes, scales, m, k);
  return LaunchStatus("QuantizeFp8Groups");
}

}  // namespace ringserve::cuda
