#include "stage/channels/tcp_channel.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "stage/channels/pending_handshakes.h"

namespace ringserve {
namespace {

constexpr uint32_t kFrameMagic = 0x43415352;  // "RSAC"
constexpr uint32_t kHelloMagic = 0x49485352;  // "RSHI"
constexpr uint16_t kFrameVersion = 1;
constexpr size_t kHeaderBytes = 32;
constexpr size_t kHelloBytes = 8;

void PutU16(std::byte* p, uint16_t v) { std::memcpy(p, &v, 2); }
void PutU32(std::byte* p, uint32_t v) { std::memcpy(p, &v, 4); }
void PutU64(std::byte* p, uint64_t v) { std::memcpy(p, &v, 8); }
uint16_t GetU16(const std::byte* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
uint32_t GetU32(const std::byte* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t GetU64(const std::byte* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

std::string ErrnoText() { return std::strerror(errno); }

int64_t RemainingMs(absl::Time deadline) {
  absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return absl::ToInt64Milliseconds(left) + 1;
}

// Waits until `fd` is readable (POLLIN) or writable (POLLOUT) or the deadline passes.
absl::Status WaitFd(int fd, short events, absl::Time deadline, const std::string& what) {
  while (true) {
    int64_t ms = RemainingMs(deadline);
    if (ms <= 0) return absl::DeadlineExceededError(fmt::format("{}: timed out", what));
    pollfd p{fd, events, 0};
    int rc = poll(&p, 1, static_cast<int>(std::min<int64_t>(ms, 1 << 30)));
    if (rc < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(fmt::format("{}: poll: {}", what, ErrnoText()));
    }
    if (rc == 0) continue;  // re-check the deadline
    if (p.revents & (POLLERR | POLLNVAL)) {
      return absl::UnavailableError(fmt::format("{}: connection error", what));
    }
    return absl::OkStatus();  // readable/writable or hung up (the read/write reports it)
  }
}

// `moved` (optional) counts the bytes as they arrive (TcpLink::bytes_moved).
absl::Status ReadFull(int fd, std::byte* data, size_t size, absl::Time deadline,
                      const std::string& what, std::atomic<int64_t>* moved = nullptr) {
  size_t done = 0;
  while (done < size) {
    RS_RETURN_IF_ERROR(WaitFd(fd, POLLIN, deadline, what));
    ssize_t n = recv(fd, data + done, size - done, MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
      if (moved != nullptr) moved->fetch_add(n, std::memory_order_relaxed);
    } else if (n == 0) {
      return absl::UnavailableError(
          fmt::format("{}: peer closed the connection after {} of {} bytes", what, done, size));
    } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return absl::UnavailableError(fmt::format("{}: recv: {}", what, ErrnoText()));
    }
  }
  return absl::OkStatus();
}

// `moved` (optional) counts the bytes as the kernel takes them (TcpLink::bytes_moved).
absl::Status WriteFull(int fd, const std::byte* data, size_t size, absl::Time deadline,
                       const std::string& what, std::atomic<int64_t>* moved = nullptr) {
  size_t done = 0;
  while (done < size) {
    RS_RETURN_IF_ERROR(WaitFd(fd, POLLOUT, deadline, what));
    ssize_t n = send(fd, data + done, size - done, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n >= 0) {
      done += static_cast<size_t>(n);
      if (moved != nullptr) moved->fetch_add(n, std::memory_order_relaxed);
    } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      return absl::UnavailableError(fmt::format("{}: send: {}", what, ErrnoText()));
    }
  }
  return absl::OkStatus();
}

constexpr absl::Duration kHandshakeTimeout = absl::Seconds(5);
// Connections introducing themselves to a listener at once (pending_handshakes.h).
constexpr size_t kMaxPendingHandshakes = 16;
// Connections the kernel holds until AcceptLink runs (strangers may come while the stage
// loads): room for more than kMaxPendingHandshakes, so they cannot fill it before the peer.
constexpr int kListenBacklog = 64;
constexpr size_t kNonceChars = 32;
constexpr size_t kProofChars = 64;

absl::Status WriteText(int fd, const std::string& text, absl::Time deadline,
                       const std::string& what) {
  return WriteFull(fd, reinterpret_cast<const std::byte*>(text.data()), text.size(), deadline,
                   what);
}

absl::StatusOr<std::string> ReadText(int fd, size_t size, absl::Time deadline,
                                     const std::string& what) {
  std::string text(size, '\0');
  RS_RETURN_IF_ERROR(ReadFull(fd, reinterpret_cast<std::byte*>(text.data()), size, deadline, what));
  return text;
}

// The listener's half of the handshake in tcp_channel.h (after the hello).
absl::Status ProveListener(int fd, const RingSecret& secret, int sender_index, absl::Time deadline,
                           const std::string& what) {
  RS_ASSIGN_OR_RETURN(std::string nonce_c, ReadText(fd, kNonceChars, deadline, what));
  std::string nonce_l = RandomHex(kNonceChars / 2);
  RS_RETURN_IF_ERROR(
      WriteText(fd, nonce_l + secret.Mac(ChannelProofMessage("listener", nonce_c, sender_index)),
                deadline, what));
  RS_ASSIGN_OR_RETURN(std::string proof, ReadText(fd, kProofChars, deadline, what));
  if (!secret.Verify(ChannelProofMessage("connector", nonce_l, sender_index), proof)) {
    return absl::PermissionDeniedError("the peer does not know the ring secret");
  }
  return absl::OkStatus();
}

// The connector's half.
absl::Status ProveConnector(int fd, const RingSecret& secret, int sender_index, absl::Time deadline,
                            const std::string& what) {
  std::string nonce_c = RandomHex(kNonceChars / 2);
  RS_RETURN_IF_ERROR(WriteText(fd, nonce_c, deadline, what));
  RS_ASSIGN_OR_RETURN(std::string reply, ReadText(fd, kNonceChars + kProofChars, deadline, what));
  std::string nonce_l = reply.substr(0, kNonceChars);
  if (!secret.Verify(ChannelProofMessage("listener", nonce_c, sender_index),
                     std::string_view(reply).substr(kNonceChars))) {
    return absl::PermissionDeniedError(
        fmt::format("{}: the listener does not know the ring secret", what));
  }
  return WriteText(fd, secret.Mac(ChannelProofMessage("connector", nonce_l, sender_index)),
                   deadline, what);
}

// A connection's introduction as the listener checks it: the hello naming
// `expected_sender_index`, then with a secret the proof (tcp_channel.h), all by `deadline`.
// Errors name `what`.
absl::Status IntroduceToListener(int fd, int expected_sender_index, const RingSecret* secret,
                                 absl::Time deadline, const std::string& what) {
  std::byte hello[kHelloBytes];
  RS_RETURN_IF_ERROR(ReadFull(fd, hello, kHelloBytes, deadline, what));
  if (GetU32(hello) != kHelloMagic ||
      static_cast<int32_t>(GetU32(hello + 4)) != expected_sender_index) {
    return absl::PermissionDeniedError(
        fmt::format("{}: not stage {}'s hello", what, expected_sender_index));
  }
  if (secret == nullptr) return absl::OkStatus();
  absl::Status status = ProveListener(fd, *secret, expected_sender_index, deadline, what);
  if (absl::IsPermissionDenied(status)) {
    return absl::PermissionDeniedError(fmt::format("{}: {}", what, std::string(status.message())));
  }
  return status;
}

// Low latency (no Nagle) and keepalive probes on an activation connection.
void TuneConnection(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  // A neighbour whose host vanished (no reset ever comes) is noticed within about 5 s instead
  // of at the step timeout: keepalive probes after 2 s idle, every second, 3 unanswered.
  int idle_s = 2, interval_s = 1, probes = 3;
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof(idle_s));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval_s, sizeof(interval_s));
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof(probes));
}

