#include "common/testing/fifo_watchdog.h"

#include <fcntl.h>
#include <unistd.h>

#include <condition_variable>
#include <mutex>
#include <thread>

namespace ringserve::testing {

bool ReturnsWithoutAWriter(const std::string& fifo_path, const std::function<void()>& fn,
                           std::chrono::milliseconds timeout) {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::thread runner([&] {
    fn();
    std::lock_guard<std::mutex> lock(mu);
    done = true;
    cv.notify_all();
  });
  bool on_its_own;
  {
    std::unique_lock<std::mutex> lock(mu);
    on_its_own = cv.wait_for(lock, timeout, [&] { return done; });
    // Blocked in open() for a writer: become one, so that the open returns and the read sees
    // end of file. Until the runner reaches its open, a non-blocking writer open fails (ENXIO),
    // so this repeats until the runner is done.
    while (!done) {
      lock.unlock();
      const int fd = ::open(fifo_path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
      if (fd >= 0) ::close(fd);
      lock.lock();
      cv.wait_for(lock, std::chrono::milliseconds(100), [&] { return done; });
    }
  }
  runner.join();
  return on_its_own;
}

}  // namespace ringserve::testing
