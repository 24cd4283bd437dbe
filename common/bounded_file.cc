#include "common/bounded_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "fmt/format.h"

namespace ringserve {
namespace {

const char* KindOf(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a plain file";
}

std::string Limit(uint64_t bytes) {
  if (bytes >= (uint64_t{1} << 20) && bytes % (uint64_t{1} << 20) == 0) {
    return fmt::format("{} bytes ({} MiB)", bytes, bytes >> 20);
  }
  if (bytes >= 1024 && bytes % 1024 == 0) {
    return fmt::format("{} bytes ({} KiB)", bytes, bytes >> 10);
  }
  return fmt::format("{} bytes", bytes);
}

absl::Status TooLarge(const std::string& path, const std::string& size, uint64_t max_bytes) {
  return absl::InvalidArgumentError(
      fmt::format("{}: {}, above the limit of {} for this file", path, size, Limit(max_bytes)));
}

}  // namespace

absl::StatusOr<RegularFile> RegularFile::Open(const std::string& path) {
  return Open(path, Options());
}

absl::StatusOr<RegularFile> RegularFile::Open(const std::string& path, const Options& options) {
  int flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK;
  if (!options.follow_symlinks) flags |= O_NOFOLLOW;
  int fd;
  do {
    fd = ::open(path.c_str(), flags);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    const int err = errno;
    const std::string what = fmt::format("{}: cannot open: {}", path, std::strerror(err));
    if (err == ENOENT || err == ENOTDIR) return absl::NotFoundError(what);
    if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(what);
    if (err == ELOOP && !options.follow_symlinks) {
      return absl::InvalidArgumentError(
          fmt::format("{}: is a symbolic link; name the file itself", path));
    }
    return absl::InvalidArgumentError(what);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::DataLossError(fmt::format("{}: cannot stat: {}", path, std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(
        fmt::format("{}: not a regular file ({})", path, KindOf(st.st_mode)));
  }
  return RegularFile(fd, st, path);
}

RegularFile::RegularFile(RegularFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), stat_(other.stat_), path_(std::move(other.path_)) {}

RegularFile& RegularFile::operator=(RegularFile&& other) noexcept {
  if (this != &other) {
    Close();
    fd_ = std::exchange(other.fd_, -1);
    stat_ = other.stat_;
    path_ = std::move(other.path_);
  }
  return *this;
}

RegularFile::~RegularFile() { Close(); }

void RegularFile::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

absl::StatusOr<std::string> RegularFile::ReadAll(uint64_t max_bytes) {
  if (size_bytes() > max_bytes) {
    return TooLarge(path_, fmt::format("{} bytes", size_bytes()), max_bytes);
  }
  std::string data;
  // One byte past the expected size, so that the read reaching the end needs no reallocation.
  data.resize(static_cast<size_t>(size_bytes()) + 1);
  size_t used = 0;
  while (true) {
    if (used == data.size()) {
      if (used > max_bytes) {
        return TooLarge(path_, fmt::format("grew past {} bytes while read", max_bytes), max_bytes);
      }
      // The file is longer than fstat said (it grew, or it is a /proc file).
      data.resize(static_cast<size_t>(std::min<uint64_t>(max_bytes + 1, used * 2 + 4096)));
    }
    const ssize_t n = ::read(fd_, data.data() + used, data.size() - used);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::DataLossError(fmt::format("{}: read failed: {}", path_, std::strerror(errno)));
    }
    if (n == 0) break;
    used += static_cast<size_t>(n);
  }
  if (used > max_bytes) {
    return TooLarge(path_, fmt::format("grew past {} bytes while read", max_bytes), max_bytes);
  }
  data.resize(used);
  return data;
}

absl::StatusOr<std::string> ReadBoundedFile(const std::string& path, uint64_t max_bytes) {
  absl::StatusOr<RegularFile> file = RegularFile::Open(path);
  if (!file.ok()) return file.status();
  return file->ReadAll(max_bytes);
}

}  // namespace ringserve