absl::StatusOr<addrinfo*> Resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  std::string h = host == "localhost" ? "127.0.0.1" : host;
  addrinfo* result = nullptr;
  int rc =
      getaddrinfo(h.empty() ? nullptr : h.c_str(), std::to_string(port).c_str(), &hints, &result);
  if (rc != 0 || result == nullptr) {
    return absl::UnavailableError(
        fmt::format("cannot resolve {}:{}: {}", host, port, gai_strerror(rc)));
  }
  return result;
}

// Reads one frame carrying `expected_tag` and exactly out.size() payload bytes.
absl::Status ReadFrame(int fd, uint64_t expected_tag, std::span<std::byte> out, absl::Time deadline,
                       const std::string& what, std::atomic<int64_t>* moved) {
  std::byte header[kHeaderBytes];
  RS_RETURN_IF_ERROR(ReadFull(fd, header, kHeaderBytes, deadline, what, moved));
  if (GetU32(header) != kFrameMagic || GetU16(header + 4) != kFrameVersion) {
    return absl::DataLossError(what + ": bad frame header (magic or version)");
  }
  if (GetU32(header + 28) != Crc32(std::span<const std::byte>(header, 28))) {
    return absl::DataLossError(what + ": frame header checksum mismatch");
  }
  uint64_t got_tag = GetU64(header + 8);
  uint64_t got_bytes = GetU64(header + 16);
  if (got_tag != expected_tag) {
    return absl::DataLossError(
        fmt::format("{}: got micro-batch {} instead (stages out of order)", what, got_tag));
  }
  if (got_bytes != out.size()) {
    return absl::DataLossError(fmt::format("{}: the plan expects {} bytes, the frame holds {}",
                                           what, out.size(), got_bytes));
  }
  RS_RETURN_IF_ERROR(ReadFull(fd, out.data(), out.size(), deadline, what, moved));
  if (Crc32(out) != GetU32(header + 24)) {
    return absl::DataLossError(what + ": payload checksum mismatch");
  }
  return absl::OkStatus();
}

