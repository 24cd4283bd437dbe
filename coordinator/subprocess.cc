#include "coordinator/subprocess.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "fmt/format.h"

namespace ringserve {
namespace {

int ExitCode(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

}  // namespace

absl::StatusOr<Subprocess> Subprocess::Spawn(const SubprocessOptions& options) {
  if (options.argv.empty()) return absl::InvalidArgumentError("Subprocess: empty argv");
  const std::string& path = options.argv[0];
  if (access(path.c_str(), X_OK) != 0) {
    return absl::NotFoundError(fmt::format("{}: not an executable file", path));
  }
  // Everything the child needs is prepared before fork: after it only async-signal-safe calls.
  std::vector<char*> argv;
  for (const std::string& arg : options.argv) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  int pipe_fds[2] = {-1, -1};
  if (options.ready_fd && pipe2(pipe_fds, O_CLOEXEC) != 0) {
    return absl::InternalError(fmt::format("pipe: {}", std::strerror(errno)));
  }
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    if (options.ready_fd) {
      close(pipe_fds[0]);
      close(pipe_fds[1]);
    }
    return absl::InternalError(fmt::format("fork: {}", std::strerror(errno)));
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    if (options.ready_fd) {
      if (pipe_fds[1] == 3) {
        fcntl(3, F_SETFD, 0);
      } else {
        dup2(pipe_fds[1], 3);  // dup2 clears FD_CLOEXEC on the new descriptor
      }
    }
    if (!options.stdout_path.empty()) {
      int fd = open(options.stdout_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) dup2(fd, 1);
    }
    if (!options.stderr_path.empty()) {
      int fd = open(options.stderr_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) dup2(fd, 2);
    }
    execv(argv[0], argv.data());
    _exit(127);
  }
  if (options.ready_fd) close(pipe_fds[1]);
  std::string name = path.substr(path.find_last_of('/') + 1);
  return Subprocess(pid, options.ready_fd ? pipe_fds[0] : -1,
                    fmt::format("{} (pid {})", name, pid));
}

Subprocess::Subprocess(Subprocess&& other) noexcept { *this = std::move(other); }

Subprocess& Subprocess::operator=(Subprocess&& other) noexcept {
  if (this != &other) {
    Terminate();
    pid_ = other.pid_;
    ready_read_fd_ = other.ready_read_fd_;
    name_ = std::move(other.name_);
    exit_code_ = other.exit_code_;
    ready_buffer_ = std::move(other.ready_buffer_);
    other.pid_ = -1;
    other.ready_read_fd_ = -1;
  }
  return *this;
}

Subprocess::~Subprocess() { Terminate(); }

bool Subprocess::Reap(bool block) {
  if (pid_ < 0 || exit_code_.has_value()) return true;
  int status = 0;
  pid_t rc;
  do {
    rc = waitpid(pid_, &status, block ? 0 : WNOHANG);
  } while (rc < 0 && errno == EINTR);
  if (rc == pid_) {
    exit_code_ = ExitCode(status);
    return true;
  }
  if (rc < 0) {  // not our child any more (already reaped elsewhere)
    exit_code_ = -1;
    return true;
  }
  return false;
}

absl::StatusOr<std::string> Subprocess::ReadReadyLine(absl::Duration timeout) {
  if (ready_read_fd_ < 0) return absl::FailedPreconditionError(name_ + ": no ready pipe");
  absl::Time deadline = absl::Now() + timeout;
  while (true) {
    size_t newline = ready_buffer_.find('\n');
    if (newline != std::string::npos) {
      std::string line = ready_buffer_.substr(0, newline);
      ready_buffer_.erase(0, newline + 1);
      return line;
    }
    absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          fmt::format("{} did not report ready within {}", name_, absl::FormatDuration(timeout)));
    }
    pollfd p{ready_read_fd_, POLLIN, 0};
    int rc = poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
    if (rc < 0 && errno != EINTR) {
      return absl::InternalError(fmt::format("poll: {}", std::strerror(errno)));
    }
    if (rc <= 0) continue;
    char buffer[256];
    ssize_t n = read(ready_read_fd_, buffer, sizeof(buffer));
    if (n > 0) {
      ready_buffer_.append(buffer, static_cast<size_t>(n));
    } else if (n == 0) {
      auto code = Wait(absl::Seconds(2));
      return absl::UnavailableError(
          code.ok() ? fmt::format("{} exited with code {} before reporting ready", name_, *code)
                    : fmt::format("{} closed its ready pipe without reporting ready", name_));
    } else if (errno != EINTR && errno != EAGAIN) {
      return absl::InternalError(fmt::format("read: {}", std::strerror(errno)));
    }
  }
}

absl::StatusOr<int> Subprocess::Wait(absl::Duration timeout) {
  if (pid_ < 0) return absl::FailedPreconditionError("no process");
  // No portable way to wait for a child with a timeout without signals: poll waitpid with
  // growing pauses (at most 20 ms late).
  absl::Time deadline = absl::Now() + timeout;
  absl::Duration pause = absl::Milliseconds(1);
  while (!Reap(false)) {
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          fmt::format("{} still running after {}", name_, absl::FormatDuration(timeout)));
    }
    std::this_thread::sleep_for(absl::ToChronoMicroseconds(pause));
    pause = std::min(pause * 2, absl::Milliseconds(20));
  }
  return *exit_code_;
}

int Subprocess::Terminate(absl::Duration grace) {
  if (ready_read_fd_ >= 0) {
    close(ready_read_fd_);
    ready_read_fd_ = -1;
  }
  if (pid_ < 0) return -1;
  if (!Reap(false)) {
    kill(pid_, SIGTERM);
    if (!Wait(grace).ok()) {
      kill(pid_, SIGKILL);
      Reap(true);
    }
  }
  return exit_code_.value_or(-1);
}

}  // namespace ringserve
