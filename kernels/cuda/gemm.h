// Dense linear layers, y = x · W^T, bf16 operands with fp32 accumulation.
//
// Layouts (all row-major, device memory):
//   x: [m, k] bf16 (activations, m = tokens)
//   w: [n, k] bf16 (the checkpoint's nn.Linear layout: out_features x in_features)
//   y: [m, n] bf16 or fp32
// Small m (decode) goes to our own memory-bound GEMV kernel (gemv.cu) when m <= the runner's
// gemv_max_rows; everything else to cuBLASLt, whose matmul descriptors, layouts and the
// heuristic's algorithm are computed once per (m, n, k, output dtype) and cached.
//
// Thread-safety: a GemmRunner is used by one thread at a time (it owns a cuBLASLt handle, a
// workspace and the plan cache). Calls are asynchronous on the given stream and capturable in a
// CUDA graph once the shape's plan is cached (the first call of a shape queries the heuristic on
// the host, which is also capture-safe).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "absl/status/statusor.h"
#include "kernels/cuda/cuda_utils.h"
#include "kernels/cuda/gemv.h"

namespace ringserve::cuda {

struct GemmOptions {
  size_t workspace_bytes = size_t{64} << 20;
  // m <= gemv_max_rows uses LaunchGemv (0 disables it; at most kGemvMaxRows).
  int gemv_max_rows = 1;
};

class GemmRunner {
 public:
  static absl::StatusOr<std::unique_ptr<GemmRunner>> Create(const GemmOptions& options = {});
  ~GemmRunner();
  GemmRunner(const GemmRunner&) = delete;
  GemmRunner& operator=(const GemmRunner&) = delete;

  // y = x · w^T as above (any m >= 1; k and n multiples of 8; 16-byte aligned pointers).
  absl::Status Linear(const bf16* x, const bf16* w, void* y, OutType out, int m, int n, int k,
                      cudaStream_t stream);
  // Always cuBLASLt (for benchmarks and tests of both paths).
  absl::Status LinearCublas(const bf16* x, const bf16* w, void* y, OutType out, int m, int n, int k,
                            cudaStream_t stream);

  int gemv_max_rows() const { return options_.gemv_max_rows; }
  void set_gemv_max_rows(int rows) { options_.gemv_max_rows = rows; }

 private:
  struct Plan;
  explicit GemmRunner(const GemmOptions& options);
  absl::StatusOr<Plan*> GetPlan(int m, int n, int k, OutType out);

  GemmOptions options_;
  void* handle_ = nullptr;  // cublasLtHandle_t
  DeviceBuffer workspace_;
  std::map<std::tuple<int, int, int, int>, std::unique_ptr<Plan>> plans_;
};

}  // namespace ringserve::cuda