class TcpSender : public ActivationSender {
 public:
  explicit TcpSender(std::unique_ptr<TcpLink> link) : link_(std::move(link)) {}

  absl::Status Send(uint64_t micro_batch_id, std::span<const std::byte> data,
                    absl::Duration timeout) override {
    RS_RETURN_IF_ERROR(link_->Write(
        micro_batch_id, data, absl::Now() + timeout,
        fmt::format("tcp send of micro-batch {} to {}", micro_batch_id, link_->peer())));
    bytes_sent_ += static_cast<int64_t>(kHeaderBytes + data.size());
    return absl::OkStatus();
  }
  void Close() override { link_->Close(); }
  int64_t bytes_sent() const override { return bytes_sent_; }
  void Abort() override { link_->Abort(); }
  int64_t bytes_moved() const override { return link_->bytes_moved(); }

 private:
  std::unique_ptr<TcpLink> link_;
  int64_t bytes_sent_ = 0;
};

class TcpReceiver : public ActivationReceiver {
 public:
  explicit TcpReceiver(std::unique_ptr<TcpLink> link) : link_(std::move(link)) {}

  absl::Status Recv(uint64_t micro_batch_id, std::span<std::byte> out,
                    absl::Duration timeout) override {
    RS_RETURN_IF_ERROR(link_->Read(
        micro_batch_id, out, absl::Now() + timeout,
        fmt::format("tcp receive of micro-batch {} from {}", micro_batch_id, link_->peer())));
    bytes_received_ += static_cast<int64_t>(kHeaderBytes + out.size());
    return absl::OkStatus();
  }
  void Close() override { link_->Close(); }
  int64_t bytes_received() const override { return bytes_received_; }
  void Abort() override { link_->Abort(); }
  int64_t bytes_moved() const override { return link_->bytes_moved(); }

 private:
  std::unique_ptr<TcpLink> link_;
  int64_t bytes_received_ = 0;
};

std::string PeerName(const sockaddr_storage& addr) {
  char host[NI_MAXHOST] = {0};
  char port[NI_MAXSERV] = {0};
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), sizeof(addr), host, sizeof(host), port,
                  sizeof(port), NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "?";
  }
  return fmt::format("{}:{}", host, port);
}

}  // namespace

uint32_t Crc32(std::span<const std::byte> data) {
  uLong crc = crc32(0L, Z_NULL, 0);
  const auto* bytes = reinterpret_cast<const Bytef*>(data.data());
  size_t left = data.size();
  while (left > 0) {
    uInt n = static_cast<uInt>(std::min<size_t>(left, 1u << 30));
    crc = crc32(crc, bytes, n);
    bytes += n;
    left -= n;
  }
  return static_cast<uint32_t>(crc);
}

absl::Status TcpLink::Write(uint64_t tag, std::span<const std::byte> payload, absl::Time deadline,
                            const std::string& what) {
  if (fd_ < 0) return absl::FailedPreconditionError(what + ": channel is closed");
  std::byte header[kHeaderBytes];
  PutU32(header, kFrameMagic);
  PutU16(header + 4, kFrameVersion);
  PutU16(header + 6, 0);
  PutU64(header + 8, tag);
  PutU64(header + 16, payload.size());
  PutU32(header + 24, Crc32(payload));
  PutU32(header + 28, Crc32(std::span<const std::byte>(header, 28)));
  absl::Status status = WriteFull(fd_, header, kHeaderBytes, deadline, what, &bytes_moved_);
  if (status.ok()) {
    status = WriteFull(fd_, payload.data(), payload.size(), deadline, what, &bytes_moved_);
  }
  if (!status.ok()) {
    Close();
    if (aborted_.load()) return absl::CancelledError(what + ": aborted (the ring was closed)");
  }
  return status;
}

