#include "stage/channels/nccl/nccl_channel.h"

#include <cuda_runtime_api.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

extern char** environ;

namespace ringserve {
namespace {

constexpr int kSenderDevice = 0;
constexpr int kReceiverDevice = 1;
constexpr absl::Duration kSetupTimeout = absl::Seconds(60);
constexpr absl::Duration kTimeout = absl::Seconds(20);

// One process on one host: keep NCCL's bootstrap on loopback and NVLink multicast off (the GPU
// machines require it off). Values the caller already set win.
void PrepareNcclEnvironment() {
  setenv("NCCL_SOCKET_IFNAME", "lo", /*overwrite=*/0);
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
}

// Number of CUDA devices, 0 when there is no usable driver or device.
int DeviceCount(std::string* why) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    *why = cudaGetErrorString(err);
    return 0;
  }
  *why = std::to_string(count) + " device(s)";
  return count;
}

std::vector<std::byte> Pattern(size_t size, size_t seed) {
  std::vector<std::byte> data(size);
  for (size_t i = 0; i < size; ++i)
    data[i] = static_cast<std::byte>((i * 31 + seed * 7 + 3) & 0xff);
  return data;
}

::testing::AssertionResult SameBytes(const std::vector<std::byte>& got,
                                     const std::vector<std::byte>& want) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "size " << got.size() << ", want " << want.size();
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      return ::testing::AssertionFailure()
             << "first difference at byte " << i << " of " << got.size() << ": got "
             << static_cast<int>(got[i]) << ", want " << static_cast<int>(want[i]);
    }
  }
  return ::testing::AssertionSuccess();
}

// Device memory on one GPU (nullptr for 0 bytes), freed on scope exit.
class DeviceBuffer {
 public:
  DeviceBuffer(int device, size_t bytes) : device_(device), bytes_(bytes) {
    EXPECT_EQ(cudaSetDevice(device), cudaSuccess);
    if (bytes > 0) {
      EXPECT_EQ(cudaMalloc(&data_, bytes), cudaSuccess);
      EXPECT_EQ(cudaMemset(data_, 0xEE, bytes), cudaSuccess);
    }
  }
  ~DeviceBuffer() {
    if (data_ != nullptr) {
      cudaSetDevice(device_);
      cudaFree(data_);
    }
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return data_; }

  void Fill(const std::vector<std::byte>& host) {
    ASSERT_EQ(host.size(), bytes_);
    if (bytes_ == 0) return;
    ASSERT_EQ(cudaSetDevice(device_), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(data_, host.data(), bytes_, cudaMemcpyHostToDevice), cudaSuccess);
  }

  std::vector<std::byte> Read() const {
    std::vector<std::byte> host(bytes_);
    if (bytes_ == 0) return host;
    EXPECT_EQ(cudaSetDevice(device_), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(host.data(), data_, bytes_, cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }

 private:
  int device_;
  size_t bytes_;
  void* data_ = nullptr;
};

// A connected hop: sender on device 0, receiver on device 1, each with its own stream.
class NcclChannelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PrepareNcclEnvironment();
    std::string why;
    if (DeviceCount(&why) < 2) GTEST_SKIP() << "needs 2 CUDA devices; found " << why;
    ASSERT_EQ(cudaSetDevice(kSenderDevice), cudaSuccess);
    ASSERT_EQ(cudaStreamCreate(&send_stream_), cudaSuccess);
    ASSERT_EQ(cudaSetDevice(kReceiverDevice), cudaSuccess);
    ASSERT_EQ(cudaStreamCreate(&recv_stream_), cudaSuccess);

    auto listener = TcpListener::Listen("127.0.0.1", 0);
    ASSERT_TRUE(listener.ok()) << listener.status();
    absl::Status connect_status;
    std::thread connector([&] {
      auto link = TcpConnectLink((*listener)->endpoint(), /*sender_index=*/0, kSetupTimeout);
      if (!link.ok()) {
        connect_status = link.status();
        return;
      }
      auto sender = NcclConnect(std::move(*link), kSenderDevice, kSetupTimeout);
      connect_status = sender.status();
      if (sender.ok()) sender_ = std::move(*sender);
    });
    absl::Status accept_status;
    auto link = (*listener)->AcceptLink(/*expected_sender_index=*/0, kSetupTimeout);
    accept_status = link.status();
    if (link.ok()) {
      auto receiver = NcclAccept(std::move(*link), kReceiverDevice, kSetupTimeout);
      accept_status = receiver.status();
      if (receiver.ok()) receiver_ = std::move(*receiver);
    }
    connector.join();
    ASSERT_TRUE(accept_status.ok()) << accept_status;
    ASSERT_TRUE(connect_status.ok()) << connect_status;
  }

