// The routed experts' down projection and weighted combine of a step of a few tokens in one
// kernel (moe.h's LaunchMoeDownCombine), on bf16 or quantized expert weights.
#include "common/status_macros.h"
#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/moe_device.cuh"
#include "kernels/cuda/quant_decode.cuh"

namespace ringserve::cuda {
namespace {

// As the grouped GEMVs (moe_gemm.cu, moe_quant.cu), so that their sums are ours bit for bit.
constexpr int kColsPerWarp = 2;
constexpr int kMaxWarps = 8;

// The lane's partial dots of activation row x with columns col0, col0 + 1 of expert g's bf16
// weights [E, n, k]: the grouped GEMV's loop (16-byte loads, the next vector in flight).
__device__ __forceinline__ void Bf16Dots(const MoeDownCombine& a, int g, int col0, const bf16* x,
                                         float* acc) {
  const int lane = threadIdx.x & 31, n = a.n, vecs = a.k / 8;
  const bf16* wrow[kColsPerWarp];
#pragma unroll
  for (int c = 0; c < kColsPerWarp; ++c) {
    wrow[c] = a.w + (static_cast<int64_t>(g) * n + min(col0 + c, n - 1)) * a.k;
  }
  uint4 wv[kColsPerWarp], wn[kColsPerWarp];
#pragma unroll
  for (int c = 0; c < kColsPerWarp; ++c) wn[c] = wv[c] = make_uint4(0, 0, 0, 0);
  if (lane < vecs) {
#pragma unroll
    for (int c = 0; c < kColsPerWarp; ++c) wv[c] = LoadStreaming(wrow[c] + lane * 8);
  }
  for (int v = lane; v < vecs; v += 32) {
    if (v + 32 < vecs) {
#pragma unroll
      for (int c = 0; c < kColsPerWarp; ++c) wn[c] = LoadStreaming(wrow[c] + (v + 32) * 8);
    }
    float xf[8];
    Unpack8(__ldg(reinterpret_cast<const uint4*>(x) + v), xf);
#pragma unroll
    for (int c = 0; c < kColsPerWarp; ++c) {
      float wf[8];
      Unpack8(wv[c], wf);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[c] = fmaf(wf[i], xf[i], acc[c]);
      wv[c] = wn[c];
    }
  }
}

// The same on quantized weights (rows g * n + c of [E * n, k]): the quantized grouped GEMV's
// loop (codes decoded in registers, one scale per group of columns).
template <QuantFormat F>
__device__ __forceinline__ void QuantDots(const MoeDownCombine& a, const QuantMatrixView& w, int g,
                                          int col0, const bf16* x, float* acc) {
  using namespace quant_decode;
  constexpr int kC = kChunk<F>;
  const int lane = threadIdx.x & 31, n = a.n, chunks = a.k / kC;
  int wrow[kColsPerWarp];
  const uint4* codes[kColsPerWarp];
#pragma unroll
  for (int c = 0; c < kColsPerWarp; ++c) {
    wrow[c] = g * n + min(col0 + c, n - 1);
    codes[c] = reinterpret_cast<const uint4*>(w.codes) + static_cast<int64_t>(wrow[c]) * chunks;
  }
  for (int ch = lane; ch < chunks; ch += 32) {
    const int kcol = ch * kC;
    uint4 cq[kColsPerWarp];
#pragma unroll
    for (int c = 0; c < kColsPerWarp; ++c) cq[c] = LoadStreaming(codes[c] + ch);
#pragma unroll
    for (int c = 0; c < kColsPerWarp; ++c) {
      float scale, zero;
      GroupScale<F>(w, wrow[c], kcol, &scale, &zero);
      float v[kC];
      Decode<F>(cq[c], zero, v);
      const uint4* xv = reinterpret_cast<const uint4*>(x + kcol);
      float partial = 0.0f;
#pragma unroll
      for (int j = 0; j < kC / 8; ++j) partial += Dot8(v + 8 * j, __ldg(xv + j));
      acc[c] = fmaf(partial, scale, acc[c]);
    }
  }
}

// Block (column pair, token): warp w takes the token's entries w, w + warps, ...; for each it
// dots the entry's activation row with the entry expert's two weight rows. The weighted sum
// over the entries then runs in entry order, as LaunchMoeCombine's. kQuant: `w` holds the
// weights in format F (else a.w, bf16).
template <bool kQuant, QuantFormat F>
__global__ void __launch_bounds__(kMaxWarps * 32)
    DownCombineKernel(MoeDownCombine a, QuantMatrixView w) {
  WaitForPreviousKernel();
  __shared__ float part[32][kColsPerWarp];  // [entry][column]: bf16(dot + bias)
  __shared__ float weight[32];
  const int t = blockIdx.y, col0 = blockIdx.x * kColsPerWarp;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int n = a.n;
  for (int j = warp; j < a.top_k; j += warps) {
    const int entry = t * a.top_k + j;
    const int g = a.expert_ids[entry];
    const bf16* x = a.act + static_cast<int64_t>(a.entry_row[entry]) * a.k;
    float acc[kColsPerWarp] = {};
    if constexpr (kQuant) {
      QuantDots<F>(a, w, g, col0, x, acc);
    } else {
      Bf16Dots(a, g, col0, x, acc);
    }
    if (lane == 0) weight[j] = a.weights[entry];
#pragma unroll
    for (int c = 0; c < kColsPerWarp; ++c) {
      const float s = WarpSum(acc[c]);
      const int col = min(col0 + c, n - 1);
      const float b =
          a.bias != nullptr ? __bfloat162float(a.bias[static_cast<int64_t>(g) * n + col]) : 0.0f;
      if (lane == 0) part[j][c] = RoundBf16(s + b);
    }
  }
  __syncthreads();
  const int c = threadIdx.x;
  if (c >= kColsPerWarp || col0 + c >= n) return;
  float y = 0.0f;
  for (int j = 0; j < a.top_k; ++j) y = fmaf(weight[j], part[j][c], y);
  const int64_t at = static_cast<int64_t>(t) * n + col0 + c;
  if (a.shared_out != nullptr) y += __bfloat162float(a.shared_out[at]);
  if (a.residual != nullptr) {
    a.residual[at] += y;
  } else {
    a.out[at] = __float2bfloat16(y);
  }
}

template <QuantFormat F>
void LaunchQuant(const MoeDownCombine& a, const QuantMatrixView& w, dim3 grid, dim3 block,
                 LaunchStream stream) {
  LaunchDependent(DownCombineKernel<true, F>, grid, block, 0, stream, a, w);
}

}  // namespace

absl::Status LaunchMoeDownCombine(const MoeDownCombine& a, LaunchStream stream) {
  const QuantMatrixView* q = a.quant;
  const bool bad_quant =
      q != nullptr && (q->cols != a.k || q->codes == nullptr || q->scales == nullptr ||
                       !QuantMatrixSupported(q->format, q->rows, q->cols, q->group_cols) ||
                       reinterpret_cast<uintptr_t>(q->codes) % 16 != 0 ||
                       reinterpret_cast<uintptr_t>(a.act) % 16 != 0 || q->rows % a.n != 0);
  if (a.n <= 0 || a.k <= 0 || a.k % 8 != 0 || a.tokens < 0 || a.top_k < 1 || a.top_k > 32 ||
      (a.residual == nullptr) == (a.out == nullptr) || (q == nullptr && a.w == nullptr) ||
      bad_quant) {
    return absl::InvalidArgumentError(
        "LaunchMoeDownCombine: need k % 8 == 0, 1 <= top_k <= 32, one output, and bf16 weights "
        "or quantized ones of [experts * n, k] with 16-byte aligned codes and activations");
  }
  if (a.tokens == 0) return absl::OkStatus();
  const dim3 grid((a.n + kColsPerWarp - 1) / kColsPerWarp, a.tokens);
  const dim3 block(32 * std::min(a.top_k, kMaxWarps));
  if (q == nullptr) {
    LaunchDependent(DownCombineKernel<false, QuantFormat::kInt4>, grid, block, 0, stream, a,
                    QuantMatrixView{});
    return LaunchStatus("DownCombineKernel");
  }
  switch (q->format) {
    case QuantFormat::kInt4:
      LaunchQuant<QuantFormat::kInt4>(a, *q, grid, block, stream);
      break;
    case QuantFormat::kInt8:
      LaunchQuant<QuantFormat::kInt8>(a, *q, grid, block, stream);
      break;
    case QuantFormat::kFp8:
      LaunchQuant<QuantFormat::kFp8>(a, *q, grid, block, stream);
      break;
    case QuantFormat::kFp4:
      LaunchQuant<QuantFormat::kFp4>(a, *q, grid, block, stream);
      break;
  }
  return LaunchStatus("DownCombineKernel");
}

}  // namespace ringserve::cuda
