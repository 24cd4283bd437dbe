// systemd service notification (sd_notify) for stage processes run as `Type=notify` units.
//
// A stage unit (deploy/ringserve-stage@.service) is "started" only when the stage says
// READY=1, which it must do once its weights are loaded and it can serve plans, not when the
// process starts. STATUS= text shows up in `systemctl status`. With `WatchdogSec=` set, the
// stage must send WATCHDOG=1 more often than that interval or systemd restarts it.
//
// Every function is a no-op returning OkStatus when NOTIFY_SOCKET is not set (a stage started
// by hand or by a test without a supervisor). Thread-safe: each call is one datagram.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"

namespace ringserve {

// True when NOTIFY_SOCKET is set, i.e. a service manager listens for notifications.
bool NotifyEnabled();

// Sends READY=1 (plus STATUS=`status` when not empty). Call once, after loading.
absl::Status NotifyReady(const std::string& status = "");
// Sends STATUS=`text`, e.g. "loading layers 3/12". Newlines in `text` are replaced by spaces.
absl::Status NotifyStatus(const std::string& text);
// Sends WATCHDOG=1.
absl::Status NotifyWatchdog();
// Sends STOPPING=1 (clean shutdown has begun).
absl::Status NotifyStopping();

// The watchdog interval systemd asked for (WATCHDOG_USEC for this process), or nullopt when
// the watchdog is off.
std::optional<std::chrono::microseconds> WatchdogInterval();

// Pings the watchdog from a background thread at half the interval systemd asked for, but
// only while `healthy()` returns true: a stage whose device has failed or whose control loop is
// stuck stops pinging, and systemd restarts it. Does nothing (no thread) when the watchdog is
// off. `healthy` runs on the pinger thread and must be cheap and thread-safe.
// Move-only handle; the destructor stops the thread.
class WatchdogPinger {
 public:
  explicit WatchdogPinger(std::function<bool()> healthy);
  ~WatchdogPinger();
  WatchdogPinger(const WatchdogPinger&) = delete;
  WatchdogPinger& operator=(const WatchdogPinger&) = delete;

  // True when a pinger thread runs (the watchdog is on).
  bool active() const { return thread_.joinable(); }

 private:
  void Run(std::chrono::microseconds period);

  std::function<bool()> healthy_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace ringserve