  void TearDown() override {
    sender_.reset();
    receiver_.reset();
    if (send_stream_ != nullptr) {
      cudaSetDevice(kSenderDevice);
      cudaStreamDestroy(send_stream_);
    }
    if (recv_stream_ != nullptr) {
      cudaSetDevice(kReceiverDevice);
      cudaStreamDestroy(recv_stream_);
    }
  }

  cudaStream_t send_stream_ = nullptr;
  cudaStream_t recv_stream_ = nullptr;
  std::unique_ptr<DeviceActivationSender> sender_;
  std::unique_ptr<DeviceActivationReceiver> receiver_;
};

TEST_F(NcclChannelTest, DeliversMicroBatchesOfEverySizeExactly) {
  const std::vector<size_t> sizes = {1, 0, 4096, (3u << 20) + 5, 257, 8u << 20};
  absl::Status send_status;
  std::thread sender([&] {
    for (size_t i = 0; i < sizes.size() && send_status.ok(); ++i) {
      DeviceBuffer source(kSenderDevice, sizes[i]);
      source.Fill(Pattern(sizes[i], i));
      send_status = sender_->Send(100 + i, source.get(), sizes[i], send_stream_, kTimeout);
      // The source is copied on send_stream_ (to a staging buffer) after Send returns.
      if (cudaStreamSynchronize(send_stream_) != cudaSuccess)
        send_status = absl::InternalError("sync");
    }
  });
  int64_t total = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    DeviceBuffer destination(kReceiverDevice, sizes[i]);
    absl::Status status =
        receiver_->Recv(100 + i, destination.get(), sizes[i], recv_stream_, kTimeout);
    EXPECT_TRUE(status.ok()) << "micro-batch " << 100 + i << ": " << status;
    if (!status.ok()) break;
    // Work on recv_stream_ after Recv sees the data; a host read waits for that stream.
    ASSERT_EQ(cudaStreamSynchronize(recv_stream_), cudaSuccess);
    EXPECT_TRUE(SameBytes(destination.Read(), Pattern(sizes[i], i)))
        << "micro-batch " << 100 + i << " of " << sizes[i] << " bytes";
    total += static_cast<int64_t>(sizes[i]);
  }
  sender.join();
  EXPECT_TRUE(send_status.ok()) << send_status;
  EXPECT_EQ(sender_->bytes_sent(), total);
  EXPECT_EQ(receiver_->bytes_received(), total);
}

TEST_F(NcclChannelTest, WrongMicroBatchIdIsDataLossAndBreaksTheChannel) {
  DeviceBuffer source(kSenderDevice, 64);
  DeviceBuffer destination(kReceiverDevice, 64);
  source.Fill(Pattern(64, 1));
  // NCCL may complete a small send before the receiver posts, or the send times out waiting;
  // either way it returns. What matters is the receiver's verdict.
  absl::Status sent = sender_->Send(7, source.get(), 64, send_stream_, absl::Seconds(3));
  absl::Status got = receiver_->Recv(8, destination.get(), 64, recv_stream_, kTimeout);
  EXPECT_EQ(got.code(), absl::StatusCode::kDataLoss) << got << " (send: " << sent << ")";
  EXPECT_NE(got.message().find("micro-batch 8"), absl::string_view::npos) << got;
  EXPECT_NE(got.message().find("micro-batch 7"), absl::string_view::npos) << got;
  absl::Status again = receiver_->Recv(7, destination.get(), 64, recv_stream_, kTimeout);
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
}

