#include "stage/model/activation_buffer.h"

#include <algorithm>
#include <limits>

#include "common/status_macros.h"
#include "fmt/format.h"

namespace ringserve {

absl::Status ActivationBuffer::CheckHostSpan(size_t size) const {
  if (static_cast<int64_t>(size) != num_values()) {
    return absl::InvalidArgumentError(
        fmt::format("{} hidden values for a buffer of {} tokens x {} (expected {})", size, tokens_,
                    hidden_size_, num_values()));
  }
  return absl::OkStatus();
}

int64_t HostActivationBuffer::max_tokens() const {
  return std::numeric_limits<int64_t>::max() / std::max(1, hidden_size_) / 4;
}

absl::Status HostActivationBuffer::Resize(int64_t tokens) {
  if (tokens < 0 || tokens > max_tokens()) {
    return absl::InvalidArgumentError(fmt::format("cannot hold {} tokens", tokens));
  }
  tokens_ = tokens;
  values_.resize(static_cast<size_t>(num_values()));
  return absl::OkStatus();
}

absl::Status HostActivationBuffer::CopyFromHost(std::span<const float> values) {
  RS_RETURN_IF_ERROR(CheckHostSpan(values.size()));
  std::copy(values.begin(), values.end(), values_.begin());
  return absl::OkStatus();
}

absl::Status HostActivationBuffer::CopyToHost(std::span<float> values) {
  RS_RETURN_IF_ERROR(CheckHostSpan(values.size()));
  std::copy(values_.begin(), values_.end(), values.begin());
  return absl::OkStatus();
}

}  // namespace ringserve
