// Test support for "a FIFO where a file should be": runs code that opens the FIFO and reports
// whether it returned on its own. Code that blocks in open() waiting for a writer is released
// after a bounded wait (the watchdog opens the FIFO's write end), so such a defect fails the
// test instead of hanging it.
#pragma once

#include <chrono>
#include <functional>
#include <string>

namespace ringserve::testing {

// Runs `fn` on a thread. Returns true when it returned within `timeout` without anyone opening
// `fifo_path` for writing; false when the watchdog had to open the write end (once or more)
// to release it. Always waits for `fn` to finish before returning.
bool ReturnsWithoutAWriter(const std::string& fifo_path, const std::function<void()>& fn,
                           std::chrono::milliseconds timeout = std::chrono::seconds(10));

}  // namespace ringserve::testing
