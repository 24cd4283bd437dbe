#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/rope.cuh"

namespace ringserve::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kMaxPairsPerLane = 4;  // head_dim <= 256

// One warp per (token, head). Lane l owns rotary pairs (i, i + half) for i = l, l + 32, ...
// kPartial: the normalized head goes through shared memory, where the pairs (i, i + rotary_dim /
// 2) are rotated.
template <bool kPartial>
__global__ void __launch_bounds__(kWarps * 32) QkvPrepareKernel(QkvPrepareArgs a) {
  WaitForPreviousKernel();
  const int t = blockIdx.x;
  const int head = blockIdx.y * kWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  const int num_kv = a.cache.num_kv_heads;
  const int total_heads = a.num_heads + 2 * num_kv;
  if (head >= total_heads) return;
  const int d = a.cache.head_dim;
  const int half = d / 2;
  const int64_t col0 = static_cast<int64_t>(head) * d;
  const bf16* src = a.qkv + static_cast<int64_t>(t) * total_heads * d + col0;
  const bool is_q = head < a.num_heads;
  const bool is_v = head >= a.num_heads + num_kv;

  float x1[kMaxPairsPerLane], x2[kMaxPairsPerLane];
  float sum_sq = 0.0f;
#pragma unroll
  for (int p = 0; p < kMaxPairsPerLane; ++p) {
    const int i = lane + 32 * p;
    x1[p] = 0.0f;
    x2[p] = 0.0f;
    if (i < half) {
      x1[p] = __bfloat162float(src[i]);
      x2[p] = __bfloat162float(src[i + half]);
      if (a.bias != nullptr) {
        x1[p] += __bfloat162float(a.bias[col0 + i]);
        x2[p] += __bfloat162float(a.bias[col0 + i + half]);
      }
      sum_sq += x1[p] * x1[p] + x2[p] * x2[p];
    }
  }
  if (!is_v) {
    if (a.q_norm != nullptr) {
      const bf16* w = is_q ? a.q_norm : a.k_norm;
      const float inv = rsqrtf(WarpSum(sum_sq) / d + a.norm_eps);
#pragma unroll
      for (int p = 0; p < kMaxPairsPerLane; ++p) {
        const int i = lane + 32 * p;
        if (i < half) {
          x1[p] = x1[p] * inv * __bfloat162float(w[i]);
          x2[p] = x2[p] * inv * __bfloat162float(w[i + half]);
        }
      }
    }
    const int position = a.positions[t];
    if constexpr (kPartial) {
      __shared__ float head_values[kWarps][2 * 32 * kMaxPairsPerLane];
      float* hv = head_values[threadIdx.x >> 5];
#pragma unroll
      for (int p = 0; p < kMaxPairsPerLane; ++p) {
        const int i = lane + 32 * p;
        if (i < half) {
          hv[i] = x1[p];
          hv[i + half] = x2[p];
        }
      }
      __syncwarp();
      const int rot_half = a.rotary_dim / 2;
      for (int i = lane; i < rot_half; i += 32) {
        float r1 = hv[i], r2 = hv[i + rot_half];
        RotatePair(r1, r2, position, a.inv_freq[i]);
        hv[i] = r1;
        hv[i + rot_half] = r2;
      }
      __syncwarp();
#pragma unroll
      for (int p = 0; p < kMaxPairsPerLane; ++p) {
        const int i = lane + 32 * p;
        if (i < half) {
          x1[p] = hv[i];
          x2[p] = hv[i + half];
        }
      }
    } else {
#pragma unroll
      for (int p = 0; p < kMaxPairsPerLane; ++p) {
        const int i = lane + 32 * p;
        if (i < half) RotatePair(x1[p], x2[p], position, a.inv_freq[i]);
      }
    }
  }
#pragma unroll
  for (int p = 0; p < kMaxPairsPerLane; ++p) {
    const int i = lane + 32 * p;
    if (i < half) {
      StoreHeadPair(a.q_out, a.num_heads, a.cache, a.slots, t, head, i, i + half, x1[p], x2[p]);
    }
  }
}

}  // namespace

absl::Status LaunchQkvPrepare(const QkvPrepareArgs& args, LaunchStream stream) {
  const int d = args.cache.head_dim;
  if (args.num_tokens < 0 || args.num_heads <= 0 || args.cache.num_kv_heads <= 0 || d <= 0 ||
      d % 2 != 0 || d > 2 * 32 * kMaxPairsPerLane || args.cache.block_size <= 0 ||
      (args.q_norm == nullptr) != (args.k_norm == nullptr) || args.rotary_dim < 0 ||
      args.rotary_dim > d || args.rotary_dim % 2 != 0) {
    return absl::InvalidArgumentError("LaunchQkvPrepare: bad arguments");
  }
  if (args.num_tokens == 0) return absl::OkStatus();
  const int total_heads = args.num_heads + 2 * args.cache.num_kv_heads;
  const dim3 grid(args.num_tokens, (total_heads + kWarps - 1) / kWarps);
  if (args.rotary_dim > 0 && args.rotary_dim < d) {
    LaunchDependent(QkvPrepareKernel<true>, grid, kWarps * 32, 0, stream, args);
  } else {
    LaunchDependent(QkvPrepareKernel<false>, grid, kWarps * 32, 0, stream, args);
  }
  return LaunchStatus("QkvPrepareKernel");
}

}  // namespace ringserve::cuda
