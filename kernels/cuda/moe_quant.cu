// The grouped expert GEMV of moe.h on quantized expert weights (LaunchMoeQuantGroupedGemv): the
// bf16 kernel's work split (moe_gemm.cu) with each weight row's codes decoded in registers
// (quant_decode.cuh), so a decode step reads the chosen experts' codes and scales only.
#include <algorithm>

#include "kernels/cuda/dependent_launch.cuh"
#include "kernels/cuda/device_utils.cuh"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/moe_device.cuh"
#include "kernels/cuda/quant_decode.cuh"

namespace ringserve::cuda {
namespace {

using namespace quant_decode;

constexpr int kWarps = 4;
constexpr int kColsPerWarp = 2;
constexpr int kBlockCols = kWarps * kColsPerWarp;  // output columns per block

// Block (column block, group): each warp owns kColsPerWarp output columns (with an activation,
// their gate and up rows: R weight rows). For each kRowChunk rows of the group, lanes stride over
// the 16-byte code chunks of the R weight rows (all R loads issued before any is used), decode them
// and dot them with the rows' activations (read through L1).
template <QuantFormat F, bool kGated, int kRowChunk>
__global__ void __launch_bounds__(kWarps * 32)
    QuantGroupedGemvKernel(MoeGroupedLinear a, QuantMatrixView w) {
  WaitForPreviousKernel();
  int g, begin, end;
  if (!MoeGemvGroupRows(a, &g, &begin, &end)) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int col0 = blockIdx.x * kBlockCols + warp * kColsPerWarp;
  if (col0 >= a.n) return;
  constexpr int P = kGated ? 2 : 1;
  constexpr int R = kColsPerWarp * P;
  constexpr int kC = kChunk<F>;
  const int n = a.n, k = a.k, chunks = k / kC;
  int wrow[R];
  const uint4* codes[R];
#pragma unroll
  for (int c = 0; c < kColsPerWarp; ++c) {
#pragma unroll
    for (int p = 0; p < P; ++p) {
      wrow[c * P + p] = (g * P + p) * n + min(col0 + c, n - 1);
      codes[c * P + p] =
          reinterpret_cast<const uint4*>(w.codes) + static_cast<int64_t>(wrow[c * P + p]) * chunks;
    }
  }
  for (int r0 = begin; r0 < end; r0 += kRowChunk) {
    const int nt = min(kRowChunk, end - r0);
    const bf16* xr[kRowChunk];
#pragma unroll
    for (int i = 0; i < kRowChunk; ++i) {
      const int r = min(r0 + i, end - 1);
      const int src = a.row_token != nullptr ? a.row_token[r] : r;
      xr[i] = a.x + static_cast<int64_t>(src) * k;
    }
    float acc[R][kRowChunk];
#pragma unroll
    for (int q = 0; q < R; ++q) {
#pragma unroll
      for (int i = 0; i < kRowChunk; ++i) acc[q][i] = 0.0f;
    }
    for (int ch = lane; ch < chunks; ch += 32) {
      const int kcol = ch * kC;
      uint4 cq[R];
#pragma unroll
      for (int q = 0; q < R; ++q) cq[q] = LoadStreaming(codes[q] + ch);
#pragma unroll
      for (int q = 0; q < R; ++q) {
        float scale, zero;
        GroupScale<F>(w, wrow[q], kcol, &scale, &zero);
        float v[kC];
        Decode<F>(cq[q], zero, v);
#pragma unroll
        for (int i = 0; i < kRowChunk; ++i) {
          if (i >= nt) break;
          const uint4* xv = reinterpret_cast<const uint4*>(xr[i] + kcol);
          float partial = 0.0f;
#pragma unroll
          for (int j = 0; j < kC / 8; ++j) partial += Dot8(v + 8 * j, __ldg(xv + j));
          acc[q][i] = fmaf(partial, scale, acc[q][i]);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kRowChunk; ++i) {
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

template <QuantFormat F, int kRowChunk>
void LaunchOf(const MoeGroupedLinear& a, const QuantMatrixView& w, dim3 grid, cudaStream_t s) {
  if (a.act.kind != MoeActivation::kNone) {
    LaunchDependent(QuantGroupedGemvKernel<F, true, kRowChunk>, grid, kWarps * 32, 0, s, a, w);
  } else {
    LaunchDependent(QuantGroupedGemvKernel<F, false, kRowChunk>, grid, kWarps * 32, 0, s, a, w);
  }
}

template <QuantFormat F>
void LaunchOf(const MoeGroupedLinear& a, const QuantMatrixView& w, dim3 grid, cudaStream_t s) {
  WithRowChunk(MoeGemvRowChunk(a.max_group_rows, /*quantized=*/true),
               [&](auto rows) { LaunchOf<F, decltype(rows)::value>(a, w, grid, s); });
}

}  // namespace

absl::Status LaunchMoeQuantGroupedGemv(const MoeGroupedLinear& a, const QuantMatrixView& w,
                                       LaunchStream stream) {
  const int per_group = (a.act.kind != MoeActivation::kNone ? 2 : 1) * a.n;
  if (a.n <= 0 || a.k <= 0 || a.groups < 1 || (a.offsets == nullptr && a.groups != 1) ||
      a.rows < 0 || (a.act.kind != MoeActivation::kNone && a.out_f32) ||
      (a.active != nullptr && a.offsets == nullptr) || w.cols != a.k ||
      static_cast<int64_t>(w.rows) != static_cast<int64_t>(a.groups) * per_group ||
      !QuantMatrixSupported(w.format, w.rows, w.cols, w.group_cols) || w.codes == nullptr ||
      w.scales == nullptr || reinterpret_cast<uintptr_t>(w.codes) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(a.x) % 16 != 0) {
    return absl::InvalidArgumentError(
        "LaunchMoeQuantGroupedGemv: bad arguments (w: [groups * (1 or 2) * n, k], k a multiple "
        "of the format's chunk, 16-byte aligned codes and x)");
  }
  if (a.offsets == nullptr && a.rows == 0) return absl::OkStatus();
  const int group_rows =
      a.active != nullptr && a.max_active > 0 ? std::min(a.groups, a.max_active) : a.groups;
  const dim3 grid((a.n + kBlockCols - 1) / kBlockCols, group_rows);
  switch (w.format) {
    case QuantFormat::kInt4:
      LaunchOf<QuantFormat::kInt4>(a, w, grid, stream);
      break;
    case QuantFormat::kInt8:
      LaunchOf<QuantFormat::kInt8>(a, w, grid, stream);
      break;
    case QuantFormat::kFp8:
      LaunchOf<QuantFormat::kFp8>(a, w, grid, stream);
      break;
    case QuantFormat::kFp4:
      LaunchOf<QuantFormat::kFp4>(a, w, grid, stream);
      break;
  }
  return LaunchStatus("QuantGroupedGemvKernel");
}

}  // namespace ringserve::cuda
