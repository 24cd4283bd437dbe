#include "stage/model/model_slice.h"

#include "common/status_macros.h"
#include "fmt/format.h"

namespace ringserve {

absl::Status ModelSlice::SampleAsync(const MicroBatch&, std::span<const RowSampling>) {
  return absl::UnimplementedError("this slice samples synchronously only");
}

absl::StatusOr<SampledRows> ModelSlice::WaitSample() {
  return absl::UnimplementedError("this slice samples synchronously only");
}

absl::Status ModelSlice::PrepareFed(const MicroBatch&, std::span<const TokenFeed>) {
  return absl::UnimplementedError("this slice takes no tokens from the device");
}

absl::StatusOr<std::vector<float>> ModelSlice::Forward(const MicroBatch& batch,
                                                       std::span<const float> hidden_in) {
  RS_RETURN_IF_ERROR(Prepare(batch));
  ActivationBuffer& buffer = activations();
  if (!is_first()) {
    const int64_t total = batch.TotalTokens();
    const int hidden = config().hidden_size;
    if (static_cast<int64_t>(hidden_in.size()) != total * hidden) {
      return absl::InvalidArgumentError(
          fmt::format("hidden_in has {} floats, expected {} tokens x hidden {} = {}",
                      hidden_in.size(), total, hidden, total * hidden));
    }
    RS_RETURN_IF_ERROR(buffer.CopyFromHost(hidden_in));
  }
  RS_RETURN_IF_ERROR(Run(batch));
  if (is_last()) return LogitsToHost();
  std::vector<float> out(static_cast<size_t>(buffer.num_values()));
  RS_RETURN_IF_ERROR(buffer.CopyToHost(out));
  return out;
}

}  // namespace ringserve
