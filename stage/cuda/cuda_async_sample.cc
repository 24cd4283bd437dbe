// CudaModelSlice's sampling slots: Sample (one slot, collected at once) and SampleAsync (left in
// flight, collected by WaitSample), and PrepareFed, whose step takes the newest sampling's
// tokens on the device (model_slice.h has the contract).
#include "common/status_macros.h"
#include "fmt/format.h"
#include "stage/cuda/cuda_model_slice.h"
#include "stage/cuda/cuda_slice_plan.h"

namespace ringserve::cuda {

absl::Status CudaModelSlice::EnqueueGpuSample(const Plan& plan, std::span<const RowSampling> rows) {
  if (samples_in_flight_ >= kMaxSamplesInFlight) {
    return absl::FailedPreconditionError(
        fmt::format("{} samplings wait to be collected", samples_in_flight_));
  }
  SampleSlot& slot = sample_slots_[(oldest_sample_ + samples_in_flight_) % kMaxSamplesInFlight];
  // Every logits row gets parameters (padding rows: greedy); the chosen rows are picked after.
  const int64_t n = plan.logit_rows;
  for (int64_t r = 0; r < n; ++r) slot.params[r] = GpuRowSampling{};
  for (size_t i = 0; i < rows.size(); ++i) {
    const SamplingConfig& c = rows[i].config;
    slot.params[plan.output_rows[i]] = GpuRowSampling{.temperature = c.temperature,
                                                      .top_k = c.top_k,
                                                      .top_p = c.top_p,
                                                      .seed = c.seed,
                                                      .token_index = rows[i].token_index};
  }
  RS_CUDA_RETURN_IF_ERROR(cudaSetDevice(cuda_.device));
  if (n > 0) {
    RS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(sample_params_.get(), slot.params,
                                            n * sizeof(GpuRowSampling), cudaMemcpyHostToDevice,
                                            stream_));
    RS_RETURN_IF_ERROR(LaunchSampleRows(logits_.as<float>(), static_cast<int>(n),
                                        config_.vocab_size, sample_params_.as<GpuRowSampling>(),
                                        tokens_.as<int32_t>(), logprobs_.as<float>(), nullptr, 0,
                                        stream_));
    RS_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(slot.tokens, tokens_.get(), n * 4, cudaMemcpyDeviceToHost, stream_));
    RS_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(slot.logprobs, logprobs_.get(), n * 4, cudaMemcpyDeviceToHost, stream_));
  }
  RS_CUDA_RETURN_IF_ERROR(cudaEventRecord(slot.copied, stream_));
  slot.output_rows.assign(plan.output_rows.begin(), plan.output_rows.end());
  ++samples_in_flight_;
  return absl::OkStatus();
}

absl::StatusOr<SampledRows> CudaModelSlice::CollectOldestSample() {
  if (samples_in_flight_ == 0) {
    return absl::FailedPreconditionError("no sampling in flight to collect");
  }
  SampleSlot& slot = sample_slots_[oldest_sample_];
  oldest_sample_ = (oldest_sample_ + 1) % kMaxSamplesInFlight;
  --samples_in_flight_;
  RS_CUDA_RETURN_IF_ERROR(cudaSetDevice(cuda_.device));
  RS_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(slot.copied));
  SampledRows out;
  out.tokens.reserve(slot.output_rows.size());
  out.logprobs.reserve(slot.output_rows.size());
  for (int r : slot.output_rows) {
    out.tokens.push_back(slot.tokens[r]);
    out.logprobs.push_back(slot.logprobs[r]);
  }
  return out;
}

absl::Status CudaModelSlice::SampleAsync(const MicroBatch& batch,
                                         std::span<const RowSampling> rows) {
  if (!can_sample_async()) {
    return absl::FailedPreconditionError(
        "SampleAsync needs a slice that is first and last and samples on the GPU");
  }
  if (samples_in_flight_ >= kMaxSamplesInFlight) {
    return absl::FailedPreconditionError(
        fmt::format("SampleAsync: {} samplings wait to be collected", samples_in_flight_));
  }
  RS_ASSIGN_OR_RETURN(const PlanPtr plan, TakeRunPlan(batch, rows, "SampleAsync"));
  if (rows.size() != plan->output_rows.size()) {
    return absl::InvalidArgumentError(
        fmt::format("{} sampling rows for {} logits rows", rows.size(), plan->output_rows.size()));
  }
  RS_RETURN_IF_ERROR(EnqueueGpuSample(*plan, rows));
  fed_rows_.assign(plan->output_rows.begin(), plan->output_rows.end());
  fed_rows_valid_ = true;
  return absl::OkStatus();
}

bool CudaModelSlice::SampleReady() {
  if (samples_in_flight_ == 0) return true;
  cudaSetDevice(cuda_.device);
  // cudaErrorNotReady while pending; any other error is reported by WaitSample's synchronize.
  return cudaEventQuery(sample_slots_[oldest_sample_].copied) != cudaErrorNotReady;
}

absl::StatusOr<SampledRows> CudaModelSlice::WaitSample() { return CollectOldestSample(); }

absl::Status CudaModelSlice::PrepareFed(const MicroBatch& batch, std::span<const TokenFeed> feeds) {
  if (!is_first() || !is_last()) {
    return absl::FailedPreconditionError("PrepareFed needs a slice that is first and last");
  }
  if (!fed_rows_valid_) {
    return absl::FailedPreconditionError("PrepareFed: no asynchronous sampling to feed from");
  }
  const int64_t total = batch.TotalTokens();
  for (const TokenFeed& feed : feeds) {
    if (feed.token_row < 0 || feed.token_row >= total || feed.sampled_row < 0 ||
        static_cast<size_t>(feed.sampled_row) >= fed_rows_.size()) {
      return absl::InvalidArgumentError(
          fmt::format("token feed (row {} from sampled row {}) out of range ({} tokens, {} rows)",
                      feed.token_row, feed.sampled_row, total, fed_rows_.size()));
    }
  }
  return PrepareBatch(batch, feeds);
}

}  // namespace ringserve::cuda
