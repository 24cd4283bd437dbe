// Test helper: how sensitive a reference CPU slice's output is to bf16 noise. Mixture-of-experts
// models amplify it where a router's top-k is a near-tie (a flipped expert moves a whole row, on
// the tiny fixtures by up to 0.26 relative L2), so a GPU slice in bf16 may legitimately land on
// the other side of the tie. The probe runs the same batches on copies of the model whose
// weights carry bf16 noise (rounded to nearest, and stochastically rounded with several seeds:
// bf16_rounded_model.h) and reports, for an output of the reference, the largest relative L2
// any copy shows against it. GPU tests widen their tolerance only to a multiple of that.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/testing/temp_dir.h"
#include "stage/model/cpu_model_slice.h"

namespace ringserve::testing {

class Bf16NoiseProbe {
 public:
  // One copy rounded to nearest and `stochastic_copies` stochastically rounded ones of
  // options.model_dir (a single-file checkpoint), each loaded as a CPU slice with `options`.
  static absl::StatusOr<std::unique_ptr<Bf16NoiseProbe>> Load(const SliceOptions& options,
                                                              int stochastic_copies = 6);

  // Runs `batch` on every copy (their KV caches follow the reference's batches: run every batch
  // the reference runs, in order) and keeps the outputs.
  absl::Status Forward(const MicroBatch& batch);

  // The largest relative L2 between values [begin, end) of `want` (the reference's output of
  // the same batch) and of a copy's last output; end = SIZE_MAX: to the end.
  double Sensitivity(const std::vector<float>& want, size_t begin = 0, size_t end = SIZE_MAX) const;

 private:
  Bf16NoiseProbe() = default;
  std::vector<std::unique_ptr<TempDir>> dirs_;
  std::vector<std::unique_ptr<CpuModelSlice>> copies_;
  std::vector<std::vector<float>> outputs_;
};

}  // namespace ringserve::testing
