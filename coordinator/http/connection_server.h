// cpp-httplib's request handling behind our own accept loop and connection threads, so that
// clients cannot starve the server:
//   - a cap on open connections: one over it is answered at once with 503 + Retry-After by the
//     accept thread and closed (it never holds a worker);
//   - one thread per open connection, started on demand (no fixed pool that streams or slow
//     clients can fill while /health and /metrics wait behind them);
//   - a deadline for reading a whole request (request line, headers and body), so a client
//     trickling bytes is cut off; an idle keep-alive timeout; a write timeout;
//   - PeerConnected(): whether the client of the request this thread serves is still there,
//     without writing to it (non-streaming requests use it to cancel abandoned generations
//     and still answer with the right status).
//
// Usage: register routes on the object as on httplib::Server, then Bind() and Start(); Stop()
// ends everything. Thread-safety: Bind/Start/Stop from one thread; routes run on connection
// threads.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace ringserve::http {

class ConnectionServer : public httplib::Server {
 public:
  struct Limits {
    int max_connections = 512;
    // Request line + headers + body must arrive within this time of the first byte.
    std::chrono::milliseconds request_read_timeout{10000};
    // An idle keep-alive connection is closed after this.
    std::chrono::milliseconds idle_timeout{5000};
    // A write that cannot make progress for this long fails (the client stopped reading).
    std::chrono::milliseconds write_timeout{30000};
  };

  explicit ConnectionServer(Limits limits);
  ~ConnectionServer() override;

  // Binds and listens. Returns the bound port (an ephemeral one when `port` is 0).
  // InvalidArgument for a host that does not resolve, Unavailable when it cannot bind.
  absl::StatusOr<int> Bind(const std::string& host, int port);
  // Starts the accept thread (after Bind).
  void Start();
  // Stops accepting, shuts every open connection down and joins the threads. Idempotent.
  void Stop();

  int open_connections() const { return open_.load(); }
  // Connections refused because max_connections were open (cumulative).
  int64_t refused_connections() const { return refused_.load(); }

  // On a connection thread: false once the client of the current request closed its side or
  // the connection failed. True on other threads.
  static bool PeerConnected();

 private:
  void AcceptLoop();
  void WorkerLoop();
  void Serve(int fd);

  const Limits limits_;
  int listen_fd_ = -1;
  int wake_pipe_[2] = {-1, -1};
  std::thread accept_thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> open_{0};
  std::atomic<int64_t> refused_{0};

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<int> pending_;  // accepted, waiting for a thread
  int idle_workers_ = 0;
  std::vector<std::thread> workers_;
  std::set<int> fds_;  // open connections, shut down by Stop()
};

}  // namespace ringserve::http
