#include "stage/channels/cuda_ipc/cuda_ipc_channel.h"

#include <cuda_runtime.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "fmt/format.h"

namespace ringserve {
namespace {

constexpr uint32_t kOfferMagic = 0x50495352;  // "RSIP"
constexpr uint32_t kOfferVersion = 2;
constexpr size_t kMaxSlots = 16;
constexpr size_t kOfferHeaderBytes = 24 + sizeof(cudaIpcMemHandle_t);
// The header, then per slot a "written" and a "consumed" event handle.
constexpr size_t kOfferBytes = kOfferHeaderBytes + kMaxSlots * 2 * sizeof(cudaIpcEventHandle_t);
constexpr size_t kNoticeBytes = 16;
constexpr unsigned kIpcEventFlags = cudaEventInterprocess | cudaEventDisableTiming;

absl::Status CudaError(cudaError_t error, const std::string& what) {
  return absl::InternalError(fmt::format("{}: {}", what, cudaGetErrorString(error)));
}

#define RS_IPC_CUDA(call, what)                                            \
  do {                                                                     \
    const cudaError_t rs_ipc_error = (call);                               \
    if (rs_ipc_error != cudaSuccess) return CudaError(rs_ipc_error, what); \
  } while (0)

template <typename T>
void Put(std::byte* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}
template <typename T>
T Get(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Per slot, the two interprocess events of the GPU-side handoff (both created by the receiver,
// which owns the slots; the sender opens them from their handles).
struct SlotEvents {
  cudaEvent_t written = nullptr;   // sender records after its copy into the slot
  cudaEvent_t consumed = nullptr;  // receiver records after its copy out of the slot
};

void DestroySlotEvents(std::vector<SlotEvents>& events) {
  for (SlotEvents& e : events) {
    if (e.written) cudaEventDestroy(e.written);
    if (e.consumed) cudaEventDestroy(e.consumed);
  }
  events.clear();
}

std::byte* EventHandleAt(std::byte* offer, int slot, int which) {
  return offer + kOfferHeaderBytes + (2 * slot + which) * sizeof(cudaIpcEventHandle_t);
}

// The sender's own copy stream and its two staging buffers (cross-GPU transfers).
struct CopyStream {
  cudaStream_t stream = nullptr;
  void* staging[2] = {nullptr, nullptr};
  cudaEvent_t staged[2] = {nullptr, nullptr};  // compute stream: staging buffer filled
  cudaEvent_t copied[2] = {nullptr, nullptr};  // copy stream: staging buffer sent
  bool used[2] = {false, false};

  // Frees the staging buffers only when their last transfer has run: a transfer still waiting
  // for a receiver that is gone keeps them until the process exits (cudaFree would wait for it).
  ~CopyStream() {
    bool idle = true;
    for (int i = 0; i < 2; ++i)
      idle = idle && (!copied[i] || cudaEventQuery(copied[i]) == cudaSuccess);
    for (int i = 0; i < 2; ++i) {
      if (staging[i] && idle) cudaFree(staging[i]);
      if (staged[i]) cudaEventDestroy(staged[i]);
      if (copied[i]) cudaEventDestroy(copied[i]);
    }
    if (stream) cudaStreamDestroy(stream);
  }
};

class CudaIpcSender : public DeviceActivationSender {
 public:
  CudaIpcSender(std::unique_ptr<TcpLink> link, const CudaIpcOptions& options)
      : link_(std::move(link)), device_(options.device), copy_mode_(options.copy_stream) {}
  ~CudaIpcSender() override {
    Close();
    copy_.reset();
    DestroySlotEvents(events_);
  }

  absl::Status Init(absl::Duration timeout) {
    const std::string what = fmt::format("cuda_ipc: offer from {}", link_->peer());
    std::byte offer[kOfferBytes];
    RS_RETURN_IF_ERROR(link_->Read(0, offer, absl::Now() + timeout, what));
    if (Get<uint32_t>(offer) != kOfferMagic || Get<uint32_t>(offer + 4) != kOfferVersion) {
      return absl::DataLossError(what + ": not a cuda_ipc offer (is the next stage on tcp?)");
    }
    num_slots_ = static_cast<int>(Get<uint32_t>(offer + 8));
    slot_bytes_ = Get<uint64_t>(offer + 16);
    if (num_slots_ < 1 || num_slots_ > static_cast<int>(kMaxSlots) || slot_bytes_ == 0) {
      return absl::DataLossError(
          fmt::format("{}: {} slots of {} bytes", what, num_slots_, slot_bytes_));
    }
    cudaIpcMemHandle_t handle;
    std::memcpy(&handle, offer + 24, sizeof(handle));
    RS_IPC_CUDA(cudaSetDevice(device_), what);
    const cudaError_t opened =
        cudaIpcOpenMemHandle(&peer_base_, handle, cudaIpcMemLazyEnablePeerAccess);
    if (opened != cudaSuccess) {
      return absl::FailedPreconditionError(fmt::format(
          "cuda_ipc: cannot map the memory of {} on cuda:{} ({}); cuda_ipc needs both stages on "
          "one host, on GPUs with peer access (use nccl or tcp otherwise)",
          link_->peer(), device_, cudaGetErrorString(opened)));
    }
    events_.resize(num_slots_);
    for (int slot = 0; slot < num_slots_; ++slot) {
      cudaIpcEventHandle_t written, consumed;
      std::memcpy(&written, EventHandleAt(offer, slot, 0), sizeof(written));
      std::memcpy(&consumed, EventHandleAt(offer, slot, 1), sizeof(consumed));
      RS_IPC_CUDA(cudaIpcOpenEventHandle(&events_[slot].written, written), what);
      RS_IPC_CUDA(cudaIpcOpenEventHandle(&events_[slot].consumed, consumed), what);
    }
    pending_.assign(num_slots_, kFree);
    return MaybeCreateCopyStream(what);
  }

  absl::Status Send(uint64_t micro_batch_id, const void* source, size_t bytes, GpuStream stream,
                    absl::Duration timeout) override {
    const std::string what =
        fmt::format("cuda_ipc send of micro-batch {} to {}", micro_batch_id, link_->peer());
    if (broken_ || link_->closed())
      return absl::FailedPreconditionError(what + ": channel is closed");
    absl::Status status =
        SendChecked(micro_batch_id, source, bytes, stream, absl::Now() + timeout, what);
    if (!status.ok()) {
      broken_ = true;
      link_->Close();
    }
    return status;
  }

  // Unmaps the receiver's slots once the last copy into them has run (Send returns before it
  // has). A copy still queued after a few seconds (its stream waits for a receiver that is
  // gone) keeps the mapping until the process exits, rather than faulting or hanging here.
  void Close() override {
    link_->Close();
    if (peer_base_ == nullptr) return;
    cudaSetDevice(device_);
    const absl::Time deadline = absl::Now() + absl::Seconds(3);
    // The last copy is the one before the last slot's "written" record.
    cudaEvent_t last_copy =
        next_ == 0 ? nullptr : events_[static_cast<int>((next_ - 1) % num_slots_)].written;
    cudaError_t state = last_copy ? cudaEventQuery(last_copy) : cudaSuccess;
    while (state == cudaErrorNotReady && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(1));
      state = cudaEventQuery(last_copy);
    }
    if (state == cudaSuccess) cudaIpcCloseMemHandle(peer_base_);
    peer_base_ = nullptr;
  }
  int64_t bytes_sent() const override { return bytes_sent_; }

 private:
  static constexpr uint64_t kFree = ~uint64_t{0};

  absl::Status MaybeCreateCopyStream(const std::string& what) {
    bool own = copy_mode_ == CopyStreamMode::kAlways;
    if (copy_mode_ == CopyStreamMode::kAuto) {
      cudaPointerAttributes attributes{};
      RS_IPC_CUDA(cudaPointerGetAttributes(&attributes, peer_base_), what);
      own = attributes.device != device_;
    }
    if (!own) return absl::OkStatus();
    copy_ = std::make_unique<CopyStream>();
    RS_IPC_CUDA(cudaStreamCreateWithFlags(&copy_->stream, cudaStreamNonBlocking), what);
    for (int i = 0; i < 2; ++i) {
      const cudaError_t allocated = cudaMalloc(&copy_->staging[i], slot_bytes_);
      if (allocated != cudaSuccess) {
        copy_->staging[i] = nullptr;
        return absl::ResourceExhaustedError(
            fmt::format("{}: cannot allocate a {}-byte staging buffer on cuda:{}: {}", what,
                        slot_bytes_, device_, cudaGetErrorString(allocated)));
      }
      RS_IPC_CUDA(cudaEventCreateWithFlags(&copy_->staged[i], cudaEventDisableTiming), what);
      RS_IPC_CUDA(cudaEventCreateWithFlags(&copy_->copied[i], cudaEventDisableTiming), what);
    }
    return absl::OkStatus();
  }

  // Enqueues the copy of `bytes` at `source` into the receiver's slot, after the work on
  // `stream` and, when the slot is reused, after the receiver's copy out of it; then records the
  // slot's "written" event. On the compute stream, or through a staging buffer and the copy
  // stream (see the header).
  absl::Status EnqueueCopy(int slot, bool reuse, const void* source, size_t bytes,
                           cudaStream_t stream, const std::string& what) {
    char* target = static_cast<char*>(peer_base_) + static_cast<int64_t>(slot) * slot_bytes_;
    if (copy_ == nullptr) {
      // The receiver recorded `consumed` before it acknowledged: the copy into the slot waits, on
      // the GPU, for the receiver's copy out of it.
      if (reuse) RS_IPC_CUDA(cudaStreamWaitEvent(stream, events_[slot].consumed, 0), what);
      if (bytes > 0) {
        RS_IPC_CUDA(cudaMemcpyAsync(target, source, bytes, cudaMemcpyDeviceToDevice, stream), what);
      }
      // Recorded before the notice goes out, so the receiver's wait refers to this record.
      RS_IPC_CUDA(cudaEventRecord(events_[slot].written, stream), what);
      return absl::OkStatus();
    }
    CopyStream& c = *copy_;
    const int i = static_cast<int>(next_ % 2);
    if (c.used[i]) RS_IPC_CUDA(cudaStreamWaitEvent(stream, c.copied[i], 0), what);
    if (bytes > 0) {
      RS_IPC_CUDA(cudaMemcpyAsync(c.staging[i], source, bytes, cudaMemcpyDeviceToDevice, stream),
                  what);
    }
    RS_IPC_CUDA(cudaEventRecord(c.staged[i], stream), what);
    RS_IPC_CUDA(cudaStreamWaitEvent(c.stream, c.staged[i], 0), what);
    if (reuse) RS_IPC_CUDA(cudaStreamWaitEvent(c.stream, events_[slot].consumed, 0), what);
    if (bytes > 0) {
      RS_IPC_CUDA(cudaMemcpyAsync(target, c.staging[i], bytes, cudaMemcpyDeviceToDevice, c.stream),
                  what);
    }
    RS_IPC_CUDA(cudaEventRecord(events_[slot].written, c.stream), what);
    RS_IPC_CUDA(cudaEventRecord(c.copied[i], c.stream), what);
    c.used[i] = true;
    return absl::OkStatus();
  }

  absl::Status SendChecked(uint64_t micro_batch_id, const void* source, size_t bytes,
                           GpuStream stream, absl::Time deadline, const std::string& what) {
    if (bytes > slot_bytes_) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: {} bytes do not fit the receiver's {}-byte slots", what, bytes, slot_bytes_));
    }
    const int slot = static_cast<int>(next_ % num_slots_);
    bool reuse = false;
    if (pending_[slot] != kFree) {
      // The receiver acknowledges in order; this slot's micro-batch is the oldest pending one.
      RS_RETURN_IF_ERROR(
          link_->Read(pending_[slot], {}, deadline, what + " (waiting for a free slot)"));
      pending_[slot] = kFree;
      reuse = true;
    }
    RS_IPC_CUDA(cudaSetDevice(device_), what);
    RS_RETURN_IF_ERROR(EnqueueCopy(slot, reuse, source, bytes, stream, what));
    std::byte notice[kNoticeBytes];
    Put<uint32_t>(notice, static_cast<uint32_t>(slot));
    Put<uint32_t>(notice + 4, 0);
    Put<uint64_t>(notice + 8, bytes);
    RS_RETURN_IF_ERROR(link_->Write(micro_batch_id, notice, deadline, what));
    pending_[slot] = micro_batch_id;
    ++next_;
    bytes_sent_ += static_cast<int64_t>(bytes);
    return absl::OkStatus();
  }

  std::unique_ptr<TcpLink> link_;
  const int device_;
  const CopyStreamMode copy_mode_;
  std::unique_ptr<CopyStream> copy_;  // null: copies run on the caller's compute stream
  void* peer_base_ = nullptr;
  std::vector<SlotEvents> events_;
  int num_slots_ = 0;
  uint64_t slot_bytes_ = 0;
  uint64_t next_ = 0;
  std::vector<uint64_t> pending_;  // per slot: the micro-batch awaiting acknowledgement
  int64_t bytes_sent_ = 0;
  bool broken_ = false;
};

class CudaIpcReceiver : public DeviceActivationReceiver {
 public:
  CudaIpcReceiver(std::unique_ptr<TcpLink> link, const CudaIpcOptions& options)
      : link_(std::move(link)), options_(options) {}
  ~CudaIpcReceiver() override {
    Close();
    DestroySlotEvents(events_);
    if (slots_) {
      cudaSetDevice(options_.device);
      cudaFree(slots_);
    }
  }

