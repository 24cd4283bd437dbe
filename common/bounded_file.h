// Reading files that come from outside the process (model directories, hosts.yaml, key files)
// without trusting what sits at the path. Every such read goes through here:
//   - the open never blocks: O_NONBLOCK, so a FIFO put where config.json should be does not
//     wait for a writer (it is then refused as not a regular file);
//   - the opened descriptor is checked with fstat, so only regular files are read (a symlink to
//     a regular file is fine: hub caches are made of them; one to /dev/zero is refused);
//   - the caller gives a byte limit, checked against the size before reading and again while
//     reading (a file that grows, or a /proc file that reports size 0).
//
// Errors name the path: NotFound when nothing is at the path (or a directory on the way is
// missing), PermissionDenied when it cannot be opened for that reason, InvalidArgument when it
// is not a regular file or exceeds the limit, DataLoss when a read fails.
//
// Thread-safe (no shared state); a RegularFile is used by one thread at a time.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace ringserve {

// Byte limits of the files ringserve reads, in one place.
// config.json, tokenizer_config.json and the like: a few KB, some tokenizer_config.json files
// a few MB (chat templates, added_tokens_decoder).
inline constexpr uint64_t kMaxConfigJsonBytes = uint64_t{16} << 20;
// model.safetensors.index.json: about 9 MB for DeepSeek-V3's 91k tensors.
inline constexpr uint64_t kMaxWeightIndexBytes = uint64_t{64} << 20;
// tokenizer.json: real ones reach about 30 MB (large vocabularies with merges).
inline constexpr uint64_t kMaxTokenizerJsonBytes = uint64_t{256} << 20;
// hosts.yaml: a few KB for any real ring.
inline constexpr uint64_t kMaxHostsFileBytes = uint64_t{1} << 20;
// API keys and the ring secret: one line.
inline constexpr uint64_t kMaxKeyFileBytes = uint64_t{64} << 10;

// An open regular file: the descriptor and its fstat, closed on destruction. Move-only.
class RegularFile {
 public:
  struct Options {
    // When false the last component must not be a symlink (O_NOFOLLOW): InvalidArgument.
    bool follow_symlinks = true;
  };

  // Opens `path` read-only (O_RDONLY | O_NONBLOCK | O_CLOEXEC) and checks that it is a regular
  // file. Never blocks on a FIFO or a device.
  static absl::StatusOr<RegularFile> Open(const std::string& path);
  static absl::StatusOr<RegularFile> Open(const std::string& path, const Options& options);

  RegularFile(RegularFile&& other) noexcept;
  RegularFile& operator=(RegularFile&& other) noexcept;
  RegularFile(const RegularFile&) = delete;
  RegularFile& operator=(const RegularFile&) = delete;
  ~RegularFile();

  // Reads from the current offset to the end of the file. InvalidArgument naming the path and
  // the limit when the file holds (or grows to) more than `max_bytes`; retries EINTR and short
  // reads.
  absl::StatusOr<std::string> ReadAll(uint64_t max_bytes);

  int fd() const { return fd_; }
  const struct stat& stat() const { return stat_; }
  // st_size at open time.
  uint64_t size_bytes() const { return static_cast<uint64_t>(stat_.st_size); }
  const std::string& path() const { return path_; }

 private:
  RegularFile(int fd, const struct stat& st, std::string path)
      : fd_(fd), stat_(st), path_(std::move(path)) {}
  void Close();

  int fd_ = -1;
  struct stat stat_ {};
  std::string path_;
};

// Open, check and ReadAll in one call: the whole of the regular file at `path`, at most
// `max_bytes` of it (else InvalidArgument naming the path and the limit).
absl::StatusOr<std::string> ReadBoundedFile(const std::string& path, uint64_t max_bytes);

}  // namespace ringserve
