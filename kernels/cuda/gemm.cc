#include "kernels/cuda/gemm.h"

#include <cublasLt.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ringserve::cuda {

struct GemmRunner::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr;  // w as column-major [k, n], transposed by the op
  cublasLtMatrixLayout_t b = nullptr;  // x as column-major [k, m]
  cublasLtMatrixLayout_t c = nullptr;  // y as column-major [n, m]
  cublasLtMatmulAlgo_t algo{};

  ~Plan() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

GemmRunner::GemmRunner(const GemmOptions& options) : options_(options) {}

absl::StatusOr<std::unique_ptr<GemmRunner>> GemmRunner::Create(const GemmOptions& options) {
  if (options.gemv_max_rows < 0 || options.gemv_max_rows > kGemvMaxRows) {
    return absl::InvalidArgumentError(
        absl::StrCat("gemv_max_rows must be in [0, ", kGemvMaxRows, "]"));
  }
  std::unique_ptr<GemmRunner> runner(new GemmRunner(options));
  cublasLtHandle_t handle = nullptr;
  RS_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&handle));
  runner->handle_ = handle;
  RS_RETURN_IF_ERROR(runner->workspace_.Allocate(options.workspace_bytes));
  return runner;
}

GemmRunner::~GemmRunner() {
  plans_.clear();
  if (handle_) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

absl::StatusOr<GemmRunner::Plan*> GemmRunner::GetPlan(int m, int n, int k, OutType out) {
  auto key = std::make_tuple(m, n, k, static_cast<int>(out));
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second.get();

  // Row-major y[m,n] = x[m,k] w[n,k]^T is column-major y^T[n,m] = w^T... : C(n x m) = op(A)(n x k)
  // * B(k x m) with A = w (column-major [k, n], transposed) and B = x (column-major [k, m]).
  auto plan = std::make_unique<Plan>();
  const cudaDataType_t c_type = out == OutType::kF32 ? CUDA_R_32F : CUDA_R_16BF;
  RS_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t trans_a = CUBLAS_OP_T;
  const cublasOperation_t trans_b = CUBLAS_OP_N;
  RS_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA,
                                                           &trans_a, sizeof(trans_a)));
  RS_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB,
                                                           &trans_b, sizeof(trans_b)));
  RS_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_16BF, k, n, k));
  RS_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_16BF, k, m, k));
  RS_CUBLAS_RETURN_IF_ERROR(cublasLtMatrixLayoutCreate(&plan->c, c_type, n, m, n));

  cublasLtMatmulPreference_t pref = nullptr;
  RS_CUBLAS_RETURN_IF_ERROR(cublasLtMatmulPreferenceCreate(&pref));
  const size_t workspace = workspace_.bytes();
  cublasStatus_t status = cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  if (status == CUBLAS_STATUS_SUCCESS) {
    status =
        cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(handle_), plan->op, plan->a,
                                       plan->b, plan->c, plan->c, pref, 1, &result, &found);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  RS_CUBLAS_RETURN_IF_ERROR(status);
  if (found == 0) {
    return absl::InternalError(
        absl::StrCat("cuBLASLt found no algorithm for m=", m, " n=", n, " k=", k));
  }
  plan->algo = result.algo;
  Plan* raw = plan.get();
  plans_.emplace(key, std::move(plan));
  return raw;
}

absl::Status GemmRunner::LinearCublas(const bf16* x, const bf16* w, void* y, OutType out, int m,
                                      int n, int k, cudaStream_t stream) {
  if (m <= 0 || n <= 0 || k <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("bad GEMM shape m=", m, " n=", n, " k=", k));
  }
  RS_ASSIGN_OR_RETURN(Plan * plan, GetPlan(m, n, k, out));
  const float alpha = 1.0f;
  const float beta = 0.0f;
  RS_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(
      static_cast<cublasLtHandle_t>(handle_), plan->op, &alpha, w, plan->a, x, plan->b, &beta, y,
      plan->c, y, plan->c, &plan->algo, workspace_.get(), workspace_.bytes(), stream));
  return absl::OkStatus();
}

absl::Status GemmRunner::Linear(const bf16* x, const bf16* w, void* y, OutType out, int m, int n,
                                int k, cudaStream_t stream) {
  if (m <= options_.gemv_max_rows && k % 8 == 0) {
    return LaunchGemv(x, w, y, out, m, n, k, stream);
  }
  return LinearCublas(x, w, y, out, m, n, k, stream);
}

}  // namespace ringserve::cuda
