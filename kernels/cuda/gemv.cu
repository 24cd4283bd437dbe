// Memory-bound GEMV for decode: y[m, n] = x[m, :] . w[n, :] for m <= kGemvMaxRows.
// One warp per output column n; lanes stride over k in 16-byte vectors, kUnroll loads in flight.
// (kUnroll 8 measured worse on H200: qkv 65% of copy bandwidth against 73-76% with 4.)
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/gemv.h"

namespace ringserve::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kUnroll = 4;

// Loads 8 input values of row r at vector i. kSiluX: x is gate_up [m, 2k] and the input is
// bf16(silu(gate) * up), exactly what LaunchSiluMul would have stored.
template <bool kSiluX>
__device__ __forceinline__ void LoadX(const uint4* xv, int r, int i, int vecs, float* out) {
  if constexpr (kSiluX) {
    float g[8], u[8];
    Unpack8(__ldg(xv + static_cast<int64_t>(r) * 2 * vecs + i), g);
    Unpack8(__ldg(xv + static_cast<int64_t>(r) * 2 * vecs + vecs + i), u);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      out[j] = __bfloat162float(__float2bfloat16(g[j] / (1.0f + __expf(-g[j])) * u[j]));
    }
  } else {
    Unpack8(__ldg(xv + static_cast<int64_t>(r) * vecs + i), out);
  }
}

// M is the register capacity (rows); the runtime row count m <= M.
template <int M, typename OutT, bool kSiluX>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    GemvKernel(const bf16* __restrict__ x, const bf16* __restrict__ w, OutT* __restrict__ y, int m,
               int n, int k) {
  WaitForPreviousKernel();
  const int lane = threadIdx.x & 31;
  const int col = blockIdx.x * kWarpsPerBlock + (threadIdx.x >> 5);
  if (col >= n) return;
  const int vecs = k / 8;
  const uint4* wrow = reinterpret_cast<const uint4*>(w + static_cast<int64_t>(col) * k);
  const uint4* xv = reinterpret_cast<const uint4*>(x);
  float acc[M];
#pragma unroll
  for (int r = 0; r < M; ++r) acc[r] = 0.0f;

  int i = lane;
  for (; i + 32 * (kUnroll - 1) < vecs; i += 32 * kUnroll) {
    uint4 wv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) wv[u] = LoadStreaming(wrow + i + 32 * u);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float wf[8];
      Unpack8(wv[u], wf);
#pragma unroll
      for (int r = 0; r < M; ++r) {
        if (r >= m) break;
        float xf[8];
        LoadX<kSiluX>(xv, r, i + 32 * u, vecs, xf);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[r] = fmaf(wf[j], xf[j], acc[r]);
      }
    }
  }
  for (; i < vecs; i += 32) {
    float wf[8];
    Unpack8(LoadStreaming(wrow + i), wf);
#pragma unroll
    for (int r = 0; r < M; ++r) {
      if (r >= m) break;
      float xf[8];
      LoadX<kSiluX>(xv, r, i, vecs, xf);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[r] = fmaf(wf[j], xf[j], acc[r]);
    }
  }
#pragma unroll
  for (int r = 0; r < M; ++r) {
    if (r >= m) break;
    const float sum = WarpSum(acc[r]);
    if (lane == 0) {
      if constexpr (sizeof(OutT) == 4) {
        y[static_cast<int64_t>(r) * n + col] = sum;
      } else {
        y[static_cast<int64_t>(r) * n + col] = __float2bfloat16(sum);
      }
    }
  }
}

template <int M>
void Launch(const bf16* x, const bf16* w, void* y, OutType out, bool silu, int m, int n, int k,
            cudaStream_t stream) {
  const dim3 grid((n + kWarpsPerBlock - 1) / kWarpsPerBlock);
  if (silu) {
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

absl::Status Dispatch(const bf16* x, const bf16* w, void* y, OutType out, bool silu, int m, int n,
                      int k, cudaStream_t stream) {
  if (m < 1 || m > kGemvMaxRows || n < 1 || k < 8 || k % 8 != 0) {
    return absl::InvalidArgumentError("LaunchGemv: need 1 <= m <= 8, n >= 1, k a multiple of 8");
  }
  // Three register capacities keep compile time down; a smaller m runs predicated.
  if (m == 1) {
    Launch<1>(x, w, y, out, silu, m, n, k, stream);
  } else if (m <= 4) {
    Launch<4>(x, w, y, out, silu, m, n, k, stream);
  } else {
    Launch<8>(x, w, y, out, silu, m, n, k, stream);
  }
  return LaunchStatus("GemvKernel");
}

}  // namespace

absl::Status LaunchGemv(const bf16* x, const bf16* w, void* y, OutType out, int m, int n, int k,
                        cudaStream_t stream) {
  return Dispatch(x, w, y, out, /*silu=*/false, m, n, k, stream);
}

absl::Status LaunchGemvSiluMul(const bf16* gate_up, const bf16* w, bf16* y, int m, int n, int k,
                               cudaStream_t stream) {
  return Dispatch(gate_up, w, y, OutType::kBF16, /*silu=*/true, m, n, k, stream);
}

}  // namespace ringserve::cuda
