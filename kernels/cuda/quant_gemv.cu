#include <cuda_fp16.h>

#include "kernels/cuda/quant_decode.cuh"
#include "kernels/cuda/quant_gemv.h"

namespace ringserve::cuda {
namespace {

using namespace quant_decode;

constexpr int kWarpsPerBlock = 8;

template <QuantFormat F, int M>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    QuantGemvKernel(const bf16* __restrict__ x, QuantMatrixView w, bf16* __restrict__ y, int m) {
  constexpr int kC = kChunk<F>;
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= w.rows) return;
  const int chunks = w.cols / kC;
  const uint4* codes = reinterpret_cast<const uint4*>(w.codes) + static_cast<int64_t>(row) * chunks;
  float acc[M];
#pragma unroll
  for (int r = 0; r < M; ++r) acc[r] = 0;
  uint4 next = lane < chunks ? __ldg(codes + lane) : uint4{};
  for (int c = lane; c < chunks; c += 32) {
    const uint4 q = next;
    if (c + 32 < chunks) next = __ldg(codes + c + 32);  // the next load in flight
    const int col0 = c * kC;
    float scale, zero;
    GroupScale<F>(w, row, col0, &scale, &zero);
    float v[kC];
    Decode<F>(q, zero, v);
#pragma unroll
    for (int r = 0; r < M; ++r) {
      if (r < m) {
        const uint4* xr =
            reinterpret_cast<const uint4*>(x + static_cast<int64_t>(r) * w.cols + col0);
        float partial = 0;
#pragma unroll
        for (int j = 0; j < kC / 8; ++j) partial += Dot8(v + 8 * j, __ldg(xr + j));
        acc[r] = fmaf(partial, scale, acc[r]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < M; ++r) {
#pragma unroll
    for (int o = 16; o > 0; o /= 2) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
  }
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < M; ++r) {
      if (r < m) y[static_cast<int64_t>(r) * w.rows + row] = __float2bfloat16(acc[r]);
    }
  }
}

template <QuantFormat F>
__global__ void QuantDequantizeKernel(QuantMatrixView w, bf16* __restrict__ out) {
  constexpr int kC = kChunk<F>;
  const int chunks = w.cols / kC;
  const int64_t id = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= static_cast<int64_t>(w.rows) * chunks) return;
  const int row = static_cast<int>(id / chunks), col0 = static_cast<int>(id % chunks) * kC;
  float scale, zero;
  GroupScale<F>(w, row, col0, &scale, &zero);
  float v[kC];
  Decode<F>(__ldg(reinterpret_cast<const uint4*>(w.codes) + id), zero, v);
  uint4* dst = reinterpret_cast<uint4*>(out + static_cast<int64_t>(row) * w.cols + col0);
#pragma unroll
  for (int j = 0; j < kC / 8; ++j) {
    uint32_t u[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const __nv_bfloat162 p =
          __floats2bfloat162_rn(v[8 * j + 2 * i] * scale, v[8 * j + 2 * i + 1] * scale);
      memcpy(&u[i], &p, 4);
    }
    dst[j] = uint4{u[0], u[1], u[2], u[3]};
  }
}

template <QuantFormat F>
void LaunchGemvOf(const bf16* x, const QuantMatrixView& w, bf16* y, int m, cudaStream_t s) {
  const dim3 grid((w.rows + kWarpsPerBlock - 1) / kWarpsPerBlock), block(kWarpsPerBlock * 32);
  if (m <= 1) {
    QuantGemvKernel<F, 1><<<grid, block, 0, s>>>(x, w, y, m);
  } else if (m <= 2) {
    QuantGemvKernel<F, 2><<<grid, block, 0, s>>>(x, w, y, m);
  } else if (m <= 4) {
    QuantGemvKernel<F, 4><<<grid, block, 0, s>>>(x, w, y, m);
  } else {
    QuantGemvKernel<F, 8><<<grid, block, 0, s>>>(x, w, y, m);
  }
}

template <QuantFormat F>
void LaunchDequantizeOf(const QuantMatrixView& w, bf16* out, cudaStream_t s) {
  const int64_t threads = static_cast<int64_t>(w.rows) * (w.cols / kChunk<F>);
  QuantDequantizeKernel<F><<<static_cast<unsigned>((threads + 255) / 256), 256, 0, s>>>(w, out);
}

absl::Status CheckView(const QuantMatrixView& w) {
  if (!QuantMatrixSupported(w.format, w.rows, w.cols, w.group_cols) || w.codes == nullptr ||
      w.scales == nullptr || reinterpret_cast<uintptr_t>(w.codes) % 16 != 0) {
    return absl::InvalidArgumentError(
        "quantized matrix: rows positive, cols and group_cols multiples of the format's chunk, "
        "16-byte aligned codes and scales needed");
  }
  return absl::OkStatus();
}

}  // namespace

