#include "kernels/cuda/fp8_block_gemm.h"

#include <cublasLt.h>

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "kernels/cuda/fp8_gemm_sm90.h"

namespace ringserve::cuda {

struct Fp8BlockGemm::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr;  // W codes as column-major [k, n], transposed by the op
  cublasLtMatrixLayout_t b = nullptr;  // x codes as column-major [k, m]
  cublasLtMatrixLayout_t c = nullptr;  // y as column-major [n, m], bf16
  cublasLtMatmulAlgo_t algo{};

  ~Plan() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

absl::StatusOr<std::unique_ptr<Fp8BlockGemm>> Fp8BlockGemm::Create(size_t workspace_bytes) {
  std::unique_ptr<Fp8BlockGemm> gemm(new Fp8BlockGemm());
  cublasLtHandle_t handle = nullptr;
  RS_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&handle));
  gemm->handle_ = handle;
  RS_RETURN_IF_ERROR(gemm->workspace_.Allocate(workspace_bytes));
  int device = 0, major = 0, minor = 0;
  RS_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  RS_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  RS_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  // The block-scaled modes are Hopper's (cuBLASLt 12.9+), the wgmma kernel 9.0's (sm_90a code);
  // other GPUs take the caller's path.
  gemm->hopper_ = major == 9;
#if defined(RS_HAVE_SM90_PREFILL)
  if (major == 9 && minor == 0) {
    RS_RETURN_IF_ERROR(PrepareFp8BlockGemmSm90());
    gemm->wgmma_ok_ = true;  // until SelfCheck says otherwise
  }
#endif
  if (gemm->hopper_) RS_RETURN_IF_ERROR(gemm->SelfCheck());
  return gemm;
}