absl::Status TcpLink::Read(uint64_t expected_tag, std::span<std::byte> out, absl::Time deadline,
                           const std::string& what) {
  if (fd_ < 0) return absl::FailedPreconditionError(what + ": channel is closed");
  absl::Status status = ReadFrame(fd_, expected_tag, out, deadline, what, &bytes_moved_);
  if (!status.ok()) {
    Close();
    if (aborted_.load()) return absl::CancelledError(what + ": aborted (the ring was closed)");
  }
  return status;
}

void TcpLink::Close() {
  std::lock_guard<std::mutex> lock(fd_mu_);
  if (fd_ >= 0) {
    shutdown(fd_, SHUT_RDWR);
    close(fd_);
    fd_ = -1;
  }
}

void TcpLink::Abort() {
  std::lock_guard<std::mutex> lock(fd_mu_);
  aborted_.store(true);
  // Wakes a poll on the socket in another thread; the descriptor stays the owner's to close.
  if (fd_ >= 0) shutdown(fd_, SHUT_RDWR);
}

absl::Status SplitHostPort(const std::string& endpoint, const std::string& what, std::string* host,
                           int* port) {
  size_t colon = endpoint.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError(fmt::format("{}: '{}' is not host:port", what, endpoint));
  }
  std::string h = endpoint.substr(0, colon);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  int p = 0;
  if (!absl::SimpleAtoi(absl::string_view(endpoint.data() + colon + 1, endpoint.size() - colon - 1),
                        &p) ||
      p < 0 || p > 65535) {
    return absl::InvalidArgumentError(
        fmt::format("{}: '{}' has no valid port (0..65535)", what, endpoint));
  }
  *host = h;
  *port = p;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TcpListener>> TcpListener::Listen(const std::string& host, int port,
                                                                 const RingSecret* secret) {
  RS_ASSIGN_OR_RETURN(addrinfo * info, Resolve(host, port, /*passive=*/true));
  int fd = -1;
  std::string error = "no address";
  for (addrinfo* ai = info; ai != nullptr; ai = ai->ai_next) {
    // Non-blocking: a connection that vanishes between poll and accept must not block it.
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, kListenBacklog) == 0) break;
    error = ErrnoText();
    close(fd);
    fd = -1;
  }
  freeaddrinfo(info);
  if (fd < 0) {
    return absl::UnavailableError(
        fmt::format("cannot listen for activations on {}:{}: {}", host, port, error));
  }
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  int bound_port = addr.ss_family == AF_INET6
                       ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                       : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  std::string shown_host = host.empty() ? "0.0.0.0" : host;
  return std::unique_ptr<TcpListener>(
      new TcpListener(fd, fmt::format("{}:{}", shown_host, bound_port),
                      secret != nullptr ? std::optional<RingSecret>(*secret) : std::nullopt));
}

TcpListener::~TcpListener() {
  if (fd_ >= 0) close(fd_);
}

absl::StatusOr<std::unique_ptr<ActivationReceiver>> TcpListener::Accept(int expected_sender_index,
                                                                        absl::Duration timeout) {
  RS_ASSIGN_OR_RETURN(std::unique_ptr<TcpLink> link, AcceptLink(expected_sender_index, timeout));
  return std::unique_ptr<ActivationReceiver>(new TcpReceiver(std::move(link)));
}