int QuantBits(QuantFormat format) {
  return format == QuantFormat::kInt4 || format == QuantFormat::kFp4 ? 4 : 8;
}
int QuantChunk(QuantFormat format) { return 128 / QuantBits(format); }
int64_t QuantCodeBytes(QuantFormat format, int64_t rows, int64_t cols) {
  return rows * cols * QuantBits(format) / 8;
}
int64_t QuantScaleBytes(QuantFormat format, int64_t rows, int64_t cols, int64_t group_cols) {
  const bool integer = format == QuantFormat::kInt4 || format == QuantFormat::kInt8;
  return rows * ((cols + group_cols - 1) / group_cols) * (integer ? 8 : 4);
}
bool QuantMatrixSupported(QuantFormat format, int64_t rows, int64_t cols, int64_t group_cols) {
  const int chunk = QuantChunk(format);
  return rows > 0 && cols > 0 && group_cols > 0 && cols % chunk == 0 && group_cols % chunk == 0 &&
         rows < (int64_t{1} << 31) && cols < (int64_t{1} << 31);
}

QuantMatrixView QuantRowSlice(const QuantMatrixView& w, int64_t row0, int rows) {
  const int64_t groups = (w.cols + w.group_cols - 1) / w.group_cols;
  const int64_t scale_floats =
      w.format == QuantFormat::kInt4 || w.format == QuantFormat::kInt8 ? 2 : 1;
  QuantMatrixView out = w;
  out.rows = rows;
  out.codes = w.codes + QuantCodeBytes(w.format, row0, w.cols);
  out.scales = w.scales + row0 * groups * scale_floats;
  out.row_scales_t = nullptr;
  out.block_scales = nullptr;
  return out;
}

absl::Status LaunchQuantGemv(const bf16* x, const QuantMatrixView& w, bf16* y, int m,
                             LaunchStream stream) {
  if (absl::Status s = CheckView(w); !s.ok()) return s;
  if (m < 1 || m > kQuantGemvMaxRows) {
    return absl::InvalidArgumentError("LaunchQuantGemv: m must be in [1, 8]");
  }
  switch (w.format) {
    case QuantFormat::kInt4:
      LaunchGemvOf<QuantFormat::kInt4>(x, w, y, m, stream);
      break;
    case QuantFormat::kInt8:
      LaunchGemvOf<QuantFormat::kInt8>(x, w, y, m, stream);
      break;
    case QuantFormat::kFp8:
      LaunchGemvOf<QuantFormat::kFp8>(x, w, y, m, stream);
      break;
    case QuantFormat::kFp4:
      LaunchGemvOf<QuantFormat::kFp4>(x, w, y, m, stream);
      break;
  }
  return LaunchStatus("QuantGemv");
}

absl::Status LaunchQuantDequantize(const QuantMatrixView& w, bf16* out, LaunchStream stream) {
  if (absl::Status s = CheckView(w); !s.ok()) return s;
  switch (w.format) {
    case QuantFormat::kInt4:
      LaunchDequantizeOf<QuantFormat::kInt4>(w, out, stream);
      break;
    case QuantFormat::kInt8:
      LaunchDequantizeOf<QuantFormat::kInt8>(w, out, stream);
      break;
    case QuantFormat::kFp8:
      LaunchDequantizeOf<QuantFormat::kFp8>(w, out, stream);
      break;
    case QuantFormat::kFp4:
      LaunchDequantizeOf<QuantFormat::kFp4>(w, out, stream);
      break;
  }
  return LaunchStatus("QuantDequantize");
}

}  // namespace ringserve::cuda
