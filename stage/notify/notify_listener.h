// The service manager's side of sd_notify, for tests: owns a unix datagram socket that a child
// process (or this one) is pointed at with NOTIFY_SOCKET, and reads the notifications sent to
// it. Test-only helper; not used by the stage itself.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ringserve {

class NotifyListener {
 public:
  // Binds a fresh datagram socket at `<dir>/notify.sock`; `dir` must exist.
  static absl::StatusOr<NotifyListener> Create(const std::string& dir);
  NotifyListener(NotifyListener&& other) noexcept;
  NotifyListener& operator=(NotifyListener&& other) = delete;
  NotifyListener(const NotifyListener&) = delete;
  ~NotifyListener();

  // The value to put into NOTIFY_SOCKET.
  const std::string& path() const { return path_; }

  // Waits up to `timeout` for the next datagram; nullopt on timeout. Each datagram is one
  // notification, e.g. "READY=1\nSTATUS=ready".
  std::optional<std::string> Receive(std::chrono::milliseconds timeout);
  // Every datagram already queued, without waiting.
  std::vector<std::string> Drain();

 private:
  NotifyListener(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  int fd_ = -1;
  std::string path_;
};

// True when `message` (newline-separated assignments) contains the line `assignment`.
bool HasAssignment(const std::string& message, const std::string& assignment);

}  // namespace ringserve
