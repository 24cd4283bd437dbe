#include "stage/channels/nccl/nccl_channel.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <utility>

#include "common/status_macros.h"
#include "fmt/format.h"

namespace ringserve {
namespace {

constexpr uint64_t kUniqueIdTag =
    0x4449'4c43'4343'4e53;  // tag of the set-up frame (any fixed value)
// Set-up frame payload: the receiver's NCCL version (u32) and the unique id.
constexpr size_t kIdFrameBytes = 4 + sizeof(ncclUniqueId);
// Polls that only yield before the waits start sleeping: a decode-sized transfer completes
// within them, so small messages see no sleep latency.
constexpr int kSpinPolls = 2000;

void PutU64(std::byte* p, uint64_t v) { std::memcpy(p, &v, 8); }
uint64_t GetU64(const std::byte* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

std::string VersionText(int code) {
  return fmt::format("{}.{}.{}", code / 10000, code % 10000 / 100, code % 100);
}

absl::Status Cuda(cudaError_t err, const char* call, const std::string& what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::UnavailableError(
      fmt::format("{}: {} failed: {}", what, call, cudaGetErrorString(err)));
}

std::string NcclText(ncclResult_t result, ncclComm_t comm) {
  const char* last = ncclGetLastError(comm);
  if (last == nullptr || *last == '\0') return ncclGetErrorString(result);
  return fmt::format("{} ({})", ncclGetErrorString(result), last);
}

// Waits until `comm` has nothing in progress (init or an enqueue) and then, when `stream` is
// given, until `stream` is idle. Polls with a deadline: never blocks inside NCCL or CUDA.
absl::Status Wait(ncclComm_t comm, const cudaStream_t* stream, absl::Time deadline,
                  const std::string& what) {
  for (int polls = 0;; ++polls) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t result = ncclCommGetAsyncError(comm, &state);
    if (result != ncclSuccess) {
      return absl::UnavailableError(
          fmt::format("{}: ncclCommGetAsyncError failed: {}", what, NcclText(result, comm)));
    }
    if (state != ncclSuccess && state != ncclInProgress) {
      return absl::UnavailableError(fmt::format("{}: NCCL error: {}", what, NcclText(state, comm)));
    }
    if (state == ncclSuccess) {
      if (stream == nullptr) return absl::OkStatus();
      cudaError_t err = cudaStreamQuery(*stream);
      if (err == cudaSuccess) return absl::OkStatus();
      if (err != cudaErrorNotReady) return Cuda(err, "cudaStreamQuery", what);
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(fmt::format(
          "{}: timed out ({}; the peer stalled, is gone or is too slow)", what,
          state == ncclInProgress ? "NCCL still in progress" : "transfer not complete"));
    }
    if (polls < kSpinPolls) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
}

// Joins the 2-rank communicator of `id` as `rank`, non-blocking, within the deadline.
absl::StatusOr<ncclComm_t> JoinComm(const ncclUniqueId& id, int rank, absl::Time deadline,
                                    const std::string& what) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t result = ncclCommInitRankConfig(&comm, 2, id, rank, &config);
  if (result != ncclSuccess && result != ncclInProgress) {
    std::string text = NcclText(result, comm);
    if (comm != nullptr) ncclCommAbort(comm);
    return absl::UnavailableError(
        fmt::format("{}: ncclCommInitRankConfig (rank {}) failed: {}", what, rank, text));
  }
  absl::Status status = Wait(comm, nullptr, deadline, what + " (joining the NCCL communicator)");
  if (!status.ok()) {
    ncclCommAbort(comm);
    return status;
  }
  return comm;
}

// State shared by both ends of a hop: the link, the communicator and the broken flag.
class NcclHop {
 public:
  NcclHop(std::unique_ptr<TcpLink> link, ncclComm_t comm, int device, int rank)
      : link_(std::move(link)), comm_(comm), device_(device), rank_(rank) {}
  ~NcclHop() {
    Close();
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  NcclHop(const NcclHop&) = delete;
  NcclHop& operator=(const NcclHop&) = delete;

  TcpLink& link() { return *link_; }
  ncclComm_t comm() const { return comm_; }
  const std::string& peer() const { return link_->peer(); }

  // Fails fast when the hop is broken or closed; makes the hop's device current.
  absl::Status Begin(const std::string& what) {
    if (!broken_.ok()) {
      return absl::FailedPreconditionError(fmt::format("{}: the channel is unusable after: {}",
                                                       what, std::string(broken_.message())));
    }
    absl::Status status = Cuda(cudaSetDevice(device_), "cudaSetDevice", what);
    return status.ok() ? status : Fail(std::move(status));
  }

  // Takes the result of a just-posted ncclSend/ncclRecv on `stream` and waits for completion.
  absl::Status Complete(ncclResult_t posted, const char* call, cudaStream_t stream,
                        absl::Time deadline, const std::string& what) {
    if (posted != ncclSuccess && posted != ncclInProgress) {
      return Fail(absl::UnavailableError(
          fmt::format("{}: {} failed: {}", what, call, NcclText(posted, comm_))));
    }
    absl::Status status = Wait(comm_, &stream, deadline, what);
    return status.ok() ? status : Fail(std::move(status));
  }

  // Creates the hop's stream and moves one byte from rank 0 to rank 1 on it, connecting the
  // NCCL peers.
  absl::Status WarmUp(absl::Time deadline, const std::string& what) {
    void* byte = nullptr;
    absl::Status status = Cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                               "cudaStreamCreateWithFlags", what);
    if (status.ok()) status = Cuda(cudaMalloc(&byte, 1), "cudaMalloc", what);
    if (status.ok()) {
      std::string step = what + " (warm-up transfer)";
      status = rank_ == 0 ? Complete(ncclSend(byte, 1, ncclUint8, 1, comm_, stream_), "ncclSend",
                                     stream_, deadline, step)
                          : Complete(ncclRecv(byte, 1, ncclUint8, 0, comm_, stream_), "ncclRecv",
                                     stream_, deadline, step);
    }
    // A failed transfer aborted the communicator already, so the buffer is no longer in use.
    if (byte != nullptr) cudaFree(byte);
    return status.ok() ? status : Fail(std::move(status));
  }