  absl::Status Init(absl::Duration timeout) {
    const std::string what = fmt::format("cuda_ipc: offering slots to {}", link_->peer());
    if (options_.num_slots < 1 || options_.num_slots > static_cast<int>(kMaxSlots) ||
        options_.slot_bytes <= 0) {
      return absl::InvalidArgumentError(
          fmt::format("{}: {} slots of {} bytes", what, options_.num_slots, options_.slot_bytes));
    }
    RS_IPC_CUDA(cudaSetDevice(options_.device), what);
    const size_t total = static_cast<size_t>(options_.num_slots) * options_.slot_bytes;
    const cudaError_t allocated = cudaMalloc(&slots_, total);
    if (allocated != cudaSuccess) {
      slots_ = nullptr;
      return absl::ResourceExhaustedError(fmt::format("{}: cannot allocate {} bytes on cuda:{}: {}",
                                                      what, total, options_.device,
                                                      cudaGetErrorString(allocated)));
    }
    cudaIpcMemHandle_t handle;
    RS_IPC_CUDA(cudaIpcGetMemHandle(&handle, slots_), what);
    std::byte offer[kOfferBytes] = {};
    events_.resize(options_.num_slots);
    for (int slot = 0; slot < options_.num_slots; ++slot) {
      SlotEvents& e = events_[slot];
      RS_IPC_CUDA(cudaEventCreateWithFlags(&e.written, kIpcEventFlags), what);
      RS_IPC_CUDA(cudaEventCreateWithFlags(&e.consumed, kIpcEventFlags), what);
      cudaIpcEventHandle_t handle;
      RS_IPC_CUDA(cudaIpcGetEventHandle(&handle, e.written), what);
      std::memcpy(EventHandleAt(offer, slot, 0), &handle, sizeof(handle));
      RS_IPC_CUDA(cudaIpcGetEventHandle(&handle, e.consumed), what);
      std::memcpy(EventHandleAt(offer, slot, 1), &handle, sizeof(handle));
    }
    Put<uint32_t>(offer, kOfferMagic);
    Put<uint32_t>(offer + 4, kOfferVersion);
    Put<uint32_t>(offer + 8, static_cast<uint32_t>(options_.num_slots));
    Put<uint64_t>(offer + 16, static_cast<uint64_t>(options_.slot_bytes));
    std::memcpy(offer + 24, &handle, sizeof(handle));
    return link_->Write(0, offer, absl::Now() + timeout, what);
  }

