// Memory-bound GEMV for decode: y[m, n] = x[m, :] . w[n, :] for m <= kGemvMaxRows, and the
// MLP's gate/up projection fused with SiLU-and-multiply. One warp per output column n; lanes stride
// over k in 16-byte vectors, kUnroll loads in flight. (kUnroll 8 measured worse on H200: qkv 65% of
// copy bandwidth against 73-76% with 4.)
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/gemv.h"

namespace ringserve::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kUnroll = 4;

// M is the register capacity (rows); the runtime row count m <= M. kGateUp: w holds 2n rows
// (the MLP's gate rows, then its up rows) and a warp computes both dot products of output
// column col — g with row col, u with row col + n — and stores bf16(silu(g) * u) with g and u
// rounded to bf16 first, exactly what the GEMM into gate_up followed by LaunchSiluMul stores.
// (Issuing the first weight loads before WaitForPreviousKernel was measured on an H200: no
// change in decode tok/s, so the kernel waits first like every other.)
template <int M, typename OutT, bool kGateUp>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    GemvKernel(const bf16* __restrict__ x, const bf16* __restrict__ w, OutT* __restrict__ y, int m,
               int n, int k) {
  constexpr int P = kGateUp ? 2 : 1;  // weight rows per warp
  const int lane = threadIdx.x & 31;
  const int col = blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
  const int vecs = k / 8;
  const uint4* wrow[P];
#pragma unroll
  for (int p = 0; p < P; ++p) {
    wrow[p] = reinterpret_cast<const uint4*>(w + (static_cast<int64_t>(col) + p * n) * k);
  }
  uint4 wv[P][kUnroll];
  const auto load_weights = [&](int i) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
      for (int p = 0; p < P; ++p) {
        if (i + 32 * u < vecs) wv[p][u] = LoadStreaming(wrow[p] + i + 32 * u);
      }
    }
  };
  WaitForPreviousKernel();
  if (col >= n) return;
  load_weights(lane);
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  float acc[P][M];
#pragma unroll
  for (int p = 0; p < P; ++p) {
#pragma unroll
    for (int r = 0; r < M; ++r) acc[p][r] = 0.0f;
  }

  for (int i = lane; i < vecs; i += 32 * kUnroll) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (i + 32 * u >= vecs) break;
      float wf[P][8];
#pragma unroll
      for (int p = 0; p < P; ++p) Unpack8(wv[p][u], wf[p]);
#pragma unroll
      for (int r = 0; r < M; ++r) {
        if (r >= m) break;
        float xf[8];
        Unpack8(__ldg(xv + static_cast<int64_t>(r) * vecs + i + 32 * u), xf);
#pragma unroll
        for (int p = 0; p < P; ++p) {
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[p][r] = fmaf(wf[p][j], xf[j], acc[p][r]);
        }
      }
    }
    if (i + 32 * kUnroll < vecs) load_weights(i + 32 * kUnroll);
  }
#pragma unroll
  for (int r = 0; r < M; ++r) {
    if (r >= m) break;
    const float sum = WarpSum(acc[0][r]);
    float value = sum;
    if constexpr (kGateUp) {
      const float g = __bfloat162float(__float2bfloat16(sum));
      const float u = __bfloat162float(__float2bfloat16(WarpSum(acc[P - 1][r])));
      value = g / (1.0f + __expf(-g)) * u;
    }
    if (lane == 0) {
      if constexpr (sizeof(OutT) == 4) {
        y[static_cast<int64_t>(r) * n + col] = value;
      } else {
        y[static_cast<int64_t>(r) * n + col] = __float2bfloat16(value);
      }
    }
  }
}

template <int M>
void Launch(const bf16* x, const bf16* w, void* y, OutType out, bool gate_up, int m, int n, int k,
            cudaStream_t stream) {
  const dim3 grid((n + kWarpsPerBlock - 1) / kWarpsPerBlock);
  if (gate_up) {
    LaunchDependent(GemvKernel<M, bf16, true>, grid, kWarpsPerBlock * 32, 0, stream, x, w,
                    static_cast<bf16*>(y), m, n, k);
  } else if (out == OutType::kF32) {
    LaunchDependent(GemvKernel<M, float, false>, grid, kWarpsPerBlock * 32, 0, stream, x, w,
                    static_cast<float*>(y), m, n, k);
  } else {
    LaunchDependent(GemvKernel<M, bf16, false>, grid, kWarpsPerBlock * 32, 0, stream, x, w,
                    static_cast<bf16*>(y), m, n, k);
  }
}

absl::Status Dispatch(const bf16* x, const bf16* w, void* y, OutType out, bool gate_up, int m,
                      int n, int k, cudaStream_t stream) {
  if (m < 1 || m > kGemvMaxRows || n < 1 || k < 8 || k % 8 != 0) {
    return absl::InvalidArgumentError("LaunchGemv: need 1 <= m <= 8, n >= 1, k a multiple of 8");
  }
  // Three register capacities keep compile time down; a smaller m runs predicated.
  if (m == 1) {
    Launch<1>(x, w, y, out, gate_up, m, n, k, stream);
  } else if (m <= 4) {
    Launch<4>(x, w, y, out, gate_up, m, n, k, stream);
  } else {
    Launch<8>(x, w, y, out, gate_up, m, n, k, stream);
  }
  return LaunchStatus("GemvKernel");
}

}  // namespace

absl::Status LaunchGemv(const bf16* x, const bf16* w, void* y, OutType out, int m, int n, int k,
                        cudaStream_t stream) {
  return Dispatch(x, w, y, out, /*gate_up=*/false, m, n, k, stream);
}

absl::Status LaunchGemvGateUpSilu(const bf16* x, const bf16* w_gate_up, bf16* act, int m, int inter,
                                  int k, cudaStream_t stream) {
  return Dispatch(x, w_gate_up, act, OutType::kBF16, /*gate_up=*/true, m, inter, k, stream);
}

}  // namespace ringserve::cuda
