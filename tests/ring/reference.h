// The single-process reference for ring tests: the whole model as one ModelSlice in this
// process, generating token by token with the same sampler the last stage uses.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "stage/model/model_slice.h"
#include "stage/sampling/sampler.h"

namespace ringserve::testing {

class Reference {
 public:
  static absl::StatusOr<std::unique_ptr<Reference>> Load(const std::string& model_dir);

  // `max_tokens` tokens after `prompt` (no EOS stop), sampled with `config` (temperature 0 =
  // greedy), token i drawn with token_index i.
  absl::StatusOr<std::vector<int32_t>> Generate(const std::vector<int32_t>& prompt, int max_tokens,
                                                const SamplingConfig& config = {});
  const ModelConfig& config() const { return slice_->config(); }

 private:
  std::unique_ptr<ModelSlice> slice_;
};

}  // namespace ringserve::testing
