#include "stage/channels/tcp_channel.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <thread>
#include <vector>

#include "common/ring_secret.h"
#include "gtest/gtest.h"

namespace ringserve {
namespace {

std::vector<std::byte> Pattern(size_t size, int seed) {
  std::vector<std::byte> data(size);
  for (size_t i = 0; i < size; ++i) data[i] = static_cast<std::byte>((i * 31 + seed) & 0xff);
  return data;
}

struct Pair {
  std::unique_ptr<ActivationSender> sender;
  std::unique_ptr<ActivationReceiver> receiver;
};

Pair Connect() {
  auto listener = TcpListener::Listen("127.0.0.1", 0);
  EXPECT_TRUE(listener.ok()) << listener.status();
  Pair pair;
  std::thread connector([&] {
    auto sender = TcpConnect((*listener)->endpoint(), 0, absl::Seconds(5));
    EXPECT_TRUE(sender.ok()) << sender.status();
    if (sender.ok()) pair.sender = std::move(*sender);
  });
  auto receiver = (*listener)->Accept(0, absl::Seconds(5));
  connector.join();
  EXPECT_TRUE(receiver.ok()) << receiver.status();
  if (receiver.ok()) pair.receiver = std::move(*receiver);
  return pair;
}

// A connection to `listener` that sends `bytes` (maybe none) and then stays silent.
int SilentStranger(const TcpListener& listener, std::span<const std::byte> bytes = {}) {
  std::string host;
  int port = 0;
  EXPECT_TRUE(SplitHostPort(listener.endpoint(), "test", &host, &port).ok());
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  if (!bytes.empty()) {
    EXPECT_EQ(write(fd, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  }
  return fd;
}

// A raw socket that sends the hello of stage 0, so tests can write broken frames by hand.
int RawConnect(TcpListener& listener, std::unique_ptr<ActivationReceiver>* receiver) {
  const uint32_t hello[2] = {0x49485352, 0};
  const int fd = SilentStranger(listener, std::as_bytes(std::span(hello)));
  auto accepted = listener.Accept(0, absl::Seconds(5));
  EXPECT_TRUE(accepted.ok()) << accepted.status();
  *receiver = std::move(*accepted);
  return fd;
}

// With `num_strangers` silent connections made before it (in the backlog, so a listener that
// introduced one connection at a time would spend its 5 s on each first), the real previous
// stage, which knows the secret, is admitted well within one connection's handshake limit.
void ExpectPeerAdmittedPromptlyBehindStrangers(int num_strangers) {
  const RingSecret secret = RingSecret::FromBytes("0123456789abcdef0123456789abcdef");
  auto listener = TcpListener::Listen("127.0.0.1", 0, &secret);
  ASSERT_TRUE(listener.ok()) << listener.status();
  const uint32_t hello[2] = {0x49485352, 0};  // stage 0's hello, but no proof follows
  std::vector<int> strangers;
  for (int i = 0; i < num_strangers; ++i) {
    strangers.push_back(i % 3 == 2 ? SilentStranger(**listener, std::as_bytes(std::span(hello)))
                                   : SilentStranger(**listener));
  }
  const absl::Time start = absl::Now();
  std::unique_ptr<ActivationSender> sender;
  std::thread connector([&] {
    auto connected = TcpConnect((*listener)->endpoint(), 0, absl::Seconds(30), &secret);
    EXPECT_TRUE(connected.ok()) << connected.status();
    if (connected.ok()) sender = std::move(*connected);
  });
  auto receiver = (*listener)->Accept(0, absl::Seconds(30));
  const absl::Duration took = absl::Now() - start;
  connector.join();
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  ASSERT_TRUE(sender);
  EXPECT_LT(took, absl::Milliseconds(2500)) << "one silent connection alone may hold 5 s";
  // The admitted connection is the peer's: frames flow.
  auto data = Pattern(256, 3);
  ASSERT_TRUE(sender->Send(1, data, absl::Seconds(5)).ok());
  std::vector<std::byte> out(256);
  ASSERT_TRUE((*receiver)->Recv(1, out, absl::Seconds(5)).ok());
  EXPECT_EQ(out, data);
  for (int fd : strangers) close(fd);
}

TEST(TcpChannelTest, SilentStrangersDoNotDelayThePeer) {
  ExpectPeerAdmittedPromptlyBehindStrangers(6);
}

// More strangers than handshakes may run at once: the oldest make room, so the peer still
// gets in.
TEST(TcpChannelTest, MoreSilentStrangersThanPlacesStillLetThePeerIn) {
  ExpectPeerAdmittedPromptlyBehindStrangers(40);
}

TEST(Crc32Test, MatchesKnownValue) {
  const char* text = "123456789";
  EXPECT_EQ(Crc32(std::as_bytes(std::span<const char>(text, 9))), 0xCBF43926u);
}

TEST(TcpChannelTest, DeliversMicroBatchesInOrder) {
  Pair pair = Connect();
  ASSERT_TRUE(pair.sender && pair.receiver);
  std::vector<size_t> sizes = {0, 1, 4096, 3 << 20};
  std::thread sender([&] {
    for (size_t i = 0; i < sizes.size(); ++i) {
      auto data = Pattern(sizes[i], static_cast<int>(i));
      EXPECT_TRUE(pair.sender->Send(i + 1, data, absl::Seconds(10)).ok());
    }
  });
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::vector<std::byte> out(sizes[i]);
    ASSERT_TRUE(pair.receiver->Recv(i + 1, out, absl::Seconds(10)).ok());
    EXPECT_EQ(out, Pattern(sizes[i], static_cast<int>(i)));
  }
  sender.join();
  EXPECT_EQ(pair.receiver->bytes_received(), pair.sender->bytes_sent());
}

TEST(TcpChannelTest, WrongMicroBatchIdIsDataLoss) {
  Pair pair = Connect();
  auto data = Pattern(64, 1);
  ASSERT_TRUE(pair.sender->Send(7, data, absl::Seconds(5)).ok());
  std::vector<std::byte> out(64);
  absl::Status status = pair.receiver->Recv(6, out, absl::Seconds(5));
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_NE(status.message().find("micro-batch 7"), std::string::npos) << status;
  // The channel is broken afterwards: fails fast.
  EXPECT_FALSE(pair.receiver->Recv(7, out, absl::Seconds(5)).ok());
}

TEST(TcpChannelTest, WrongByteCountIsDataLoss) {
  Pair pair = Connect();
  auto data = Pattern(64, 1);
  ASSERT_TRUE(pair.sender->Send(1, data, absl::Seconds(5)).ok());
  std::vector<std::byte> out(128);
  absl::Status status = pair.receiver->Recv(1, out, absl::Seconds(5));
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_NE(status.message().find("expects 128 bytes"), std::string::npos) << status;
}

TEST(TcpChannelTest, CorruptPayloadIsDataLoss) {
  auto listener = TcpListener::Listen("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok());
  std::unique_ptr<ActivationReceiver> receiver;
  int fd = RawConnect(**listener, &receiver);
  ASSERT_TRUE(receiver);
  // A valid header for 4 bytes "abcd", then different bytes.
  std::byte header[32];
  uint32_t magic = 0x43415352;
  uint16_t version = 1, reserved = 0;
  uint64_t id = 1, bytes = 4;
  const char payload[] = "abcd";
  uint32_t crc = Crc32(std::as_bytes(std::span<const char>(payload, 4)));
  std::memcpy(header, &magic, 4);
  std::memcpy(header + 4, &version, 2);
  std::memcpy(header + 6, &reserved, 2);
  std::memcpy(header + 8, &id, 8);
  std::memcpy(header + 16, &bytes, 8);
  std::memcpy(header + 24, &crc, 4);
  uint32_t header_crc = Crc32(std::span<const std::byte>(header, 28));
  std::memcpy(header + 28, &header_crc, 4);
  ASSERT_EQ(write(fd, header, 32), 32);
  ASSERT_EQ(write(fd, "abce", 4), 4);
  std::vector<std::byte> out(4);
  absl::Status status = receiver->Recv(1, out, absl::Seconds(5));
  EXPECT_TRUE(absl::IsDataLoss(status)) << status;
  EXPECT_NE(status.message().find("checksum"), std::string::npos) << status;
  close(fd);
}

TEST(TcpChannelTest, DroppedPeerIsUnavailableNotAHang) {
  Pair pair = Connect();
  std::vector<std::byte> out(1024);
  std::thread closer([&] { pair.sender->Close(); });
  absl::Time start = absl::Now();
  absl::Status status = pair.receiver->Recv(1, out, absl::Seconds(30));
  closer.join();
  EXPECT_TRUE(absl::IsUnavailable(status)) << status;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

// A peer that stops reading (stopped, wedged) holds a Send until its timeout, unless the
// sender's owner gives up on the ring: Abort from another thread ends it at once.
TEST(TcpChannelTest, AbortEndsASendToAPeerThatStopsReading) {
  Pair pair = Connect();
  const std::vector<std::byte> big = Pattern(64 << 20, 3);  // far more than the socket buffers
  absl::Status sent;
  absl::Time returned;
  std::thread sender([&] {
    sent = pair.sender->Send(1, big, absl::Seconds(120));
    returned = absl::Now();
  });
  // The kernel takes what fits in the buffers; the count shows it while Send blocks.
  const absl::Time wait_until = absl::Now() + absl::Seconds(30);
  while (pair.sender->bytes_moved() == 0 && absl::Now() < wait_until) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_GT(pair.sender->bytes_moved(), 0);
  const absl::Time aborted = absl::Now();
  pair.sender->Abort();
  sender.join();
  EXPECT_TRUE(absl::IsCancelled(sent)) << sent;
  EXPECT_NE(sent.message().find("aborted"), std::string::npos) << sent;
  EXPECT_LT(returned - aborted, absl::Seconds(10));
  EXPECT_LT(pair.sender->bytes_moved(), static_cast<int64_t>(big.size()));
  // Broken for good.
  EXPECT_FALSE(pair.sender->Send(2, Pattern(16, 1), absl::Seconds(1)).ok());
}

TEST(TcpChannelTest, AbortEndsAReceiveFromAPeerThatSendsNothing) {
  Pair pair = Connect();
  std::vector<std::byte> out(1024);
  absl::Status received;
  std::thread receiver([&] { received = pair.receiver->Recv(1, out, absl::Seconds(120)); });
  pair.receiver->Abort();  // before or while it waits: the same
  const absl::Time aborted = absl::Now();
  receiver.join();
  EXPECT_TRUE(absl::IsCancelled(received)) << received;
  EXPECT_LT(absl::Now() - aborted, absl::Seconds(10));
}

TEST(TcpChannelTest, BytesMovedCountsBothEnds) {
  Pair pair = Connect();
  const std::vector<std::byte> data = Pattern(1000, 5);
  ASSERT_TRUE(pair.sender->Send(7, data, absl::Seconds(5)).ok());
  std::vector<std::byte> out(data.size());
  ASSERT_TRUE(pair.receiver->Recv(7, out, absl::Seconds(5)).ok());
  EXPECT_EQ(pair.sender->bytes_moved(), pair.sender->bytes_sent());  // header and payload
  EXPECT_EQ(pair.receiver->bytes_moved(), pair.receiver->bytes_received());
  EXPECT_GT(pair.sender->bytes_moved(), static_cast<int64_t>(data.size()));
}

TEST(TcpChannelTest, SilentPeerTimesOut) {
  Pair pair = Connect();
  std::vector<std::byte> out(16);
  absl::Time start = absl::Now();
  absl::Status status = pair.receiver->Recv(1, out, absl::Milliseconds(200));
  EXPECT_TRUE(absl::IsDeadlineExceeded(status)) << status;
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(200));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(TcpChannelTest, AcceptRefusesWrongSenderAndTimesOut) {
  auto listener = TcpListener::Listen("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok());
  std::unique_ptr<ActivationSender> wrong;
  std::thread connector([&] {
    auto sender = TcpConnect((*listener)->endpoint(), 5, absl::Seconds(5));
    if (sender.ok()) wrong = std::move(*sender);
  });
  auto receiver = (*listener)->Accept(0, absl::Milliseconds(500));
  connector.join();
  EXPECT_TRUE(absl::IsDeadlineExceeded(receiver.status())) << receiver.status();
}

TEST(TcpChannelTest, ConnectToNobodyFailsWithinTheWait) {
  auto listener = TcpListener::Listen("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok());
  std::string endpoint = (*listener)->endpoint();
  listener->reset();  // nobody listens there now
  absl::Time start = absl::Now();
  auto sender = TcpConnect(endpoint, 0, absl::Milliseconds(300));
  EXPECT_TRUE(absl::IsUnavailable(sender.status())) << sender.status();
  EXPECT_NE(sender.status().message().find(endpoint), std::string::npos);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(SplitHostPortTest, RejectsJunk) {
  std::string host;
  int port = 0;
  EXPECT_TRUE(SplitHostPort("10.0.0.1:7001", "x", &host, &port).ok());
  EXPECT_EQ(host, "10.0.0.1");
  EXPECT_EQ(port, 7001);
  EXPECT_FALSE(SplitHostPort("10.0.0.1", "x", &host, &port).ok());
  EXPECT_FALSE(SplitHostPort("h:99999", "x", &host, &port).ok());
  EXPECT_FALSE(SplitHostPort("h:abc", "x", &host, &port).ok());
}

}  // namespace
}  // namespace ringserve
