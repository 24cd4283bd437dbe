#include "coordinator/http/connection_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/logging.h"
#include "fmt/format.h"

namespace ringserve::http {
namespace {

using Clock = std::chrono::steady_clock;

thread_local int current_fd = -1;

int PollOne(int fd, short events, std::chrono::milliseconds timeout, short* revents) {
  pollfd p{.fd = fd, .events = events, .revents = 0};
  int ms = static_cast<int>(std::max<int64_t>(0, timeout.count()));
  int n;
  do {
    n = ::poll(&p, 1, ms);
  } while (n < 0 && errno == EINTR);
  if (revents != nullptr) *revents = p.revents;
  return n;
}

bool PeerGone(int fd) {
  short revents = 0;
  if (PollOne(fd, POLLRDHUP, std::chrono::milliseconds(0), &revents) < 0) return true;
  return (revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

void AddressOf(int fd, bool peer, std::string& ip, int& port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  int rc = peer ? getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len)
                : getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  if (rc != 0) return;
  char host[NI_MAXHOST];
  char serv[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof(host), serv, sizeof(serv),
                  NI_NUMERICHOST | NI_NUMERICSERV) == 0) {
    ip = host;
    port = std::atoi(serv);
  }
}

// One connection as cpp-httplib's Stream. Reads honour the request deadline; writes the write
// timeout.
class DeadlineSocketStream final : public httplib::Stream {
 public:
  DeadlineSocketStream(int fd, std::chrono::milliseconds write_timeout)
      : fd_(fd), write_timeout_(write_timeout) {}

  void set_read_deadline(Clock::time_point deadline) { read_deadline_ = deadline; }

  bool is_readable() const override {
    auto left = std::chrono::ceil<std::chrono::milliseconds>(read_deadline_ - Clock::now());
    if (left.count() <= 0) return false;
    return PollOne(fd_, POLLIN, left, nullptr) > 0;
  }
  bool is_writable() const override {
    if (PeerGone(fd_)) return false;
    return PollOne(fd_, POLLOUT, write_timeout_, nullptr) > 0;
  }
  ssize_t read(char* ptr, size_t size) override {
    if (!is_readable()) return -1;
    ssize_t n;
    do {
      n = ::recv(fd_, ptr, size, 0);
    } while (n < 0 && errno == EINTR);
    return n;
  }
  ssize_t write(const char* ptr, size_t size) override {
    if (PollOne(fd_, POLLOUT, write_timeout_, nullptr) <= 0) return -1;
    ssize_t n;
    do {
      n = ::send(fd_, ptr, size, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    return n;
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    AddressOf(fd_, /*peer=*/true, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    AddressOf(fd_, /*peer=*/false, ip, port);
  }
  socket_t socket() const override { return fd_; }

 private:
  const int fd_;
  const std::chrono::milliseconds write_timeout_;
  Clock::time_point read_deadline_ = Clock::now();
};

const std::string& BusyResponse() {
  static const std::string* response = [] {
    constexpr std::string_view kBody =
        R"({"error":{"message":"Too many open connections; retry later.",)"
        R"("type":"server_error","param":null,"code":null}})";
    return new std::string(
        fmt::format("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                    "Retry-After: 1\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{}",
                    kBody.size(), kBody));
  }();
  return *response;
}

}  // namespace

ConnectionServer::ConnectionServer(Limits limits) : limits_(limits) {}

ConnectionServer::~ConnectionServer() { Stop(); }

bool ConnectionServer::PeerConnected() { return current_fd < 0 || !PeerGone(current_fd); }

absl::StatusOr<int> ConnectionServer::Bind(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  std::string service = std::to_string(port);
  if (int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found);
      rc != 0) {
    return absl::InvalidArgumentError(
        fmt::format("HTTP: cannot resolve host '{}': {}", host, gai_strerror(rc)));
  }
  std::string last_error = "no address";
  for (addrinfo* ai = found; ai != nullptr && listen_fd_ < 0; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd, 1024) != 0) {
      last_error = std::strerror(errno);
      ::close(fd);
      continue;
    }
    listen_fd_ = fd;
  }
  freeaddrinfo(found);
  if (listen_fd_ < 0) {
    return absl::UnavailableError(
        fmt::format("HTTP: cannot listen on {}:{}: {}", host, port, last_error));
  }
  // httplib's response writers stop while svr_sock_ is invalid ("shutting down").
  svr_sock_ = listen_fd_;
  std::string ip;
  int bound = port;
  AddressOf(listen_fd_, /*peer=*/false, ip, bound);
  if (::pipe2(wake_pipe_, O_CLOEXEC) != 0) {
    return absl::InternalError(fmt::format("HTTP: pipe: {}", std::strerror(errno)));
  }
  return bound;
}

void ConnectionServer::Start() {
  accept_thread_ = std::thread([this] { AcceptLoop(); });
}

void ConnectionServer::Stop() {
  if (stopping_.exchange(true)) return;
  svr_sock_ = INVALID_SOCKET;  // ends chunked responses in progress
  if (wake_pipe_[1] >= 0) {
    char byte = 0;
    [[maybe_unused]] ssize_t n = ::write(wake_pipe_[1], &byte, 1);
  }
  if (accept_thread_.joinable()) accept_thread_.join();
  std::vector<std::thread> workers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
    for (int fd : pending_) {
      ::close(fd);
      open_.fetch_sub(1);
    }
    pending_.clear();
    workers.swap(workers_);
  }
  cv_.notify_all();
  for (std::thread& worker : workers) worker.join();
  for (int& fd : {std::ref(listen_fd_), std::ref(wake_pipe_[0]), std::ref(wake_pipe_[1])}) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
}