absl::Status Fp8BlockGemm::SelfCheck() {
  // y = x · W^T with W all ones (e4m3 0x38) scaled per row r and group g by (1 + r / 64)(g + 1)
  // (per row), or by (g + 1) / 2 (per block); x[t] = (t + 1) / 4 in the first 128 columns and
  // -(t + 1) / 2 in the next, quantized exactly (codes +-448). Expected: y[t][r] =
  // -96 (t + 1)(1 + r / 64) per row, -48 (t + 1) per block.
  constexpr int m = 16, n = 128, k = 256, groups = k / kFp8Block;
  const std::vector<uint8_t> w_codes(n * k, 0x38);
  std::vector<float> row_scales(groups * n), block_scales(Fp8BlockScaleStride(k), 0.0f);
  for (int g = 0; g < groups; ++g) {
    for (int r = 0; r < n; ++r) row_scales[g * n + r] = (1.0f + r / 64.0f) * (g + 1);
    block_scales[g] = 0.5f * (g + 1);
  }
  std::vector<uint16_t> x(m * k);
  for (int t = 0; t < m; ++t) {
    for (int c = 0; c < k; ++c) {
      x[t * k + c] = FloatToBF16(c < kFp8Block ? 0.25f * (t + 1) : -0.5f * (t + 1));
    }
  }
  DeviceBuffer dw, drs, dbs, dx, dxc, dxs, dy;
  RS_RETURN_IF_ERROR(dw.Allocate(w_codes.size()));
  RS_RETURN_IF_ERROR(drs.Allocate(row_scales.size() * 4));
  RS_RETURN_IF_ERROR(dbs.Allocate(block_scales.size() * 4));
  RS_RETURN_IF_ERROR(dx.Allocate(x.size() * 2));
  RS_RETURN_IF_ERROR(dxc.Allocate(m * k));
  RS_RETURN_IF_ERROR(dxs.Allocate(m * groups * 4));
  RS_RETURN_IF_ERROR(dy.Allocate(m * n * 2));
  RS_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(dw.get(), w_codes.data(), w_codes.size(), cudaMemcpyHostToDevice));
  RS_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(drs.get(), row_scales.data(), row_scales.size() * 4, cudaMemcpyHostToDevice));
  RS_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(dbs.get(), block_scales.data(), block_scales.size() * 4, cudaMemcpyHostToDevice));
  RS_CUDA_RETURN_IF_ERROR(cudaMemcpy(dx.get(), x.data(), x.size() * 2, cudaMemcpyHostToDevice));
  RS_RETURN_IF_ERROR(
      LaunchQuantizeFp8Groups(dx.as<bf16>(), dxc.as<uint8_t>(), dxs.as<float>(), m, k, nullptr));
  // Each mode alone: cuBLASLt's per-row, its per-block, then the wgmma kernel (per-row scales).
  const bool wgmma_built = wgmma_ok_;
  bool checked[3] = {true, true, true};  // by Mode
  for (const Mode mode : {Mode::kRow, Mode::kBlock, Mode::kWgmma}) {
    const bool block = mode == Mode::kBlock;
    row_ok_ = mode == Mode::kRow;
    block_ok_ = block;
    wgmma_ok_ = mode == Mode::kWgmma && wgmma_built;
    if (mode != Mode::kWgmma ? GetPlan(m, n, k, block) == nullptr : !wgmma_ok_) {
      checked[static_cast<int>(mode)] = false;
      continue;
    }
    bool& ok = checked[static_cast<int>(mode)];
    RS_RETURN_IF_ERROR(Linear(dxc.as<uint8_t>(), dxs.as<float>(), dw.as<uint8_t>(), drs.as<float>(),
                              block ? dbs.as<float>() : nullptr, dy.as<bf16>(), m, n, k, nullptr));
    RS_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
    std::vector<uint16_t> y(m * n);
    RS_CUDA_RETURN_IF_ERROR(cudaMemcpy(y.data(), dy.get(), y.size() * 2, cudaMemcpyDeviceToHost));
    for (int t = 0; t < m && ok; ++t) {
      for (int r = 0; r < n && ok; ++r) {
        const float want = block ? -48.0f * (t + 1) : -96.0f * (t + 1) * (1.0f + r / 64.0f);
        ok = std::fabs(BF16ToFloat(y[t * n + r]) - want) <= 0.01f * std::fabs(want);
      }
    }
    if (!ok) {
      RS_LOG_WARN("the FP8 GEMM {} failed its check: not used",
                  mode == Mode::kWgmma ? "wgmma kernel"
                                       : (block ? "of cuBLASLt with 128x128 block scales"
                                                : "of cuBLASLt with per-row scales"));
    }
  }
  row_ok_ = checked[static_cast<int>(Mode::kRow)];
  block_ok_ = checked[static_cast<int>(Mode::kBlock)];
  wgmma_ok_ = checked[static_cast<int>(Mode::kWgmma)];
  plans_.clear();  // the check's shape only, and made while one mode was on
  return absl::OkStatus();
}

