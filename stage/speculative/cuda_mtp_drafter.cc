#include "stage/speculative/cuda_mtp_drafter.h"

#include "stage/speculative/device_mtp_drafter.h"

namespace ringserve {
namespace {

class CudaMtpDevice : public MtpDevice {
 public:
  explicit CudaMtpDevice(cuda::CudaModelSlice* slice) : slice_(slice) {}

  const ModelSlice& target() const override { return *slice_; }
  int store_rows() const override { return slice_->mtp_store_rows(); }
  Limits limits() const override {
    const cuda::CudaSliceOptions& o = slice_->cuda_options();
    return {.max_tokens = o.max_batch_tokens,
            .max_chunks = o.max_seqs,
            .max_logit_rows = o.max_logit_rows};
  }
  absl::Status StoreHidden(int run_row, int count, int store_row) override {
    return slice_->StoreMtpHidden(run_row, count, store_row);
  }
  absl::StatusOr<int> Run(const MicroBatch& batch, std::span<const int32_t> hidden_rows,
                          Source source) override {
    return slice_->RunMtp(batch, hidden_rows,
                          source == Source::kStore ? cuda::CudaModelSlice::MtpSource::kStore
                                                   : cuda::CudaModelSlice::MtpSource::kLastRun);
  }
  absl::StatusOr<Outputs> Results(int rows, std::span<const int> to_host) override {
    auto results = slice_->MtpResults(rows, to_host);
    if (!results.ok()) return results.status();
    return Outputs{.argmax = std::move(results->argmax), .logits = std::move(results->logits)};
  }

 private:
  cuda::CudaModelSlice* slice_;
};

}  // namespace

std::unique_ptr<Drafter> NewCudaMtpDrafter(cuda::CudaModelSlice* target) {
  return std::make_unique<DeviceMtpDrafter>(std::make_unique<CudaMtpDevice>(target));
}

}  // namespace ringserve
