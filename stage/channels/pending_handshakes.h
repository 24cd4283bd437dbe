// The connections a listener has accepted and not yet admitted, each introducing itself on its
// own thread (TcpListener::AcceptLink): a connection that stays silent holds only its own place
// until its handshake's deadline, never the handshake of the real peer behind it.
//
// At most `max_pending` handshakes run at once. A connection beyond that drops the oldest
// pending one (its socket is shut down, which fails its handshake at once), so strangers that
// connect and stay silent, or reconnect in a loop, cannot keep a peer out: they would have to
// open `max_pending` connections within the peer's own handshake, a round trip.
//
// Thread-compatible: one owner calls Add, TakeReady and ready_fd; the handshakes run on threads
// of their own, which the destructor joins.
#pragma once

#include <cstddef>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ringserve {

class PendingHandshakes {
 public:
  // Checks one accepted connection: OK when it proved to be the expected peer. Runs on the
  // connection's own thread, concurrently with other calls; must return by its own deadline,
  // and soon after its socket is shut down. Must not close `fd`. A refusal (unless this class
  // dropped the connection) is logged with the peer's address.
  using Handshake = std::function<absl::Status(int fd)>;

  struct Admitted {
    int fd = -1;  // owned by the caller now
    std::string peer;
  };

  // Unavailable when the process is out of descriptors for the wake-up event.
  static absl::StatusOr<std::unique_ptr<PendingHandshakes>> Create(size_t max_pending,
                                                                   Handshake handshake);
  // Shuts down and closes every connection not taken (pending or admitted), and joins the
  // handshake threads.
  ~PendingHandshakes();
  PendingHandshakes(const PendingHandshakes&) = delete;
  PendingHandshakes& operator=(const PendingHandshakes&) = delete;

  // Starts the handshake of the accepted connection `fd` (owned from now on; `peer`:
  // "host:port") on its own thread, first dropping the oldest pending one when `max_pending` are
  // pending. A connection whose handshake fails is closed.
  void Add(int fd, std::string peer);

  // Readable (poll) once a handshake has succeeded; TakeReady clears it.
  int ready_fd() const { return ready_fd_; }

  // The first connection whose handshake succeeded and that was not taken yet, or nullopt.
  std::optional<Admitted> TakeReady();

 private:
  enum class State { kPending, kSucceeded, kFailed, kTaken };
  struct Entry;

  PendingHandshakes(size_t max_pending, Handshake handshake, int ready_fd);
  // The body of an entry's thread.
  void Run(Entry* entry, int fd);

  // Moves the entries whose threads are done (failed or taken) to `finished`, for joining
  // outside mu_. Requires mu_.
  void ReapLocked(std::list<std::unique_ptr<Entry>>* finished);

  const size_t max_pending_;
  const Handshake handshake_;
  const int ready_fd_;  // an eventfd
  std::mutex mu_;
  std::list<std::unique_ptr<Entry>> entries_;  // guarded by mu_; oldest first
};

}  // namespace ringserve