  cudaStream_t stream() const { return stream_; }

  // Takes the result of a just-posted ncclSend/ncclRecv and waits until NCCL has enqueued it
  // on the hop stream (not for the transfer).
  absl::Status Posted(ncclResult_t posted, const char* call, absl::Time deadline,
                      const std::string& what) {
    if (posted != ncclSuccess && posted != ncclInProgress) {
      return Fail(absl::UnavailableError(
          fmt::format("{}: {} failed: {}", what, call, NcclText(posted, comm_))));
    }
    absl::Status status = Wait(comm_, nullptr, deadline, what);
    return status.ok() ? status : Fail(std::move(status));
  }

  // Polls until `done` (recorded on the hop stream after a transfer) has completed, watching
  // the communicator for errors; fails the hop at the deadline.
  absl::Status AwaitTransfer(cudaEvent_t done, absl::Time deadline, const std::string& what) {
    for (int polls = 0;; ++polls) {
      const cudaError_t err = cudaEventQuery(done);
      if (err == cudaSuccess) return absl::OkStatus();
      if (err != cudaErrorNotReady) return Fail(Cuda(err, "cudaEventQuery", what));
      absl::Status status = Wait(comm_, nullptr, deadline, what);
      if (!status.ok()) return Fail(std::move(status));
      if (absl::Now() >= deadline) {
        return Fail(absl::DeadlineExceededError(fmt::format(
            "{}: timed out (an earlier transfer has not completed; the peer stalled or is gone)",
            what)));
      }
      if (polls < kSpinPolls) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
  }

  // OK stays OK; an error breaks the hop (Fail).
  absl::Status Check(absl::Status status) { return status.ok() ? status : Fail(std::move(status)); }

  // Breaks the hop (first error wins): closes the link and aborts the communicator.
  absl::Status Fail(absl::Status status) {
    if (broken_.ok()) broken_ = status;
    link_->Close();
    Abort();
    return status;
  }

  void Close() {
    if (broken_.ok()) broken_ = absl::FailedPreconditionError("the channel was closed");
    link_->Close();
    Abort();
  }

 private:
  void Abort() {
    if (comm_ == nullptr) return;
    cudaSetDevice(device_);
    // Abort, not destroy: it never waits for the peer, and nothing is in flight here anyway.
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  std::unique_ptr<TcpLink> link_;
  ncclComm_t comm_;
  int device_;
  int rank_;
  cudaStream_t stream_ = nullptr;  // the hop's transfers (created by WarmUp)
  absl::Status broken_;
};

// Two transfers in flight per side: each with its completion event and, on the sender, its
// staging buffer (grown to the largest message).
class Transfers {
 public:
  ~Transfers() {
    for (Slot& s : slots_) {
      if (s.staging) cudaFree(s.staging);
      if (s.done) cudaEventDestroy(s.done);
      if (s.ready) cudaEventDestroy(s.ready);
    }
  }

  // The next slot, once its previous transfer has completed; with a staging buffer of at least
  // `staging_bytes` (0: none).
  absl::StatusOr<int> Next(NcclHop& hop, size_t staging_bytes, absl::Time deadline,
                           const std::string& what) {
    const int i = static_cast<int>(count_++ % 2);
    Slot& s = slots_[i];
    if (s.done == nullptr) {
      RS_RETURN_IF_ERROR(hop.Check(Cuda(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming),
                                        "cudaEventCreate", what)));
      RS_RETURN_IF_ERROR(hop.Check(Cuda(cudaEventCreateWithFlags(&s.ready, cudaEventDisableTiming),
                                        "cudaEventCreate", what)));
    } else {
      RS_RETURN_IF_ERROR(hop.AwaitTransfer(s.done, deadline, what + " (an earlier transfer)"));
    }
    if (staging_bytes > s.staging_bytes) {
      if (s.staging) cudaFree(s.staging);
      s.staging = nullptr;
      s.staging_bytes = 0;
      RS_RETURN_IF_ERROR(
          hop.Check(Cuda(cudaMalloc(&s.staging, staging_bytes), "cudaMalloc", what)));
      s.staging_bytes = staging_bytes;
    }
    return i;
  }
  // Posts transfer `i` on the hop stream after the work already on `compute`: `post` is the
  // ncclSend/ncclRecv call on hop.stream(); slot i's done event is recorded after it.
  template <typename PostFn>
  absl::Status Post(NcclHop& hop, int i, cudaStream_t compute, PostFn post, const char* call,
                    absl::Time deadline, const std::string& what) {
    const Slot& s = slots_[i];
    RS_RETURN_IF_ERROR(hop.Check(Cuda(cudaEventRecord(s.ready, compute), "cudaEventRecord", what)));
    RS_RETURN_IF_ERROR(hop.Check(
        Cuda(cudaStreamWaitEvent(hop.stream(), s.ready, 0), "cudaStreamWaitEvent", what)));
    RS_RETURN_IF_ERROR(hop.Posted(post(), call, deadline, what));
    return hop.Check(Cuda(cudaEventRecord(s.done, hop.stream()), "cudaEventRecord", what));
  }
  void* staging(int i) const { return slots_[i].staging; }
  cudaEvent_t done(int i) const { return slots_[i].done; }

 private:
  struct Slot {
    void* staging = nullptr;
    size_t staging_bytes = 0;
    cudaEvent_t ready = nullptr;  // compute stream: the transfer may start
    cudaEvent_t done = nullptr;   // hop stream: the transfer completed
  };
  Slot slots_[2];
  uint64_t count_ = 0;
};

class NcclSender : public DeviceActivationSender {
 public:
  NcclSender(std::unique_ptr<TcpLink> link, ncclComm_t comm, int device)
      : hop_(std::move(link), comm, device, /*rank=*/0) {}