  absl::Status Recv(uint64_t micro_batch_id, void* destination, size_t bytes, GpuStream stream,
                    absl::Duration timeout) override {
    const std::string what =
        fmt::format("cuda_ipc receive of micro-batch {} from {}", micro_batch_id, link_->peer());
    if (broken_ || link_->closed())
      return absl::FailedPreconditionError(what + ": channel is closed");
    absl::Status status =
        RecvChecked(micro_batch_id, destination, bytes, stream, absl::Now() + timeout, what);
    if (!status.ok()) {
      broken_ = true;
      link_->Close();
    }
    return status;
  }

  void Close() override { link_->Close(); }
  int64_t bytes_received() const override { return bytes_received_; }

 private:
  absl::Status RecvChecked(uint64_t micro_batch_id, void* destination, size_t bytes,
                           GpuStream stream, absl::Time deadline, const std::string& what) {
    RS_IPC_CUDA(cudaSetDevice(options_.device), what);
    // The previous message's slot: its `consumed` event is recorded, so the sender may reuse it
    // (its next copy into the slot waits for that event on the GPU).
    if (unacknowledged_) {
      RS_RETURN_IF_ERROR(
          link_->Write(unacknowledged_id_, {}, deadline, what + " (acknowledging the previous)"));
      unacknowledged_ = false;
    }
    std::byte notice[kNoticeBytes];
    RS_RETURN_IF_ERROR(link_->Read(micro_batch_id, notice, deadline, what));
    const uint32_t slot = Get<uint32_t>(notice);
    const uint64_t got_bytes = Get<uint64_t>(notice + 8);
    const uint32_t expected_slot = static_cast<uint32_t>(next_ % options_.num_slots);
    if (slot != expected_slot) {
      return absl::DataLossError(
          fmt::format("{}: data in slot {}, expected slot {}", what, slot, expected_slot));
    }
    if (got_bytes != bytes) {
      return absl::DataLossError(
          fmt::format("{}: the plan expects {} bytes, the sender sent {}", what, bytes, got_bytes));
    }
    const char* source =
        static_cast<const char*>(slots_) + static_cast<int64_t>(slot) * options_.slot_bytes;
    // The sender recorded `written` before its notice: the copy out waits on the GPU for the
    // copy in, and neither CPU waits for the other's GPU work.
    RS_IPC_CUDA(cudaStreamWaitEvent(stream, events_[slot].written, 0), what);
    if (bytes > 0) {
      RS_IPC_CUDA(cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDeviceToDevice, stream),
                  what);
    }
    // Acknowledged at the next Recv (the sender needs it only to reuse this slot, num_slots
    // messages later).
    RS_IPC_CUDA(cudaEventRecord(events_[slot].consumed, stream), what);
    unacknowledged_ = true;
    unacknowledged_id_ = micro_batch_id;
    ++next_;
    bytes_received_ += static_cast<int64_t>(bytes);
    return absl::OkStatus();
  }

