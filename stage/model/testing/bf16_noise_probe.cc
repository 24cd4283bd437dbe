#include "stage/model/testing/bf16_noise_probe.h"

#include <algorithm>
#include <cmath>

#include "common/status_macros.h"
#include "stage/model/testing/bf16_rounded_model.h"

namespace ringserve::testing {

absl::StatusOr<std::unique_ptr<Bf16NoiseProbe>> Bf16NoiseProbe::Load(const SliceOptions& options,
                                                                     int stochastic_copies) {
  std::unique_ptr<Bf16NoiseProbe> probe(new Bf16NoiseProbe());
  for (int seed = 0; seed <= stochastic_copies; ++seed) {
    probe->dirs_.push_back(std::make_unique<TempDir>());
    const std::string& dir = probe->dirs_.back()->path();
    RS_RETURN_IF_ERROR(WriteBf16RoundedModel(options.model_dir, dir, seed));
    SliceOptions copy = options;
    copy.model_dir = dir;
    RS_ASSIGN_OR_RETURN(std::unique_ptr<CpuModelSlice> slice, CpuModelSlice::Load(copy));
    probe->copies_.push_back(std::move(slice));
  }
  probe->outputs_.resize(probe->copies_.size());
  return probe;
}

absl::Status Bf16NoiseProbe::Forward(const MicroBatch& batch) {
  for (size_t i = 0; i < copies_.size(); ++i) {
    RS_ASSIGN_OR_RETURN(outputs_[i], copies_[i]->Forward(batch, {}));
  }
  return absl::OkStatus();
}

double Bf16NoiseProbe::Sensitivity(const std::vector<float>& want, size_t begin, size_t end) const {
  end = std::min(end, want.size());
  double worst = 0;
  for (const std::vector<float>& got : outputs_) {
    if (got.size() != want.size()) return 0;  // not the same batch: no widening
    double num = 0, den = 0;
    for (size_t i = begin; i < end; ++i) {
      const double d = double(got[i]) - want[i];
      num += d * d;
      den += double(want[i]) * want[i];
    }
    worst = std::max(worst, den > 0 ? std::sqrt(num / den) : std::sqrt(num));
  }
  return worst;
}

}  // namespace ringserve::testing
