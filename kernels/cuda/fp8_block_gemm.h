// FP8 block-scaled GEMMs on tensor cores (prefill of FP8 checkpoints, sm_90): the DeepSeek-V3 /
// Qwen3-FP8 scheme, y = (x quantized per token and 128 columns) · (W in 128x128 blocks)^T.
//
//   LaunchQuantizeFp8Groups: x [m, k] bf16 -> codes [m, k] e4m3 and scales [k / 128, m] fp32
//     (the token fastest: cuBLASLt's VEC128_32F layout). Each token's group of 128 columns gets
//     scale = amax / 448 (1 for an all-zero group) and codes e4m3(x / scale), rounded to nearest
//     even and saturated. k a multiple of 128.
//   Fp8BlockGemm::Linear: y [m, n] bf16 = sum over k of (code_x * scale_x) * (code_w * scale_w)
//     with W's e4m3 codes [n, k] row-major (the packed layout of quant_gemv.h) and its scales in
//     one of cuBLASLt's layouts: per row and 128 columns, [k / 128, n] with the row fastest
//     (VEC128_32F, always given), and optionally once per 128x128 block, [ceil(n / 128), ld]
//     row-major with ld = Fp8BlockScaleStride(k) (BLK128x128_32F). fp32 accumulation in cuBLASLt.
//     The block form is used where cuBLASLt runs it, else the per-row form.
//
// On Hopper (compute capability 9.0) cuBLASLt runs these where it has an algorithm (its
// 128-element scale modes, cuBLASLt 12.9 and newer; its heuristic is asked with scale pointers
// set, without which it finds none); else, when the build has sm_90a code,
// our wgmma kernel (fp8_gemm_sm90.h: the per-row scales, m and n multiples of 4). Supported() is
// false on other GPUs, and the caller keeps its dequantize + bf16 GEMM path. Create runs each
// mode once on a problem with a known answer and never uses a mode that misses it (a cuBLASLt
// that reads a scale layout otherwise than documented above). Plans are cached per shape. Not
// thread-safe; asynchronous on the stream, no allocation after Create (capturable).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "absl/status/statusor.h"
#include "kernels/cuda/cuda_utils.h"

namespace ringserve::cuda {

inline constexpr int kFp8Block = 128;

// Floats per row of block scales for k columns: ceil(k / 128) rounded up to a multiple of 4.
inline int64_t Fp8BlockScaleStride(int64_t k) {
  return ((k + kFp8Block - 1) / kFp8Block + 3) / 4 * 4;
}

absl::Status LaunchQuantizeFp8Groups(const bf16* x, uint8_t* codes, float* scales, int m, int k,
                                     LaunchStream stream);

class Fp8BlockGemm {
 public:
  // InvalidArgument-free: fails only when cuBLASLt or the workspace cannot be set up.
  static absl::StatusOr<std::unique_ptr<Fp8BlockGemm>> Create(size_t workspace_bytes = 32 << 20);
  ~Fp8BlockGemm();
  Fp8BlockGemm(const Fp8BlockGemm&) = delete;
  Fp8BlockGemm& operator=(const Fp8BlockGemm&) = delete;

  // Whether this shape runs on this device: cuBLASLt has an algorithm for it with the weights'
  // per-row scales, or with their 128x128 block scales when the weights have them
  // (`block_scales`) (an sm_90 device, k a multiple of 128, n and m multiples of 16 and 4), or
  // the wgmma kernel does (k a multiple of 128, n and m of 4). Caches the plans.
  bool Supported(int m, int n, int k, bool block_scales = false);
  // Supported(m, n, k, w_block_scales != nullptr) must hold; FailedPrecondition otherwise.
  // w_block_scales may be null.
  absl::Status Linear(const uint8_t* x_codes, const float* x_scales, const uint8_t* w_codes,
                      const float* w_row_scales, const float* w_block_scales, bf16* y, int m, int n,
                      int k, LaunchStream stream);
  // Leaves the wgmma kernel out of Supported and Linear (cuBLASLt's modes only).
  void DisableWgmma() { wgmma_ok_ = false; }
  // What ran the last Linear: "cublaslt block", "cublaslt row" (the weight scale layout it
  // read) or "wgmma" (benchmarks, tests).
  const char* last_mode() const;

 private:
  struct Plan;
  Fp8BlockGemm() = default;
  Plan* GetPlan(int m, int n, int k, bool block);
  absl::Status SelfCheck();

  bool WgmmaSupported(int m, int n, int k) const;

  void* handle_ = nullptr;  // cublasLtHandle_t
  DeviceBuffer workspace_;
  bool hopper_ = false;
  enum class Mode { kBlock, kRow, kWgmma } last_ = Mode::kRow;
  bool row_ok_ = false, block_ok_ = false;   // the cuBLASLt scale modes that passed SelfCheck
  bool wgmma_ok_ = false;                    // the wgmma kernel: built, 9.0, passed SelfCheck
  bool missing_logged_[2] = {false, false};  // a shape without a cuBLASLt algorithm, by mode
  std::map<std::tuple<int, int, int, bool>, std::unique_ptr<Plan>> plans_;  // null: unsupported
};

}  // namespace ringserve::cuda