void ConnectionServer::AcceptLoop() {
  while (!stopping_) {
    pollfd fds[2] = {{.fd = listen_fd_, .events = POLLIN, .revents = 0},
                     {.fd = wake_pipe_[0], .events = POLLIN, .revents = 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      RS_LOG_ERROR("HTTP: poll: {}", std::strerror(errno));
      return;
    }
    if (stopping_ || (fds[1].revents & POLLIN) != 0) return;
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));  // wait for fds to free up
      }
      continue;
    }
    if (open_.load() >= limits_.max_connections) {
      refused_.fetch_add(1);
      // Best effort, never blocking the accept loop.
      const std::string& busy = BusyResponse();
      [[maybe_unused]] ssize_t n =
          ::send(fd, busy.data(), busy.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      ::shutdown(fd, SHUT_WR);
      ::close(fd);
      continue;
    }
    int yes = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof(yes));
    open_.fetch_add(1);
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back(fd);
    if (idle_workers_ > 0) {
      cv_.notify_one();
    } else {
      workers_.emplace_back([this] { WorkerLoop(); });
    }
  }
}

void ConnectionServer::WorkerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    ++idle_workers_;
    cv_.wait(lock, [this] { return stopping_ || !pending_.empty(); });
    --idle_workers_;
    if (stopping_) return;
    int fd = pending_.front();
    pending_.pop_front();
    fds_.insert(fd);
    lock.unlock();
    Serve(fd);
    lock.lock();
    fds_.erase(fd);
    ::close(fd);
    open_.fetch_sub(1);
  }
}

void ConnectionServer::Serve(int fd) {
  current_fd = fd;
  DeadlineSocketStream stream(fd, limits_.write_timeout);
  while (!stopping_) {
    // Wait for the first byte of the next request (an idle keep-alive connection ends here).
    short revents = 0;
    if (PollOne(fd, POLLIN, limits_.idle_timeout, &revents) <= 0 ||
        (revents & (POLLHUP | POLLERR | POLLNVAL)) != 0) {
      break;
    }
    stream.set_read_deadline(Clock::now() + limits_.request_read_timeout);
    bool connection_closed = false;
    bool ok =
        process_request(stream, /*close_connection=*/stopping_.load(), connection_closed, nullptr);
    if (!ok || connection_closed) break;
  }
  ::shutdown(fd, SHUT_RDWR);
  current_fd = -1;
}

}  // namespace ringserve::http
