// A model slice's activation buffer: the hidden states of the micro-batch it is running,
// [tokens, hidden_size] fp32 row-major, in host memory (the CPU slice) or in the slice's device
// memory (the CUDA slice). The slice reads its input from it and leaves its output in it; the
// step executor moves it between the slice and the channels (stage/activation_ports.h), and
// that is the only place that asks where the buffer lives.
//
// Lifetime and sizing: owned by its slice. ModelSlice::Prepare(batch) sets tokens() to the
// batch's token count (and grows a host buffer); a host buffer's data() is valid until the next
// Resize, a device buffer's for the slice's lifetime.
// Ordering: a device buffer's reads and writes are ordered on stream() (the slice's compute
// stream); a device channel orders its copies on the same stream.
// Not thread-safe (as its slice).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "common/gpu_stream.h"

namespace ringserve {

enum class MemorySpace { kHost, kDevice };

class ActivationBuffer {
 public:
  virtual ~ActivationBuffer() = default;

  // Where data() lives.
  virtual MemorySpace memory() const = 0;
  // kDevice: the CUDA device ordinal and the stream every access is ordered on. kHost: -1, null.
  virtual int device() const = 0;
  virtual GpuStream stream() const = 0;
  // The most tokens a micro-batch may have here: a device buffer is allocated once at that size
  // (it sizes the device channels' slots); a host buffer grows as needed.
  virtual int64_t max_tokens() const = 0;

  // Sets tokens(): the slice's Prepare does, and the step executor before a receive that
  // comes ahead of Prepare (a device channel). InvalidArgument above max_tokens().
  virtual absl::Status Resize(int64_t tokens) = 0;
  // [tokens(), hidden_size()] fp32 in memory(): a host or a device pointer.
  virtual float* data() = 0;

  // Copies between host memory and the buffer's tokens() rows; values.size() must be
  // tokens() * hidden_size() (InvalidArgument otherwise). CopyFromHost may return before a
  // device copy has finished (it is ordered on stream(); `values` may be reused at once);
  // CopyToHost returns when `values` holds the data.
  virtual absl::Status CopyFromHost(std::span<const float> values) = 0;
  virtual absl::Status CopyToHost(std::span<float> values) = 0;

  int hidden_size() const { return hidden_size_; }
  int64_t tokens() const { return tokens_; }
  int64_t num_values() const { return tokens_ * hidden_size_; }
  int64_t bytes() const { return num_values() * static_cast<int64_t>(sizeof(float)); }

 protected:
  explicit ActivationBuffer(int hidden_size) : hidden_size_(hidden_size) {}
  // Checks a host span against tokens() for the copies.
  absl::Status CheckHostSpan(size_t size) const;

  int hidden_size_;
  int64_t tokens_ = 0;
};

// The host implementation (the CPU slice's): a vector that grows to the batch.
class HostActivationBuffer final : public ActivationBuffer {
 public:
  explicit HostActivationBuffer(int hidden_size) : ActivationBuffer(hidden_size) {}

  MemorySpace memory() const override { return MemorySpace::kHost; }
  int device() const override { return -1; }
  GpuStream stream() const override { return nullptr; }
  int64_t max_tokens() const override;
  absl::Status Resize(int64_t tokens) override;
  float* data() override { return values_.data(); }
  absl::Status CopyFromHost(std::span<const float> values) override;
  absl::Status CopyToHost(std::span<float> values) override;

  // The rows as a vector of exactly num_values() values (the CPU slice computes in place).
  std::vector<float>& values() { return values_; }

 private:
  std::vector<float> values_;
};

}  // namespace ringserve
