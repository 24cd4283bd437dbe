// Dense linear layers, y = x · W^T, bf16 operands with fp32 accumulation.
//
// Layouts (all row-major, device memory):
//   x: [m, k] bf16 (activations, m = tokens)
//   w: [n, k] bf16 (the checkpoint's nn.Linear layout: out_features x in_features)
//   y: [m, n] bf16 or fp32
// Each (m, n, k, output dtype) gets a plan, cached: cuBLASLt's matmul descriptors, layouts and
// algorithm, our own memory-bound GEMV kernel (gemv.cu), or our skinny tensor-core GEMM
// (skinny_gemm.h) with a chosen grid size.
//   - Tune() times cuBLASLt's candidate algorithms (up to kTuneCandidates from its heuristic,
//     and at m <= kLargerCandidatesMaxRows those it proposes for 2m and 4m rows that also fit m),
//     for m <= gemv_max_rows our GEMV, and for m <= skinny_max_rows the skinny GEMM with 1 to
//     kSkinnyBlocksPerSm blocks per multiprocessor, on the given operands, each call with the
//     operands evicted from L2 first (cold_cache_timer.h), and keeps the fastest. The
//     CUDA slice tunes the shapes of a decode batch size before it captures its graph: the
//     heuristic's first choice is not the fastest for small m (on an H200 it read the qkv and o
//     matrices of a Llama-3.1-8B shape at 56-70% of copy bandwidth at m = 32).
//   - A shape first seen by Linear (prefill, untuned batch sizes) uses the heuristic's first
//     algorithm, or the GEMV when m <= gemv_max_rows.
//
// Thread-safety: a GemmRunner is used by one thread at a time (it owns a cuBLASLt handle, a
// workspace and the plan cache). Linear and LinearCublas are asynchronous on the given stream
// and capturable in a CUDA graph; Tune waits for its timing runs and refuses a capturing
// stream.
#pragma once

#include <cublasLt.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/cold_cache_timer.h"
#include "kernels/cuda/cuda_utils.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/kernel_selector.h"
#include "kernels/cuda/skinny_gemm.h"

namespace ringserve::cuda {

struct GemmOptions {
  size_t workspace_bytes = size_t{64} << 20;
  // Untuned shapes with m <= gemv_max_rows use LaunchGemv; tuning considers it for those m
  // (0 disables it; at most kGemvMaxRows).
  int gemv_max_rows = 1;
  // Tuning also times the skinny GEMM for m <= skinny_max_rows (0, the default, disables it; at
  // most kSkinnyMaxRows). Untuned shapes never use it. Its workspace is allocated only while
  // this is > 0.
  int skinny_max_rows = 0;
  // The skinny GEMM's partial sums and counters (skinny_gemm.h); grids that need more are not
  // tuned.
  size_t skinny_workspace_bytes = size_t{40} << 20;
  // false: Tune() does nothing (every shape keeps the heuristic's first algorithm).
  bool tune = true;
  // true: Tune times each call with the operands evicted from L2 first (cold_cache_timer.h);
  // false: with them left there by the call before (for A/B measurements).
  bool tune_cold_cache = true;
};

// The runner's options for a KernelPlan's GEMM choices (kernel_selector.h).
inline GemmOptions GemmOptionsFor(const GemmPlan& plan) {
  GemmOptions options;
  options.gemv_max_rows = plan.gemv_max_rows;
  options.skinny_max_rows = plan.skinny_max_rows;
  if (plan.skinny_max_rows > 0) options.skinny_workspace_bytes = plan.skinny_workspace_bytes;
  options.tune = plan.tune;
  options.tune_cold_cache = plan.tune_cold_cache;
  return options;
}

// cuBLASLt algorithms timed per tuned shape (the heuristic's best first).
inline constexpr int kTuneCandidates = 12;
// Tuned shapes with at most this many rows also time the candidates proposed for 2m and 4m rows.
inline constexpr int kLargerCandidatesMaxRows = 64;
// Tuning times the skinny GEMM with 1 to this many blocks per multiprocessor.
inline constexpr int kSkinnyBlocksPerSm = 4;

class GemmRunner {
 public:
  static absl::StatusOr<std::unique_ptr<GemmRunner>> Create(const GemmOptions& options = {});
  ~GemmRunner();
  GemmRunner(const GemmRunner&) = delete;
  GemmRunner& operator=(const GemmRunner&) = delete;

  // y = x · w^T as above (any m >= 1; k and n multiples of 8; 16-byte aligned pointers).
  absl::Status Linear(const bf16* x, const bf16* w, void* y, OutType out, int m, int n, int k,
                      LaunchStream stream);
  // Makes the shape's plan the fastest of the candidates, timed on these operands (y is
  // overwritten; x and w only read). Waits for the stream. Does nothing for a shape already
  // tuned, or when tuning is off; FailedPrecondition while `stream` is being captured.
  absl::Status Tune(const bf16* x, const bf16* w, void* y, OutType out, int m, int n, int k,
                    LaunchStream stream);
  // Always cuBLASLt, with the plan's algorithm (for benchmarks and tests of both paths).
  absl::Status LinearCublas(const bf16* x, const bf16* w, void* y, OutType out, int m, int n, int k,
                            LaunchStream stream);

  // Which kernel a shape's plan uses, if it has one: "gemv", "skinny xb" (b blocks),
  // "cublas #i" (the i-th tuning candidate; 0 is the heuristic's first) and whether it was tuned.
  // For benchmarks and tests.
  std::string PlanSummary(int m, int n, int k, OutType out) const;

  // New kernel options (workspace_bytes is kept from Create): drops the plans (CUDA graphs
  // captured before keep their kernels) and allocates the skinny GEMM's workspace when it is
  // turned on (frees it when off). InvalidArgument for options Create refuses.
  absl::Status Reconfigure(const GemmOptions& options);
  const GemmOptions& options() const { return options_; }

 private:
  struct Plan;
  explicit GemmRunner(const GemmOptions& options);
  // The cached plan of a shape, or a new one with up to `candidates` heuristic results.
  absl::StatusOr<Plan*> GetPlan(int m, int n, int k, OutType out);
  absl::StatusOr<std::unique_ptr<Plan>> MakePlan(
      int m, int n, int k, OutType out, int candidates,
      std::vector<cublasLtMatmulHeuristicResult_t>* results);
  // Tune's extra cuBLASLt candidates at decode sizes: the heuristic's algorithms for 2m and 4m
  // rows that also run this shape (on an H200 the o projection took 9.2-9.9 us at m = 64 against
  // 12.4-14.5 us for the best of m = 32's own candidates; decode at 32 streams did not move
  // beyond noise with them).
  void AddLargerShapesCandidates(const Plan& plan, int m, int n, int k, OutType out,
                                 std::vector<cublasLtMatmulHeuristicResult_t>* candidates);
  absl::Status RunCublas(const Plan& plan, const cublasLtMatmulAlgo_t& algo, const bf16* x,
                         const bf16* w, void* y, LaunchStream stream);
  absl::Status RunSkinny(int blocks, const bf16* x, const bf16* w, void* y, OutType out, int m,
                         int n, int k, LaunchStream stream);

  GemmOptions options_;
  void* handle_ = nullptr;  // cublasLtHandle_t
  DeviceBuffer workspace_;
  DeviceBuffer skinny_buffer_;
  SkinnyWorkspace skinny_workspace_;
  int multiprocessors_ = 0;
  std::unique_ptr<ColdCacheTimer> timer_;  // Tune's
  std::map<std::tuple<int, int, int, int>, std::unique_ptr<Plan>> plans_;
};

}  // namespace ringserve::cuda
