// A fake "device" slice for tests of code that leaves sampling in flight (ModelSlice::SampleAsync,
// WaitSample, PrepareFed) without a GPU: it wraps a real CPU slice; SampleAsync samples at once but
// keeps the result until WaitSample, and PrepareFed takes the fed tokens only from its own record
// of the newest sampling, never from the host's batch. Test code only.
#pragma once

#include <deque>
#include <memory>
#include <vector>

#include "common/status_macros.h"
#include "stage/model/model_slice.h"

namespace ringserve::testing {

class AsyncCpuSlice : public ModelSlice {
 public:
  explicit AsyncCpuSlice(std::unique_ptr<ModelSlice> inner) : inner_(std::move(inner)) {}

  const ModelConfig& config() const override { return inner_->config(); }
  const SliceOptions& options() const override { return inner_->options(); }
  ActivationBuffer& activations() override { return inner_->activations(); }
  const ActivationBuffer& activations() const override { return inner_->activations(); }
  absl::Status Prepare(const MicroBatch& batch) override {
    fed_for_ = nullptr;
    return inner_->Prepare(batch);
  }
  absl::Status Run(const MicroBatch& batch) override { return inner_->Run(Actual(batch)); }
  absl::StatusOr<SampledRows> Sample(const MicroBatch& batch,
                                     std::span<const RowSampling> rows) override {
    if (!in_flight_.empty()) return absl::FailedPreconditionError("samplings in flight");
    return inner_->Sample(Actual(batch), rows);
  }
  absl::StatusOr<std::vector<float>> LogitsToHost() override {
    if (!in_flight_.empty()) return absl::FailedPreconditionError("samplings in flight");
    return inner_->LogitsToHost();
  }
  bool can_sample_async() const override { return true; }
  absl::Status SampleAsync(const MicroBatch& batch, std::span<const RowSampling> rows) override {
    if (in_flight_.size() >= kMaxSamplesInFlight) {
      return absl::FailedPreconditionError("too many samplings in flight");
    }
    absl::StatusOr<SampledRows> sampled = inner_->Sample(Actual(batch), rows);
    if (!sampled.ok()) return sampled.status();
    device_tokens_ = sampled->tokens;
    in_flight_.push_back(*std::move(sampled));
    ++async_samplings;
    return absl::OkStatus();
  }
  bool SampleReady() override { return ready; }
  absl::StatusOr<SampledRows> WaitSample() override {
    if (in_flight_.empty()) return absl::FailedPreconditionError("nothing in flight");
    SampledRows out = std::move(in_flight_.front());
    in_flight_.pop_front();
    return out;
  }
  absl::Status PrepareFed(const MicroBatch& batch, std::span<const TokenFeed> feeds) override {
    fed_ = batch;
    for (const TokenFeed& feed : feeds) {
      if (feed.sampled_row < 0 || static_cast<size_t>(feed.sampled_row) >= device_tokens_.size()) {
        return absl::InvalidArgumentError("feed out of range");
      }
      fed_.token_ids[feed.token_row] = device_tokens_[feed.sampled_row];
      ++fed_tokens;
    }
    RS_RETURN_IF_ERROR(inner_->Prepare(fed_));
    fed_for_ = &batch;
    return absl::OkStatus();
  }
  void BeginStepTiming() override { inner_->BeginStepTiming(); }
  void EndStepTiming() override { inner_->EndStepTiming(); }
  int64_t TakeStepMicros() override { return inner_->TakeStepMicros(); }

  bool ready = true;  // what SampleReady answers
  int async_samplings = 0;
  int fed_tokens = 0;

 private:
  // The batch the "device" runs: the fed copy for the batch PrepareFed was given.
  const MicroBatch& Actual(const MicroBatch& batch) const {
    return &batch == fed_for_ ? fed_ : batch;
  }

  std::unique_ptr<ModelSlice> inner_;
  std::deque<SampledRows> in_flight_;
  std::vector<int32_t> device_tokens_;  // the newest SampleAsync's tokens
  MicroBatch fed_;
  const MicroBatch* fed_for_ = nullptr;
};

}  // namespace ringserve::testing