Fp8BlockGemm::~Fp8BlockGemm() {
  plans_.clear();
  if (handle_) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

Fp8BlockGemm::Plan* Fp8BlockGemm::GetPlan(int m, int n, int k, bool block) {
  const auto key = std::make_tuple(m, n, k, block);
  if (auto it = plans_.find(key); it != plans_.end()) return it->second.get();
  std::unique_ptr<Plan>& slot = plans_[key];
  if (!hopper_ || !(block ? block_ok_ : row_ok_) || m < 1 || n < 16 || k < kFp8Block ||
      k % kFp8Block != 0 || n % 16 != 0 || m % 4 != 0) {
    return nullptr;
  }
  auto plan = std::make_unique<Plan>();
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  const int32_t a_mode =
      block ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  const int32_t b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  const void* placeholder_scales = workspace_.get();
  auto set = [&](cublasLtMatmulDescAttributes_t attr, const void* value, size_t size) {
    return cublasLtMatmulDescSetAttribute(plan->op, attr, value, size) == CUBLAS_STATUS_SUCCESS;
  };
  if (cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F) !=
          CUBLAS_STATUS_SUCCESS ||
      !set(CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)) ||
      !set(CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)) ||
      !set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode, sizeof(a_mode)) ||
      !set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode, sizeof(b_mode)) ||
      // The scale pointers are set again on every call; the heuristic is asked with some set
      // (a block-scaled mode without its scales has no algorithm).
      !set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &placeholder_scales, sizeof(placeholder_scales)) ||
      !set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &placeholder_scales, sizeof(placeholder_scales)) ||
      cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_8F_E4M3, k, n, k) != CUBLAS_STATUS_SUCCESS ||
      cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_8F_E4M3, k, m, k) != CUBLAS_STATUS_SUCCESS ||
      cublasLtMatrixLayoutCreate(&plan->c, CUDA_R_16BF, n, m, n) != CUBLAS_STATUS_SUCCESS) {
    return nullptr;
  }
  cublasLtMatmulPreference_t pref = nullptr;
  if (cublasLtMatmulPreferenceCreate(&pref) != CUBLAS_STATUS_SUCCESS) return nullptr;
  const size_t workspace = workspace_.bytes();
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  cublasStatus_t status = cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace));
  if (status == CUBLAS_STATUS_SUCCESS) {
    status =
        cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(handle_), plan->op, plan->a,
                                       plan->b, plan->c, plan->c, pref, 1, &result, &found);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  if (status != CUBLAS_STATUS_SUCCESS || found == 0) {
    bool& logged = missing_logged_[block ? 1 : 0];  // once per mode: prefill sizes vary
    if (!logged) {
      logged = true;
      RS_LOG_INFO(
          "cuBLASLt has no FP8 GEMM with {} scales for m={} n={} k={} (status {}, {} found)",
          block ? "128x128 block" : "per-row 1x128", m, n, k, static_cast<int>(status), found);
    }
    return nullptr;
  }
  plan->algo = result.algo;
  slot = std::move(plan);
  return slot.get();
}

bool Fp8BlockGemm::WgmmaSupported(int m, int n, int k) const {
  return wgmma_ok_ && m >= 4 && n >= 4 && k >= kFp8Block && m % 4 == 0 && n % 4 == 0 &&
         k % kFp8Block == 0;
}

bool Fp8BlockGemm::Supported(int m, int n, int k, bool block_scales) {
  return (block_scales && GetPlan(m, n, k, true) != nullptr) ||
         GetPlan(m, n, k, false) != nullptr || WgmmaSupported(m, n, k);
}

const char* Fp8BlockGemm::last_mode() const {
  switch (last_) {
    case Mode::kBlock:
      return "cublaslt block";
    case Mode::kRow:
      return "cublaslt row";
    case Mode::kWgmma:
      return "wgmma";
  }
  return "";
}

absl::Status Fp8BlockGemm::Linear(const uint8_t* x_codes, const float* x_scales,
                                  const uint8_t* w_codes, const float* w_row_scales,
                                  const float* w_block_scales, bf16* y, int m, int n, int k,
                                  LaunchStream stream) {
  Plan* plan = w_block_scales != nullptr ? GetPlan(m, n, k, true) : nullptr;
  last_ = plan != nullptr ? Mode::kBlock : Mode::kRow;
  const float* w_scales = plan != nullptr ? w_block_scales : w_row_scales;
  if (plan == nullptr) plan = GetPlan(m, n, k, false);
  if (plan == nullptr && WgmmaSupported(m, n, k)) {
    last_ = Mode::kWgmma;
    return LaunchFp8BlockGemmSm90({.x_codes = x_codes,
                                   .x_scales = x_scales,
                                   .w_codes = w_codes,
                                   .w_scales = w_row_scales,
                                   .y = y,
                                   .m = m,
                                   .n = n,
                                   .k = k},
                                  stream);
  }
  if (plan == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("no FP8 block-scaled GEMM for m=", m, " n=", n, " k=", k));
  }
  RS_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      plan->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scales, sizeof(w_scales)));
  RS_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(
      plan->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scales, sizeof(x_scales)));
  const float alpha = 1.0f, beta = 0.0f;
  RS_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(
      static_cast<cublasLtHandle_t>(handle_), plan->op, &alpha, w_codes, plan->a, x_codes, plan->b,
      &beta, y, plan->c, y, plan->c, &plan->algo, workspace_.get(), workspace_.bytes(), stream));
  return absl::OkStatus();
}

}  // namespace ringserve::cuda
