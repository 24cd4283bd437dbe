// A child process started with fork/exec: the coordinator's local stages (embedded default) and
// the integration tests' stage and coordinator processes.
//
// The child dies with its parent (PR_SET_PDEATHSIG = SIGTERM), so a crashed parent leaves no
// stray processes. With `ready_fd`, the child gets the write end of a pipe as fd 3 and the
// argument list should name it (e.g. `--ready_fd 3`); ReadReadyLine waits for its first line.
//
// Move-only; the destructor terminates the child (SIGTERM, then SIGKILL after a grace period)
// and reaps it. Not thread-safe.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ringserve {

struct SubprocessOptions {
  std::vector<std::string> argv;  // argv[0] is the executable path
  bool ready_fd = false;          // give the child fd 3 = write end of a pipe
  std::string stdout_path;        // redirect stdout here (append); empty = inherit
  std::string stderr_path;        // redirect stderr here (append); empty = inherit
};

class Subprocess {
 public:
  static absl::StatusOr<Subprocess> Spawn(const SubprocessOptions& options);

  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;
  ~Subprocess();

  pid_t pid() const { return pid_; }
  const std::string& name() const { return name_; }

  // Waits up to `timeout` for the child's first line on the ready pipe (without the newline).
  // DeadlineExceeded when none came; Unavailable (with the exit status) when the child closed
  // the pipe or exited first.
  absl::StatusOr<std::string> ReadReadyLine(absl::Duration timeout);

  // Waits up to `timeout` for the child to exit; its exit code (128 + signal when killed).
  // DeadlineExceeded if it is still running.
  absl::StatusOr<int> Wait(absl::Duration timeout);

  // SIGTERM, wait up to `grace`, then SIGKILL; reaps the child. Returns the exit code.
  // No-op (returns the known code) once the child has been reaped.
  int Terminate(absl::Duration grace = absl::Seconds(5));

 private:
  Subprocess(pid_t pid, int ready_read_fd, std::string name)
      : pid_(pid), ready_read_fd_(ready_read_fd), name_(std::move(name)) {}
  // Non-blocking reap; true once the child is gone.
  bool Reap(bool block);

  pid_t pid_ = -1;
  int ready_read_fd_ = -1;
  std::string name_;
  std::optional<int> exit_code_;
  std::string ready_buffer_;
};

}  // namespace ringserve
