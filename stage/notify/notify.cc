#include "stage/notify/notify.h"

#include <systemd/sd-daemon.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "fmt/format.h"

namespace ringserve {
namespace {

absl::Status Send(const std::string& state) {
  if (!NotifyEnabled()) return absl::OkStatus();
  int rc = sd_notify(/*unset_environment=*/0, state.c_str());
  if (rc < 0) {
    return absl::UnavailableError(fmt::format(
        "sd_notify(\"{}\") failed: {}", state.substr(0, state.find('\n')), std::strerror(-rc)));
  }
  return absl::OkStatus();
}

std::string OneLine(std::string text) {
  std::replace(text.begin(), text.end(), '\n', ' ');
  return text;
}

}  // namespace

bool NotifyEnabled() {
  const char* socket = std::getenv("NOTIFY_SOCKET");
  return socket != nullptr && socket[0] != '\0';
}

absl::Status NotifyReady(const std::string& status) {
  if (status.empty()) return Send("READY=1");
  return Send("READY=1\nSTATUS=" + OneLine(status));
}

absl::Status NotifyStatus(const std::string& text) { return Send("STATUS=" + OneLine(text)); }

absl::Status NotifyWatchdog() { return Send("WATCHDOG=1"); }

absl::Status NotifyStopping() { return Send("STOPPING=1"); }

std::optional<std::chrono::microseconds> WatchdogInterval() {
  uint64_t usec = 0;
  if (sd_watchdog_enabled(/*unset_environment=*/0, &usec) <= 0 || usec == 0) return std::nullopt;
  return std::chrono::microseconds(usec);
}

WatchdogPinger::WatchdogPinger(std::function<bool()> healthy) : healthy_(std::move(healthy)) {
  std::optional<std::chrono::microseconds> interval = WatchdogInterval();
  if (!interval.has_value()) return;
  thread_ = std::thread([this, period = *interval / 2] { Run(period); });
}

WatchdogPinger::~WatchdogPinger() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void WatchdogPinger::Run(std::chrono::microseconds period) {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    // A failed ping is not fatal: systemd restarts us if pings stop arriving.
    if (healthy_()) (void)NotifyWatchdog();
    cv_.wait_for(lock, period, [this] { return stop_; });
  }
}

}  // namespace ringserve
