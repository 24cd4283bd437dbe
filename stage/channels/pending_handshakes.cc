#include "stage/channels/pending_handshakes.h"

#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <system_error>
#include <thread>
#include <utility>

#include "common/logging.h"
#include "fmt/format.h"

namespace ringserve {

struct PendingHandshakes::Entry {
  int fd = -1;  // -1 once closed or taken
  std::string peer;
  State state = State::kPending;
  bool dropped = false;  // shut down to make room or at the end; never admitted
  std::thread thread;
};

absl::StatusOr<std::unique_ptr<PendingHandshakes>> PendingHandshakes::Create(size_t max_pending,
                                                                             Handshake handshake) {
  int ready_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (ready_fd < 0) {
    return absl::UnavailableError(
        fmt::format("cannot wait for activation handshakes: eventfd: {}", std::strerror(errno)));
  }
  return std::unique_ptr<PendingHandshakes>(
      new PendingHandshakes(std::max<size_t>(1, max_pending), std::move(handshake), ready_fd));
}

PendingHandshakes::PendingHandshakes(size_t max_pending, Handshake handshake, int ready_fd)
    : max_pending_(max_pending), handshake_(std::move(handshake)), ready_fd_(ready_fd) {}

PendingHandshakes::~PendingHandshakes() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const std::unique_ptr<Entry>& e : entries_) {
      if (e->state == State::kPending) {
        e->dropped = true;
        shutdown(e->fd, SHUT_RDWR);  // its thread closes it
      } else if (e->state == State::kSucceeded) {
        close(e->fd);
        e->fd = -1;
        e->state = State::kTaken;
      }
    }
  }
  for (const std::unique_ptr<Entry>& e : entries_) e->thread.join();
  close(ready_fd_);
}

void PendingHandshakes::Add(int fd, std::string peer) {
  std::list<std::unique_ptr<Entry>> finished;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ReapLocked(&finished);
    size_t pending = 0;
    Entry* oldest = nullptr;
    for (const std::unique_ptr<Entry>& e : entries_) {
      if (e->state != State::kPending || e->dropped) continue;
      if (oldest == nullptr) oldest = e.get();
      ++pending;
    }
    if (pending >= max_pending_) {
      RS_LOG_WARN("dropping the connection from {}: {} connections are introducing themselves",
                  oldest->peer, pending);
      oldest->dropped = true;
      shutdown(oldest->fd, SHUT_RDWR);
    }
    auto entry = std::make_unique<Entry>();
    entry->fd = fd;
    entry->peer = std::move(peer);
    Entry* e = entry.get();
    try {
      e->thread = std::thread([this, e, fd] { Run(e, fd); });
    } catch (const std::system_error& error) {
      RS_LOG_WARN("refused the connection from {}: no thread for its handshake: {}", e->peer,
                  error.what());
      close(fd);
      return;
    }
    entries_.push_back(std::move(entry));
  }
  for (const std::unique_ptr<Entry>& e : finished) e->thread.join();
}

void PendingHandshakes::Run(Entry* entry, int fd) {
  absl::Status status = handshake_(fd);
  std::lock_guard<std::mutex> lock(mu_);
  if (status.ok() && !entry->dropped) {
    entry->state = State::kSucceeded;
    const uint64_t one = 1;
    (void)!write(ready_fd_, &one, sizeof(one));
    return;
  }
  // A dropped connection failed because it was shut down here: nothing to report.
  if (!entry->dropped) {
    RS_LOG_WARN("refused the connection from {}: {}", entry->peer, std::string(status.message()));
  }
  entry->state = State::kFailed;
  close(fd);
  entry->fd = -1;
}

std::optional<PendingHandshakes::Admitted> PendingHandshakes::TakeReady() {
  std::optional<Admitted> admitted;
  std::list<std::unique_ptr<Entry>> finished;
  {
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t count = 0;
    (void)!read(ready_fd_, &count, sizeof(count));  // clears it (EAGAIN when already clear)
    bool more = false;
    for (const std::unique_ptr<Entry>& e : entries_) {
      if (e->state != State::kSucceeded) continue;
      if (admitted.has_value()) {
        more = true;
        break;
      }
      admitted = Admitted{.fd = e->fd, .peer = e->peer};
      e->fd = -1;
      e->state = State::kTaken;
    }
    if (more) {
      const uint64_t one = 1;
      (void)!write(ready_fd_, &one, sizeof(one));
    }
    ReapLocked(&finished);
  }
  for (const std::unique_ptr<Entry>& e : finished) e->thread.join();
  return admitted;
}

void PendingHandshakes::ReapLocked(std::list<std::unique_ptr<Entry>>* finished) {
  for (auto it = entries_.begin(); it != entries_.end();) {
    if ((*it)->state == State::kFailed || (*it)->state == State::kTaken) {
      finished->push_back(std::move(*it));
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace ringserve
