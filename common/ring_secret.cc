#include "common/ring_secret.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/bounded_file.h"
#include "common/secure_compare.h"
#include "fmt/format.h"

namespace ringserve {
namespace {

std::string Hex(const unsigned char* data, size_t size) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(size * 2);
  for (size_t i = 0; i < size; ++i) {
    out.push_back(kDigits[data[i] >> 4]);
    out.push_back(kDigits[data[i] & 15]);
  }
  return out;
}

bool IsSpace(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

}  // namespace

absl::StatusOr<RingSecret> RingSecret::Load(const std::string& path) {
  // The file itself, never a link to one; a FIFO or a device is refused without blocking.
  absl::StatusOr<RegularFile> file =
      RegularFile::Open(path, RegularFile::Options{.follow_symlinks = false});
  if (!file.ok()) {
    return absl::Status(file.status().code(),
                        absl::StrCat("ring secret ", file.status().message()));
  }
  const struct stat& st = file->stat();
  if (st.st_uid != ::geteuid()) {
    return absl::PermissionDeniedError(
        fmt::format("ring secret {}: owned by uid {}, not by this user (uid {})", path, st.st_uid,
                    ::geteuid()));
  }
  if ((st.st_mode & 077) != 0) {
    return absl::PermissionDeniedError(
        fmt::format("ring secret {}: mode {:o} lets group or others read it; chmod 600 it", path,
                    st.st_mode & 0777));
  }
  absl::StatusOr<std::string> text = file->ReadAll(kMaxKeyFileBytes);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat("ring secret ", text.status().message()));
  }
  std::string key = std::move(*text);
  while (!key.empty() && IsSpace(key.back())) key.pop_back();
  size_t start = 0;
  while (start < key.size() && IsSpace(key[start])) ++start;
  key.erase(0, start);
  if (key.size() < 16 || key.size() > 4096) {
    return absl::InvalidArgumentError(fmt::format(
        "ring secret {}: holds {} bytes; it must hold 16 to 4096 (e.g. `openssl rand -hex 32`)",
        path, key.size()));
  }
  return RingSecret(std::move(key));
}

absl::StatusOr<RingSecret> RingSecret::Create(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    return absl::UnavailableError(
        fmt::format("ring secret {}: cannot create: {}", path, std::strerror(errno)));
  }
  std::string key = RandomHex(32);
  std::string line = key + "\n";
  bool ok = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  ::close(fd);
  if (!ok) return absl::UnavailableError(fmt::format("ring secret {}: cannot write", path));
  return RingSecret(std::move(key));
}

std::string RingSecret::Mac(std::string_view message) const {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  HMAC(EVP_sha256(), key_.data(), static_cast<int>(key_.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &size);
  return Hex(mac, size);
}

bool RingSecret::Verify(std::string_view message, std::string_view mac) const {
  return SecureEquals(Mac(message), mac);
}

std::string RandomHex(int bytes) {
  std::string raw(static_cast<size_t>(bytes), '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(raw.data()), bytes) != 1) {
    // The CSPRNG failing is not something to serve through.
    std::fprintf(stderr, "RAND_bytes failed\n");
    std::abort();
  }
  return Hex(reinterpret_cast<const unsigned char*>(raw.data()), raw.size());
}

std::string ControlProofMessage(std::string_view nonce, std::string_view coordinator_id) {
  return fmt::format("ringserve control v1\n{}\n{}", nonce, coordinator_id);
}

std::string ChannelProofMessage(std::string_view role, std::string_view nonce, int sender_index) {
  return fmt::format("ringserve activation v1\n{}\n{}\n{}", role, nonce, sender_index);
}

}  // namespace ringserve
