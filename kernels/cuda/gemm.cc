#include "kernels/cuda/gemm.h"

#include <cublasLt.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ringserve::cuda {

struct GemmRunner::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr;  // w as column-major [k, n], transposed by the op
  cublasLtMatrixLayout_t b = nullptr;  // x as column-major [k, m]
  cublasLtMatrixLayout_t c = nullptr;  // y as column-major [n, m]
  cublasLtMatmulAlgo_t algo{};         // the heuristic's first, or the fastest when tuned
  bool use_gemv = false;               // Linear runs LaunchGemv instead
  int skinny_blocks = 0;               // > 0: Linear runs the skinny GEMM on this many blocks
  bool tuned = false;
  int candidate = 0;  // index of `algo` among the tuning candidates (the heuristic's first)

  ~Plan() {
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

GemmRunner::GemmRunner(const GemmOptions& options) : options_(options) {}

namespace {

absl::Status CheckOptions(const GemmOptions& options) {
  if (options.gemv_max_rows < 0 || options.gemv_max_rows > kGemvMaxRows) {
    return absl::InvalidArgumentError(
        absl::StrCat("gemv_max_rows must be in [0, ", kGemvMaxRows, "]"));
  }
  if (options.skinny_max_rows < 0 || options.skinny_max_rows > kSkinnyMaxRows) {
    return absl::InvalidArgumentError(
        absl::StrCat("skinny_max_rows must be in [0, ", kSkinnyMaxRows, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<GemmRunner>> GemmRunner::Create(const GemmOptions& options) {
  RS_RETURN_IF_ERROR(CheckOptions(options));
  std::unique_ptr<GemmRunner> runner(new GemmRunner(options));
  cublasLtHandle_t handle = nullptr;
  RS_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&handle));
  runner->handle_ = handle;
  RS_RETURN_IF_ERROR(runner->workspace_.Allocate(options.workspace_bytes));
  RS_RETURN_IF_ERROR(runner->Reconfigure(options));
  int device = 0;
  RS_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  RS_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&runner->multiprocessors_, cudaDevAttrMultiProcessorCount, device));
  return runner;
}

GemmRunner::~GemmRunner() {
  plans_.clear();
  if (handle_) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

absl::StatusOr<GemmRunner::Plan*> GemmRunner::GetPlan(int m, int n, int k, OutType out) {
  const auto key = std::make_tuple(m, n, k, static_cast<int>(out));
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second.get();
  std::vector<cublasLtMatmulHeuristicResult_t> results;
  RS_ASSIGN_OR_RETURN(std::unique_ptr<Plan> plan, MakePlan(m, n, k, out, 1, &results));
  return plans_.emplace(key, std::move(plan)).first->second.get();
}

absl::StatusOr<std::unique_ptr<GemmRunner::Plan>> GemmRunner::MakePlan(
    int m, int n, int k, OutType out, int candidates,
    std::vector<cublasLtMatmulHeuristicResult_t>* results) {
  if (m <= 0 || n <= 0 || k <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("bad GEMM shape m=", m, " n=", n, " k=", k));
  }
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
  results->assign(candidates, cublasLtMatmulHeuristicResult_t{});
  int found = 0;
  if (status == CUBLAS_STATUS_SUCCESS) {
    status = cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(handle_), plan->op,
                                            plan->a, plan->b, plan->c, plan->c, pref, candidates,
                                            results->data(), &found);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  RS_CUBLAS_RETURN_IF_ERROR(status);
  if (found == 0) {
    return absl::InternalError(
        absl::StrCat("cuBLASLt found no algorithm for m=", m, " n=", n, " k=", k));
  }
  results->resize(found);
  plan->algo = (*results)[0].algo;
  plan->use_gemv = m <= options_.gemv_max_rows && k % 8 == 0;
  return plan;
}

void GemmRunner::AddLargerShapesCandidates(
    const Plan& plan, int m, int n, int k, OutType out,
    std::vector<cublasLtMatmulHeuristicResult_t>* candidates) {
  if (m > kLargerCandidatesMaxRows) return;
  const auto known = [&](const cublasLtMatmulAlgo_t& algo) {
    for (const auto& c : *candidates) {
      if (std::memcmp(&c.algo, &algo, sizeof(algo)) == 0) return true;
    }
    return false;
  };
  for (const int larger : {2 * m, 4 * m}) {
    std::vector<cublasLtMatmulHeuristicResult_t> more;
    if (!MakePlan(larger, n, k, out, kTuneCandidates, &more).ok()) continue;
    for (const auto& c : more) {
      cublasLtMatmulHeuristicResult_t check{};
      if (c.state != CUBLAS_STATUS_SUCCESS || known(c.algo) ||
          cublasLtMatmulAlgoCheck(static_cast<cublasLtHandle_t>(handle_), plan.op, plan.a, plan.b,
                                  plan.c, plan.c, &c.algo, &check) != CUBLAS_STATUS_SUCCESS ||
          check.workspaceSize > workspace_.bytes()) {
        continue;
      }
      check.algo = c.algo;
      check.state = CUBLAS_STATUS_SUCCESS;
      candidates->push_back(check);
    }
  }
}

absl::Status GemmRunner::Tune(const bf16* x, const bf16* w, void* y, OutType out, int m, int n,
                              int k, LaunchStream stream) {
  const auto key = std::make_tuple(m, n, k, static_cast<int>(out));
  auto it = plans_.find(key);
  if (!options_.tune || (it != plans_.end() && it->second->tuned)) return absl::OkStatus();
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  RS_CUDA_RETURN_IF_ERROR(cudaStreamIsCapturing(stream, &capture));
  if (capture != cudaStreamCaptureStatusNone) {
    return absl::FailedPreconditionError("GEMM tuning on a stream that is being captured");
  }
  std::vector<cublasLtMatmulHeuristicResult_t> candidates;
  RS_ASSIGN_OR_RETURN(std::unique_ptr<Plan> plan,
                      MakePlan(m, n, k, out, kTuneCandidates, &candidates));
  AddLargerShapesCandidates(*plan, m, n, k, out, &candidates);
  if (timer_ == nullptr) {
    RS_ASSIGN_OR_RETURN(timer_, ColdCacheTimer::Create());
  }
  // Microseconds per call of one candidate (-1: it failed): the median of single calls, each
  // with the operands evicted from L2 first (cold_cache_timer.h) unless tune_cold_cache is off.
  auto time = [&](auto&& run) -> float {
    return timer_->MedianUs(run, stream, options_.tune_cold_cache);
  };
  const float gemv =
      plan->use_gemv ? time([&] { return LaunchGemv(x, w, y, out, m, n, k, stream); }) : -1.0f;
  // The skinny GEMM's fastest grid (0: none ran).
  float skinny = -1;
  int skinny_blocks = 0;
  if (m <= options_.skinny_max_rows && skinny_buffer_.get() != nullptr && k % 8 == 0) {
    for (int per_sm = 1; per_sm <= kSkinnyBlocksPerSm; ++per_sm) {
      const int blocks = per_sm * multiprocessors_;
      if (SkinnyPartialFloats(m, n, k, blocks) > skinny_workspace_.partial_floats) break;
      const float us = time([&] { return RunSkinny(blocks, x, w, y, out, m, n, k, stream); });
      if (us >= 0 && (skinny < 0 || us < skinny)) {
        skinny = us;
        skinny_blocks = blocks;
      }
    }
  }
  float best = -1;  // the fastest cuBLASLt candidate (kept in the plan for LinearCublas)
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (candidates[i].state != CUBLAS_STATUS_SUCCESS) continue;
    const float us = time([&] { return RunCublas(*plan, candidates[i].algo, x, w, y, stream); });
    if (us >= 0 && (best < 0 || us < best)) {
      best = us;
      plan->algo = candidates[i].algo;
      plan->candidate = static_cast<int>(i);
    }
  }
  // A timing run that failed left its error with the runtime; report it rather than a plan.
  RS_RETURN_IF_ERROR(LaunchStatus("GEMM tuning"));
  if (best < 0) {
    return absl::InternalError(
        absl::StrCat("no cuBLASLt algorithm ran for m=", m, " n=", n, " k=", k));
  }
  plan->use_gemv = gemv >= 0 && gemv < best && (skinny < 0 || gemv < skinny);
  if (!plan->use_gemv && skinny >= 0 && skinny < best) plan->skinny_blocks = skinny_blocks;
  plan->tuned = true;
  plans_[key] = std::move(plan);
  return absl::OkStatus();
}

absl::Status GemmRunner::RunCublas(const Plan& plan, const cublasLtMatmulAlgo_t& algo,
                                   const bf16* x, const bf16* w, void* y, LaunchStream stream) {
  const float alpha = 1.0f;
  const float beta = 0.0f;
  RS_CUBLAS_RETURN_IF_ERROR(cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), plan.op, &alpha,
                                           w, plan.a, x, plan.b, &beta, y, plan.c, y, plan.c, &algo,
                                           workspace_.get(), workspace_.bytes(), stream));
  return absl::OkStatus();
}

