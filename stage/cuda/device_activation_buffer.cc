#include "stage/cuda/device_activation_buffer.h"

#include "common/status_macros.h"
#include "fmt/format.h"
#include "kernels/cuda/cuda_utils.h"

namespace ringserve::cuda {

absl::Status DeviceActivationBuffer::Resize(int64_t tokens) {
  if (tokens < 0 || tokens > max_tokens_) {
    return absl::InvalidArgumentError(
        fmt::format("{} tokens exceed the stage's {}", tokens, max_tokens_));
  }
  tokens_ = tokens;
  return absl::OkStatus();
}

absl::Status DeviceActivationBuffer::CopyFromHost(std::span<const float> values) {
  RS_RETURN_IF_ERROR(CheckHostSpan(values.size()));
  RS_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  RS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(data_, values.data(), values.size() * sizeof(float),
                                          cudaMemcpyHostToDevice, stream_));
  return absl::OkStatus();
}

absl::Status DeviceActivationBuffer::CopyToHost(std::span<float> values) {
  RS_RETURN_IF_ERROR(CheckHostSpan(values.size()));
  RS_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  RS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(values.data(), data_, values.size() * sizeof(float),
                                          cudaMemcpyDeviceToHost, stream_));
  RS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

}  // namespace ringserve::cuda