  NcclHop& hop() { return hop_; }

  absl::Status Send(uint64_t micro_batch_id, const void* source, size_t bytes, GpuStream stream,
                    absl::Duration timeout) override {
    const std::string what =
        fmt::format("nccl send of micro-batch {} to {}", micro_batch_id, hop_.peer());
    RS_RETURN_IF_ERROR(hop_.Begin(what));
    absl::Time deadline = absl::Now() + timeout;
    std::byte count[8];
    PutU64(count, bytes);
    absl::Status status = hop_.link().Write(micro_batch_id, count, deadline, what);
    if (!status.ok()) return hop_.Fail(std::move(status));
    if (bytes > 0) {
      // Staged on the compute stream, sent from the staging buffer on the hop stream.
      RS_ASSIGN_OR_RETURN(const int i, transfers_.Next(hop_, bytes, deadline, what));
      void* staging = transfers_.staging(i);
      RS_RETURN_IF_ERROR(
          hop_.Check(Cuda(cudaMemcpyAsync(staging, source, bytes, cudaMemcpyDeviceToDevice, stream),
                          "cudaMemcpyAsync", what)));
      RS_RETURN_IF_ERROR(transfers_.Post(
          hop_, i, stream,
          [&] { return ncclSend(staging, bytes, ncclUint8, 1, hop_.comm(), hop_.stream()); },
          "ncclSend", deadline, what));
    }
    bytes_sent_ += static_cast<int64_t>(bytes);
    return absl::OkStatus();
  }
  void Close() override { hop_.Close(); }
  int64_t bytes_sent() const override { return bytes_sent_; }