absl::Status GemmRunner::RunSkinny(int blocks, const bf16* x, const bf16* w, void* y, OutType out,
                                   int m, int n, int k, LaunchStream stream) {
  return LaunchSkinnyGemm(x, w, y, out, m, n, k, blocks, skinny_workspace_, stream);
}

std::string GemmRunner::PlanSummary(int m, int n, int k, OutType out) const {
  auto it = plans_.find(std::make_tuple(m, n, k, static_cast<int>(out)));
  if (it == plans_.end()) return "none";
  const Plan& p = *it->second;
  const std::string kernel = p.use_gemv            ? "gemv"
                             : p.skinny_blocks > 0 ? absl::StrCat("skinny x", p.skinny_blocks)
                                                   : absl::StrCat("cublas #", p.candidate);
  return absl::StrCat(kernel, p.tuned ? " (tuned)" : "");
}

absl::Status GemmRunner::Reconfigure(const GemmOptions& options) {
  RS_RETURN_IF_ERROR(CheckOptions(options));
  plans_.clear();
  const size_t workspace_bytes = options_.workspace_bytes;
  options_ = options;
  options_.workspace_bytes = workspace_bytes;
  if (options.skinny_max_rows == 0) {
    skinny_buffer_.Reset();
    skinny_workspace_ = SkinnyWorkspace{};
  } else if (skinny_buffer_.bytes() != options.skinny_workspace_bytes) {
    skinny_workspace_ = SkinnyWorkspace{};
    RS_RETURN_IF_ERROR(AllocateSkinnyWorkspace(options.skinny_workspace_bytes, &skinny_buffer_,
                                               &skinny_workspace_));
  }
  // Tune's timer: made here, before a caller sizes pools from the free memory, when tuning is
  // on from the start; by Tune otherwise.
  if (options.tune && timer_ == nullptr) {
    RS_ASSIGN_OR_RETURN(timer_, ColdCacheTimer::Create());
  }
  return absl::OkStatus();
}

absl::Status GemmRunner::LinearCublas(const bf16* x, const bf16* w, void* y, OutType out, int m,
                                      int n, int k, LaunchStream stream) {
  RS_ASSIGN_OR_RETURN(Plan * plan, GetPlan(m, n, k, out));
  // The plan's cuBLASLt algorithm, even when the plan prefers the GEMV or the skinny GEMM.
  return RunCublas(*plan, plan->algo, x, w, y, stream);
}

absl::Status GemmRunner::Linear(const bf16* x, const bf16* w, void* y, OutType out, int m, int n,
                                int k, LaunchStream stream) {
  RS_ASSIGN_OR_RETURN(Plan * plan, GetPlan(m, n, k, out));
  if (plan->use_gemv) return LaunchGemv(x, w, y, out, m, n, k, stream);
  if (plan->skinny_blocks > 0) return RunSkinny(plan->skinny_blocks, x, w, y, out, m, n, k, stream);
  return RunCublas(*plan, plan->algo, x, w, y, stream);
}

}  // namespace ringserve::cuda
