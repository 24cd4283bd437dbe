#include "stage/activation_ports.h"

#include <span>
#include <utility>
#include <vector>

#include "common/status_macros.h"

namespace ringserve {
namespace {

std::span<std::byte> BufferBytes(ActivationBuffer& buffer) {
  return {reinterpret_cast<std::byte*>(buffer.data()), static_cast<size_t>(buffer.bytes())};
}

// Host end, host buffer: the channel writes the buffer.
class HostInput final : public InputPort {
 public:
  HostInput(std::unique_ptr<ActivationReceiver> receiver, ActivationBuffer& buffer)
      : receiver_(std::move(receiver)), buffer_(buffer) {}
  absl::Status Receive(uint64_t micro_batch_id, absl::Duration timeout) override {
    return receiver_->Recv(micro_batch_id, BufferBytes(buffer_), timeout);
  }
  void Close() override { receiver_->Close(); }
  int64_t bytes_received() const override { return receiver_->bytes_received(); }
  void Abort() override { receiver_->Abort(); }
  int64_t bytes_moved() const override { return receiver_->bytes_moved(); }

 private:
  std::unique_ptr<ActivationReceiver> receiver_;
  ActivationBuffer& buffer_;
};

// Host end, device buffer: received on the host, then copied to the device.
class StagedInput final : public InputPort {
 public:
  StagedInput(std::unique_ptr<ActivationReceiver> receiver, ActivationBuffer& buffer)
      : receiver_(std::move(receiver)), buffer_(buffer) {}
  absl::Status Receive(uint64_t micro_batch_id, absl::Duration timeout) override {
    staging_.resize(static_cast<size_t>(buffer_.num_values()));
    RS_RETURN_IF_ERROR(receiver_->Recv(
        micro_batch_id, std::as_writable_bytes(std::span<float>(staging_)), timeout));
    return buffer_.CopyFromHost(staging_);
  }
  void Close() override { receiver_->Close(); }
  int64_t bytes_received() const override { return receiver_->bytes_received(); }
  void Abort() override { receiver_->Abort(); }
  int64_t bytes_moved() const override { return receiver_->bytes_moved(); }

 private:
  std::unique_ptr<ActivationReceiver> receiver_;
  ActivationBuffer& buffer_;
  std::vector<float> staging_;
};

// Device end, device buffer.
class DeviceInput final : public InputPort {
 public:
  DeviceInput(std::unique_ptr<DeviceActivationReceiver> receiver, ActivationBuffer& buffer)
      : receiver_(std::move(receiver)), buffer_(buffer) {}
  absl::Status Receive(uint64_t micro_batch_id, absl::Duration timeout) override {
    return receiver_->Recv(micro_batch_id, buffer_.data(), static_cast<size_t>(buffer_.bytes()),
                           buffer_.stream(), timeout);
  }
  void Close() override { receiver_->Close(); }
  int64_t bytes_received() const override { return receiver_->bytes_received(); }
  void Abort() override { receiver_->Abort(); }
  int64_t bytes_moved() const override { return receiver_->bytes_moved(); }

 private:
  std::unique_ptr<DeviceActivationReceiver> receiver_;
  ActivationBuffer& buffer_;
};

class HostOutput final : public OutputPort {
 public:
  HostOutput(std::unique_ptr<ActivationSender> sender, ActivationBuffer& buffer)
      : sender_(std::move(sender)), buffer_(buffer) {}
  absl::Status Send(uint64_t micro_batch_id, absl::Duration timeout) override {
    return sender_->Send(micro_batch_id, BufferBytes(buffer_), timeout);
  }
  void Close() override { sender_->Close(); }
  int64_t bytes_sent() const override { return sender_->bytes_sent(); }
  void Abort() override { sender_->Abort(); }
  int64_t bytes_moved() const override { return sender_->bytes_moved(); }