absl::StatusOr<std::unique_ptr<TcpLink>> TcpListener::AcceptLink(int expected_sender_index,
                                                                 absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  const std::string what =
      fmt::format("waiting on {} for stage {} to connect", endpoint_, expected_sender_index);
  const RingSecret* secret = secret_.has_value() ? &*secret_ : nullptr;
  // Each connection introduces itself on its own thread, with a few seconds of its own, so a
  // silent stranger holds neither the listener until the stage's deadline nor the real peer
  // behind it.
  RS_ASSIGN_OR_RETURN(std::unique_ptr<PendingHandshakes> pending,
                      PendingHandshakes::Create(kMaxPendingHandshakes, [=](int conn) {
                        return IntroduceToListener(
                            conn, expected_sender_index, secret,
                            std::min(deadline, absl::Now() + kHandshakeTimeout), what);
                      }));
  while (true) {
    if (std::optional<PendingHandshakes::Admitted> admitted = pending->TakeReady()) {
      return std::make_unique<TcpLink>(
          admitted->fd, fmt::format("stage {} ({})", expected_sender_index, admitted->peer));
    }
    const int64_t ms = RemainingMs(deadline);
    if (ms <= 0) return absl::DeadlineExceededError(fmt::format("{}: nobody came", what));
    pollfd fds[2] = {{fd_, POLLIN, 0}, {pending->ready_fd(), POLLIN, 0}};
    int rc = poll(fds, 2, static_cast<int>(std::min<int64_t>(ms, 1 << 30)));
    if (rc < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(fmt::format("{}: poll: {}", what, ErrnoText()));
    }
    if (fds[0].revents & (POLLERR | POLLNVAL)) {
      return absl::UnavailableError(fmt::format("{}: listening socket error", what));
    }
    if ((fds[0].revents & POLLIN) == 0) continue;
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    int conn = accept4(fd_, reinterpret_cast<sockaddr*>(&addr), &len, SOCK_CLOEXEC);
    if (conn < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK || errno == ECONNABORTED) {
        continue;
      }
      return absl::UnavailableError(fmt::format("{}: accept: {}", what, ErrnoText()));
    }
    TuneConnection(conn);
    pending->Add(conn, PeerName(addr));
  }
}

absl::StatusOr<std::unique_ptr<ActivationSender>> TcpConnect(const std::string& endpoint,
                                                             int sender_index,
                                                             absl::Duration timeout,
                                                             const RingSecret* secret) {
  RS_ASSIGN_OR_RETURN(std::unique_ptr<TcpLink> link,
                      TcpConnectLink(endpoint, sender_index, timeout, secret));
  return std::unique_ptr<ActivationSender>(new TcpSender(std::move(link)));
}

absl::StatusOr<std::unique_ptr<TcpLink>> TcpConnectLink(const std::string& endpoint,
                                                        int sender_index, absl::Duration timeout,
                                                        const RingSecret* secret) {
  std::string host;
  int port = 0;
  RS_RETURN_IF_ERROR(SplitHostPort(endpoint, "next stage data endpoint", &host, &port));
  absl::Time deadline = absl::Now() + timeout;
  absl::Duration backoff = absl::Milliseconds(10);
  std::string last_error;
  while (true) {
    RS_ASSIGN_OR_RETURN(addrinfo * info, Resolve(host, port, /*passive=*/false));
    int fd = -1;
    for (addrinfo* ai = info; ai != nullptr && fd < 0; ai = ai->ai_next) {
      fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
      if (fd < 0) continue;
      int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
      if (rc != 0 && errno == EINPROGRESS) {
        absl::Status waited = WaitFd(fd, POLLOUT, deadline, "connect");
        int err = 0;
        socklen_t len = sizeof(err);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (waited.ok() && err == 0) rc = 0;
        errno = err != 0 ? err : ETIMEDOUT;
      }
      if (rc != 0) {
        last_error = ErrnoText();
        close(fd);
        fd = -1;
      }
    }
    freeaddrinfo(info);
    if (fd >= 0) {
      TuneConnection(fd);
      std::byte hello[kHelloBytes];
      PutU32(hello, kHelloMagic);
      PutU32(hello + 4, static_cast<uint32_t>(sender_index));
      std::string what = fmt::format("hello to {}", endpoint);
      absl::Status status = WriteFull(fd, hello, kHelloBytes, deadline, what);
      if (status.ok() && secret != nullptr) {
        status = ProveConnector(fd, *secret, sender_index,
                                std::min(deadline, absl::Now() + kHandshakeTimeout), what);
      }
      if (!status.ok()) {
        close(fd);
        return status;
      }
      return std::make_unique<TcpLink>(fd,
                                       fmt::format("stage {} ({})", sender_index + 1, endpoint));
    }
    if (absl::Now() + backoff > deadline) {
      return absl::UnavailableError(
          fmt::format("cannot connect to the next stage's data endpoint {} within {}: {}", endpoint,
                      absl::FormatDuration(timeout), last_error));
    }
    std::this_thread::sleep_for(absl::ToChronoMilliseconds(backoff));
    backoff = std::min(backoff * 2, absl::Milliseconds(200));
  }
}

}  // namespace ringserve
