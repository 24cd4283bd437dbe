#include "stage/channels/nccl/nccl_channel.h"

#include <cuda_runtime_api.h>

#include <cstdlib>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

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

}  // namespace
}  // namespace ringserve