 private:
  std::unique_ptr<ActivationSender> sender_;
  ActivationBuffer& buffer_;
};

class StagedOutput final : public OutputPort {
 public:
  StagedOutput(std::unique_ptr<ActivationSender> sender, ActivationBuffer& buffer)
      : sender_(std::move(sender)), buffer_(buffer) {}
  absl::Status Send(uint64_t micro_batch_id, absl::Duration timeout) override {
    staging_.resize(static_cast<size_t>(buffer_.num_values()));
    RS_RETURN_IF_ERROR(buffer_.CopyToHost(staging_));
    return sender_->Send(micro_batch_id, std::as_bytes(std::span<const float>(staging_)), timeout);
  }
  void Close() override { sender_->Close(); }
  int64_t bytes_sent() const override { return sender_->bytes_sent(); }
  void Abort() override { sender_->Abort(); }
  int64_t bytes_moved() const override { return sender_->bytes_moved(); }

 private:
  std::unique_ptr<ActivationSender> sender_;
  ActivationBuffer& buffer_;
  std::vector<float> staging_;
};

class DeviceOutput final : public OutputPort {
 public:
  DeviceOutput(std::unique_ptr<DeviceActivationSender> sender, ActivationBuffer& buffer)
      : sender_(std::move(sender)), buffer_(buffer) {}
  absl::Status Send(uint64_t micro_batch_id, absl::Duration timeout) override {
    return sender_->Send(micro_batch_id, buffer_.data(), static_cast<size_t>(buffer_.bytes()),
                         buffer_.stream(), timeout);
  }
  void Close() override { sender_->Close(); }
  int64_t bytes_sent() const override { return sender_->bytes_sent(); }
  void Abort() override { sender_->Abort(); }
  int64_t bytes_moved() const override { return sender_->bytes_moved(); }

 private:
  std::unique_ptr<DeviceActivationSender> sender_;
  ActivationBuffer& buffer_;
};

absl::Status CheckEnds(bool host_end, bool device_end, MemorySpace memory, const char* what) {
  if (host_end && device_end) {
    return absl::FailedPreconditionError(
        std::string("both a host and a device channel end for the ") + what);
  }
  if (device_end && memory != MemorySpace::kDevice) {
    return absl::FailedPreconditionError(
        std::string("a GPU channel (cuda_ipc, nccl) for the ") + what +
        " needs a slice whose activations live on the GPU (a CUDA stage)");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<InputPort>> MakeInputPort(StageChannels& channels,
                                                         ActivationBuffer& buffer) {
  RS_RETURN_IF_ERROR(CheckEnds(channels.receiver != nullptr, channels.device_receiver != nullptr,
                               buffer.memory(), "previous stage"));
  if (channels.device_receiver != nullptr) {
    return std::make_unique<DeviceInput>(std::move(channels.device_receiver), buffer);
  }
  if (channels.receiver == nullptr) return nullptr;
  if (buffer.memory() == MemorySpace::kDevice) {
    return std::make_unique<StagedInput>(std::move(channels.receiver), buffer);
  }
  return std::make_unique<HostInput>(std::move(channels.receiver), buffer);
}

absl::StatusOr<std::unique_ptr<OutputPort>> MakeOutputPort(StageChannels& channels,
                                                           ActivationBuffer& buffer) {
  RS_RETURN_IF_ERROR(CheckEnds(channels.sender != nullptr, channels.device_sender != nullptr,
                               buffer.memory(), "next stage"));
  if (channels.device_sender != nullptr) {
    return std::make_unique<DeviceOutput>(std::move(channels.device_sender), buffer);
  }
  if (channels.sender == nullptr) return nullptr;
  if (buffer.memory() == MemorySpace::kDevice) {
    return std::make_unique<StagedOutput>(std::move(channels.sender), buffer);
  }
  return std::make_unique<HostOutput>(std::move(channels.sender), buffer);
}

}  // namespace ringserve