 private:
  Transfers transfers_;  // destroyed after hop_ has aborted the communicator
  NcclHop hop_;
  int64_t bytes_sent_ = 0;
};

class NcclReceiver : public DeviceActivationReceiver {
 public:
  NcclReceiver(std::unique_ptr<TcpLink> link, ncclComm_t comm, int device)
      : hop_(std::move(link), comm, device, /*rank=*/1) {}

  NcclHop& hop() { return hop_; }

  absl::Status Recv(uint64_t micro_batch_id, void* destination, size_t bytes, GpuStream stream,
                    absl::Duration timeout) override {
    const std::string what =
        fmt::format("nccl receive of micro-batch {} from {}", micro_batch_id, hop_.peer());
    RS_RETURN_IF_ERROR(hop_.Begin(what));
    absl::Time deadline = absl::Now() + timeout;
    // The frame is checked before ncclRecv is posted: a mismatch must not leave NCCL waiting.
    std::byte count[8];
    absl::Status status = hop_.link().Read(micro_batch_id, count, deadline, what);
    if (!status.ok()) return hop_.Fail(std::move(status));
    uint64_t sent = GetU64(count);
    if (sent != bytes) {
      return hop_.Fail(absl::DataLossError(
          fmt::format("{}: the plan expects {} bytes, the sender sent {}", what, bytes, sent)));
    }
    if (bytes > 0) {
      // Into the destination on the hop stream, after the compute stream's earlier work (which
      // may still read the destination); the compute stream waits for the transfer.
      RS_ASSIGN_OR_RETURN(const int i, transfers_.Next(hop_, 0, deadline, what));
      RS_RETURN_IF_ERROR(transfers_.Post(
          hop_, i, stream,
          [&] { return ncclRecv(destination, bytes, ncclUint8, 0, hop_.comm(), hop_.stream()); },
          "ncclRecv", deadline, what));
      RS_RETURN_IF_ERROR(hop_.Check(
          Cuda(cudaStreamWaitEvent(stream, transfers_.done(i), 0), "cudaStreamWaitEvent", what)));
    }
    bytes_received_ += static_cast<int64_t>(bytes);
    return absl::OkStatus();
  }
  void Close() override { hop_.Close(); }
  int64_t bytes_received() const override { return bytes_received_; }

