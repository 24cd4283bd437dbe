// Internal to kernels/cuda: the Hopper (sm_90a) FP8 block-scaled GEMM behind Fp8BlockGemm
// (fp8_block_gemm.h) where cuBLASLt has no block-scaled FP8 algorithm (cuBLASLt older than 12.9;
// CUDA 13.0's runs its 128-element scale modes on Hopper). Compiled only for sm_90a (the sm90
// object library): callers check for a compute capability 9.0 device first.
//
//   y [m, n] bf16 = sum over groups g of k / 128 of
//       (x_codes[:, 128 g : 128 g + 128] . w_codes[:, 128 g : 128 g + 128]^T)
//       * x_scales[g, row] * w_scales[g, column]
// with x_codes [m, k] and w_codes [n, k] e4m3 row-major, x_scales [k / 128, m] and w_scales
// [k / 128, n] fp32 (the token or output row fastest: LaunchQuantizeFp8Groups' layout and the
// weights' per-row scales). Each group's product is summed in fp32 by the tensor cores and scaled
// into fp32 accumulators. m and n multiples of 4, k of 128; pointers 16-byte aligned.
// InvalidArgument otherwise. Asynchronous on the stream, no allocation (capturable).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/cuda_utils.h"

namespace ringserve::cuda {

struct Fp8GemmArgs {
  const uint8_t* x_codes = nullptr;
  const float* x_scales = nullptr;
  const uint8_t* w_codes = nullptr;
  const float* w_scales = nullptr;
  bf16* y = nullptr;
  int m = 0, n = 0, k = 0;
};

// Sets the kernel's dynamic shared memory limit on the current device (compute capability 9.0),
// before any launch or graph capture.
absl::Status PrepareFp8BlockGemmSm90();

absl::Status LaunchFp8BlockGemmSm90(const Fp8GemmArgs& args, LaunchStream stream);

}  // namespace ringserve::cuda