TEST_F(NcclChannelTest, WrongByteCountIsDataLoss) {
  DeviceBuffer source(kSenderDevice, 64);
  DeviceBuffer destination(kReceiverDevice, 128);
  source.Fill(Pattern(64, 2));
  absl::Status sent = sender_->Send(5, source.get(), 64, send_stream_, absl::Seconds(3));
  absl::Status got = receiver_->Recv(5, destination.get(), 128, recv_stream_, kTimeout);
  EXPECT_EQ(got.code(), absl::StatusCode::kDataLoss) << got << " (send: " << sent << ")";
  EXPECT_NE(got.message().find("expects 128 bytes, the sender sent 64"), absl::string_view::npos)
      << got;
}

TEST_F(NcclChannelTest, ClosingTheSenderFailsThePendingRecvQuickly) {
  DeviceBuffer destination(kReceiverDevice, 1024);
  const absl::Duration recv_timeout = absl::Seconds(30);
  absl::Status got;
  absl::Time start = absl::Now();
  std::thread receiver(
      [&] { got = receiver_->Recv(1, destination.get(), 1024, recv_stream_, recv_timeout); });
  sender_->Close();
  receiver.join();
  EXPECT_EQ(got.code(), absl::StatusCode::kUnavailable) << got;
  EXPECT_LT(absl::Now() - start, recv_timeout / 2);
  DeviceBuffer source(kSenderDevice, 16);
  absl::Status sent = sender_->Send(2, source.get(), 16, send_stream_, kTimeout);
  EXPECT_EQ(sent.code(), absl::StatusCode::kFailedPrecondition) << sent;
}

// Needs one GPU: the receiver's set-up must give up (not hang) when the sender never joins.
TEST(NcclSetupTest, AcceptTimesOutWhenTheSenderNeverJoins) {
  PrepareNcclEnvironment();
  std::string why;
  if (DeviceCount(&why) < 1) GTEST_SKIP() << "needs a CUDA device; found " << why;
  auto listener = TcpListener::Listen("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok()) << listener.status();
  // A sender that connects and says hello but never reads the id nor joins NCCL.
  auto silent = TcpConnectLink((*listener)->endpoint(), /*sender_index=*/0, kTimeout);
  ASSERT_TRUE(silent.ok()) << silent.status();
  auto link = (*listener)->AcceptLink(/*expected_sender_index=*/0, kTimeout);
  ASSERT_TRUE(link.ok()) << link.status();
  absl::Time start = absl::Now();
  auto receiver = NcclAccept(std::move(*link), /*device=*/0, absl::Seconds(3));
  EXPECT_EQ(receiver.status().code(), absl::StatusCode::kDeadlineExceeded) << receiver.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
}

// A peer that dies mid-transfer: another process (this binary again, RS_NCCL_DYING_PEER set)
// joins the hop, holds its stream with a host function that never returns, sends or receives
// one micro-batch (the frame goes out, the transfer cannot start) and exits. The survivor must
// end in an error within its deadlines, and its stuck transfer must end when the channel aborts
// the communicator (no stream left waiting forever, the device still usable).
constexpr char kDyingPeerEnv[] = "RS_NCCL_DYING_PEER";  // "send ENDPOINT" or "recv ENDPOINT"
constexpr size_t kDyingBytes = 1 << 20;

void BlockForever(void*) {
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

// The dying peer's side (runs in the child process; exits, never returns).
[[noreturn]] void RunDyingPeer(const std::string& spec) {
  const bool send = spec.rfind("send ", 0) == 0;
  const std::string endpoint = spec.substr(5);
  const int device = send ? kSenderDevice : kReceiverDevice;
  cudaStream_t stream = nullptr;
  void* buffer = nullptr;
  if (cudaSetDevice(device) != cudaSuccess || cudaStreamCreate(&stream) != cudaSuccess ||
      cudaMalloc(&buffer, kDyingBytes) != cudaSuccess) {
    _exit(10);
  }
  if (send) {
    auto link = TcpConnectLink(endpoint, /*sender_index=*/0, kSetupTimeout);
    if (!link.ok()) _exit(11);
    auto sender = NcclConnect(std::move(*link), device, kSetupTimeout);
    if (!sender.ok()) _exit(12);
    if (cudaLaunchHostFunc(stream, BlockForever, nullptr) != cudaSuccess) _exit(13);
    // The frame goes out; the staging copy and ncclSend wait behind the host function.
    if (!(*sender)->Send(1, buffer, kDyingBytes, stream, kTimeout).ok()) _exit(14);
  } else {
    auto listener = TcpListener::Listen("127.0.0.1", 0);
    if (!listener.ok()) _exit(15);
    // Tell the parent where to connect: its endpoint file.
    FILE* f = std::fopen(endpoint.c_str(), "w");
    if (f == nullptr) _exit(16);
    std::fprintf(f, "%s\n", (*listener)->endpoint().c_str());
    std::fclose(f);
    auto link = (*listener)->AcceptLink(/*expected_sender_index=*/0, kSetupTimeout);
    if (!link.ok()) _exit(17);
    auto receiver = NcclAccept(std::move(*link), device, kSetupTimeout);
    if (!receiver.ok()) _exit(18);
    if (cudaLaunchHostFunc(stream, BlockForever, nullptr) != cudaSuccess) _exit(19);
    // Reads the frame; ncclRecv waits on the hop stream behind the host function.
    if (!(*receiver)->Recv(1, buffer, kDyingBytes, stream, kTimeout).ok()) _exit(20);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the frame is on its way
  _exit(0);
}

class DyingPeerEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    if (const char* spec = std::getenv(kDyingPeerEnv)) {
      PrepareNcclEnvironment();
      RunDyingPeer(spec);
    }
  }
};
[[maybe_unused]] const auto* const kDyingPeer =
    ::testing::AddGlobalTestEnvironment(new DyingPeerEnvironment);

// Starts this test binary as the dying peer; returns its pid (0 on failure).
pid_t SpawnDyingPeer(const std::string& spec) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  env_strings.push_back(std::string(kDyingPeerEnv) + "=" + spec);
  std::vector<char*> envp;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string self = "/proc/self/exe";
  // gtest sets environments up only when a test is selected; the environment exits before it.
  std::string filter = "--gtest_filter=NcclDyingPeerTest.*";
  char* argv[] = {self.data(), filter.data(), nullptr};
  pid_t pid = 0;
  if (posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv, envp.data()) != 0) return 0;
  return pid;
}