  std::unique_ptr<TcpLink> link_;
  const CudaIpcOptions options_;
  void* slots_ = nullptr;
  std::vector<SlotEvents> events_;
  uint64_t next_ = 0;
  bool unacknowledged_ = false;  // the last message's slot is not yet released to the sender
  uint64_t unacknowledged_id_ = 0;
  int64_t bytes_received_ = 0;
  bool broken_ = false;
};

}  // namespace

std::optional<CopyStreamMode> ParseCopyStreamMode(std::string_view text) {
  if (text == "auto") return CopyStreamMode::kAuto;
  if (text == "always") return CopyStreamMode::kAlways;
  if (text == "never") return CopyStreamMode::kNever;
  return std::nullopt;
}

absl::StatusOr<std::unique_ptr<DeviceActivationReceiver>> CudaIpcAccept(
    std::unique_ptr<TcpLink> link, const CudaIpcOptions& options, absl::Duration timeout) {
  auto receiver = std::make_unique<CudaIpcReceiver>(std::move(link), options);
  RS_RETURN_IF_ERROR(receiver->Init(timeout));
  return std::unique_ptr<DeviceActivationReceiver>(std::move(receiver));
}

absl::StatusOr<std::unique_ptr<DeviceActivationSender>> CudaIpcConnect(
    std::unique_ptr<TcpLink> link, const CudaIpcOptions& options, absl::Duration timeout) {
  auto sender = std::make_unique<CudaIpcSender>(std::move(link), options);
  RS_RETURN_IF_ERROR(sender->Init(timeout));
  return std::unique_ptr<DeviceActivationSender>(std::move(sender));
}

}  // namespace ringserve
