// The CUDA slice's activation buffer (stage/model/activation_buffer.h): the fp32 residual stream
// [max_tokens, hidden] on one device, every access ordered on the slice's compute stream.
// Host copies are cudaMemcpyAsync on that stream: CopyFromHost returns once the copy is
// enqueued (the pageable source is staged by the driver, so it may be reused at once),
// CopyToHost synchronizes the stream. The memory belongs to the slice. Not thread-safe.
#pragma once

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "stage/model/activation_buffer.h"

namespace ringserve::cuda {

class DeviceActivationBuffer final : public ActivationBuffer {
 public:
  // `data`: [max_tokens, hidden_size] fp32 on `device`; `stream`: the slice's compute stream.
  DeviceActivationBuffer(float* data, int64_t max_tokens, int hidden_size, int device,
                         GpuStream stream)
      : ActivationBuffer(hidden_size),
        data_(data),
        max_tokens_(max_tokens),
        device_(device),
        stream_(stream) {}

  MemorySpace memory() const override { return MemorySpace::kDevice; }
  int device() const override { return device_; }
  GpuStream stream() const override { return stream_; }
  int64_t max_tokens() const override { return max_tokens_; }
  absl::Status Resize(int64_t tokens) override;
  float* data() override { return data_; }
  absl::Status CopyFromHost(std::span<const float> values) override;
  absl::Status CopyToHost(std::span<float> values) override;

 private:
  float* data_;
  int64_t max_tokens_;
  int device_;
  GpuStream stream_;
};

}  // namespace ringserve::cuda