// Polls `stream` until its work has ended (completed or failed), up to `limit`.
bool StreamEnds(int device, cudaStream_t stream, absl::Duration limit) {
  cudaSetDevice(device);
  const absl::Time end = absl::Now() + limit;
  while (absl::Now() < end) {
    if (cudaStreamQuery(stream) != cudaErrorNotReady) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

TEST(NcclDyingPeerTest, SenderDyingAfterItsFrameFailsTheReceiverAndEndsItsTransfer) {
  PrepareNcclEnvironment();
  std::string why;
  if (DeviceCount(&why) < 2) GTEST_SKIP() << "needs 2 CUDA devices; found " << why;
  auto listener = TcpListener::Listen("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok()) << listener.status();
  const pid_t child = SpawnDyingPeer("send " + (*listener)->endpoint());
  ASSERT_GT(child, 0);
  auto link = (*listener)->AcceptLink(/*expected_sender_index=*/0, kSetupTimeout);
  ASSERT_TRUE(link.ok()) << link.status();
  auto receiver = NcclAccept(std::move(*link), kReceiverDevice, kSetupTimeout);
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  DeviceBuffer destination(kReceiverDevice, kDyingBytes);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  // The frame arrived: the receive is posted and the stream waits for a transfer that will
  // never come.
  absl::Status first = (*receiver)->Recv(1, destination.get(), kDyingBytes, stream, kTimeout);
  EXPECT_TRUE(first.ok()) << first;
  int child_status = 0;
  ASSERT_EQ(waitpid(child, &child_status, 0), child);
  EXPECT_TRUE(WIFEXITED(child_status) && WEXITSTATUS(child_status) == 0) << child_status;
  // The next receive sees the dead peer's closed link at once and aborts the communicator.
  const absl::Time start = absl::Now();
  absl::Status second = (*receiver)->Recv(2, destination.get(), kDyingBytes, stream, kTimeout);
  EXPECT_EQ(second.code(), absl::StatusCode::kUnavailable) << second;
  EXPECT_LT(absl::Now() - start, kTimeout / 2);
  // The abort ended the stuck ncclRecv: the stream drains and the device still works.
  EXPECT_TRUE(StreamEnds(kReceiverDevice, stream, absl::Seconds(20)));
  receiver->reset();
  cudaGetLastError();
  DeviceBuffer after(kReceiverDevice, 64);  // allocates and sets memory on the device
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaStreamDestroy(stream);
}

TEST(NcclDyingPeerTest, ReceiverDyingAfterTheFrameFailsTheSenderWithinItsDeadline) {
  PrepareNcclEnvironment();
  std::string why;
  if (DeviceCount(&why) < 2) GTEST_SKIP() << "needs 2 CUDA devices; found " << why;
  const std::string endpoint_file =
      ::testing::TempDir() + "/rs_nccl_dying_receiver_" + std::to_string(getpid());
  std::remove(endpoint_file.c_str());
  const pid_t child = SpawnDyingPeer("recv " + endpoint_file);
  ASSERT_GT(child, 0);
  std::string endpoint;
  for (int i = 0; i < 600 && endpoint.empty(); ++i) {
    if (FILE* f = std::fopen(endpoint_file.c_str(), "r")) {
      char line[256] = {0};
      if (std::fgets(line, sizeof(line), f) != nullptr && std::strchr(line, '\n') != nullptr) {
        endpoint.assign(line, std::strcspn(line, "\n"));
      }
      std::fclose(f);
    }
    if (endpoint.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_FALSE(endpoint.empty()) << "the dying receiver did not start";
  auto link = TcpConnectLink(endpoint, /*sender_index=*/0, kSetupTimeout);
  ASSERT_TRUE(link.ok()) << link.status();
  auto sender = NcclConnect(std::move(*link), kSenderDevice, kSetupTimeout);
  ASSERT_TRUE(sender.ok()) << sender.status();
  DeviceBuffer source(kSenderDevice, kDyingBytes);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  EXPECT_TRUE((*sender)->Send(1, source.get(), kDyingBytes, stream, kTimeout).ok());
  int child_status = 0;
  ASSERT_EQ(waitpid(child, &child_status, 0), child);
  EXPECT_TRUE(WIFEXITED(child_status) && WEXITSTATUS(child_status) == 0) << child_status;
  // Later sends fail: the closed link (Unavailable) or, at the latest, the deadline on the
  // slot of transfer 1 (DeadlineExceeded); after the error the channel fails fast.
  const absl::Duration deadline = absl::Seconds(3);
  const absl::Time start = absl::Now();
  absl::Status status;
  for (uint64_t id = 2; id <= 4 && status.ok(); ++id) {
    status = (*sender)->Send(id, source.get(), kDyingBytes, stream, deadline);
  }
  EXPECT_FALSE(status.ok());
  EXPECT_TRUE(status.code() == absl::StatusCode::kUnavailable ||
              status.code() == absl::StatusCode::kDeadlineExceeded)
      << status;
  EXPECT_LT(absl::Now() - start, 3 * deadline);
  absl::Status after = (*sender)->Send(9, source.get(), kDyingBytes, stream, deadline);
  EXPECT_EQ(after.code(), absl::StatusCode::kFailedPrecondition) << after;
  // The sender's compute stream never waits on the hop.
  EXPECT_TRUE(StreamEnds(kSenderDevice, stream, absl::Seconds(20)));
  sender->reset();
  cudaGetLastError();
  // Returns only once the aborted ncclSend kernels have ended (a hang here is the failure).
  ASSERT_EQ(cudaSetDevice(kSenderDevice), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaStreamDestroy(stream);
  std::remove(endpoint_file.c_str());
}

}  // namespace
}  // namespace ringserve