 private:
  Transfers transfers_;  // destroyed after hop_ has aborted the communicator
  NcclHop hop_;
  int64_t bytes_received_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceActivationReceiver>> NcclAccept(std::unique_ptr<TcpLink> link,
                                                                     int device,
                                                                     absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  const std::string what =
      fmt::format("nccl set-up of the hop from {} (device {})", link->peer(), device);
  RS_RETURN_IF_ERROR(Cuda(cudaSetDevice(device), "cudaSetDevice", what));
  ncclUniqueId id;
  int version = 0;
  ncclResult_t result = ncclGetUniqueId(&id);
  if (result == ncclSuccess) result = ncclGetVersion(&version);
  if (result != ncclSuccess) {
    return absl::UnavailableError(
        fmt::format("{}: ncclGetUniqueId failed: {}", what, NcclText(result, nullptr)));
  }
  std::byte frame[kIdFrameBytes];
  uint32_t version_u32 = static_cast<uint32_t>(version);
  std::memcpy(frame, &version_u32, 4);
  std::memcpy(frame + 4, &id, sizeof(id));
  RS_RETURN_IF_ERROR(link->Write(kUniqueIdTag, frame, deadline, what));
  RS_ASSIGN_OR_RETURN(ncclComm_t comm, JoinComm(id, /*rank=*/1, deadline, what));
  auto receiver = std::make_unique<NcclReceiver>(std::move(link), comm, device);
  RS_RETURN_IF_ERROR(receiver->hop().WarmUp(deadline, what));
  return std::unique_ptr<DeviceActivationReceiver>(std::move(receiver));
}

absl::StatusOr<std::unique_ptr<DeviceActivationSender>> NcclConnect(std::unique_ptr<TcpLink> link,
                                                                    int device,
                                                                    absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  const std::string what =
      fmt::format("nccl set-up of the hop to {} (device {})", link->peer(), device);
  RS_RETURN_IF_ERROR(Cuda(cudaSetDevice(device), "cudaSetDevice", what));
  std::byte frame[kIdFrameBytes];
  RS_RETURN_IF_ERROR(link->Read(kUniqueIdTag, frame, deadline, what));
  int mine = 0;
  ncclResult_t result = ncclGetVersion(&mine);
  if (result != ncclSuccess) {
    return absl::UnavailableError(
        fmt::format("{}: ncclGetVersion failed: {}", what, NcclText(result, nullptr)));
  }
  uint32_t theirs = 0;
  std::memcpy(&theirs, frame, 4);
  if (static_cast<int>(theirs) != mine) {
    return absl::FailedPreconditionError(
        fmt::format("{}: this stage runs NCCL {}, the next one NCCL {}; both need the same version",
                    what, VersionText(mine), VersionText(static_cast<int>(theirs))));
  }
  ncclUniqueId id;
  std::memcpy(&id, frame + 4, sizeof(id));
  RS_ASSIGN_OR_RETURN(ncclComm_t comm, JoinComm(id, /*rank=*/0, deadline, what));
  auto sender = std::make_unique<NcclSender>(std::move(link), comm, device);
  RS_RETURN_IF_ERROR(sender->hop().WarmUp(deadline, what));
  return std::unique_ptr<DeviceActivationSender>(std::move(sender));
}

bool NcclAvailable() { return true; }

std::string NcclVersionString() {
  int code = 0;
  if (ncclGetVersion(&code) != ncclSuccess) return "unknown";
  return VersionText(code);
}

}  // namespace ringserve
