#include "ring/sampling_config.h"

#include <cmath>

#include "fmt/format.h"

namespace ringserve {

absl::Status ValidateSamplingConfig(const SamplingConfig& config) {
  if (!(config.temperature >= 0.0f) || !std::isfinite(config.temperature)) {
    return absl::InvalidArgumentError(
        fmt::format("temperature must be >= 0 and finite, got {}", config.temperature));
  }
  if (config.top_k < 0) {
    return absl::InvalidArgumentError(fmt::format("top_k must be >= 0, got {}", config.top_k));
  }
  if (!(config.top_p > 0.0f && config.top_p <= 1.0f)) {
    return absl::InvalidArgumentError(fmt::format("top_p must be in (0, 1], got {}", config.top_p));
  }
  return absl::OkStatus();
}

}  // namespace ringserve
