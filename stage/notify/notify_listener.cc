#include "stage/notify/notify_listener.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "fmt/format.h"

namespace ringserve {

absl::StatusOr<NotifyListener> NotifyListener::Create(const std::string& dir) {
  std::string path = dir + "/notify.sock";
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(fmt::format("socket path too long: {}", path));
  }
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(fmt::format("socket: {}", std::strerror(errno)));
  unlink(path.c_str());
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    int err = errno;
    close(fd);
    return absl::InternalError(fmt::format("bind {}: {}", path, std::strerror(err)));
  }
  return NotifyListener(fd, std::move(path));
}

NotifyListener::NotifyListener(NotifyListener&& other) noexcept
    : fd_(other.fd_), path_(std::move(other.path_)) {
  other.fd_ = -1;
}

NotifyListener::~NotifyListener() {
  if (fd_ >= 0) {
    close(fd_);
    unlink(path_.c_str());
  }
}

std::optional<std::string> NotifyListener::Receive(std::chrono::milliseconds timeout) {
  pollfd pfd{.fd = fd_, .events = POLLIN, .revents = 0};
  int ready = poll(&pfd, 1, static_cast<int>(timeout.count()));
  if (ready <= 0) return std::nullopt;
  char buffer[4096];
  ssize_t n = recv(fd_, buffer, sizeof(buffer), 0);
  if (n < 0) return std::nullopt;
  return std::string(buffer, static_cast<size_t>(n));
}

std::vector<std::string> NotifyListener::Drain() {
  std::vector<std::string> messages;
  while (std::optional<std::string> message = Receive(std::chrono::milliseconds(0))) {
    messages.push_back(std::move(*message));
  }
  return messages;
}

bool HasAssignment(const std::string& message, const std::string& assignment) {
  size_t pos = 0;
  while (pos <= message.size()) {
    size_t end = message.find('\n', pos);
    if (end == std::string::npos) end = message.size();
    if (message.compare(pos, end - pos, assignment) == 0) return true;
    pos = end + 1;
  }
  return false;
}

}  // namespace ringserve
