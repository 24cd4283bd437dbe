// The ring secret: a key shared by a coordinator and its stages (a file readable only by its
// owner, named in hosts.yaml as `ring_secret` and on the stage command line as --ring-secret),
// and the HMAC-SHA256 proofs built on it. The secret itself never crosses the wire: peers prove
// they know it by MACing a fresh nonce the other side chose.
//
//   control plane (stage_auth.h): the stage hands out nonces (StageControl.Challenge); the
//     coordinator sends ControlProof(nonce, coordinator_id) as call metadata on every call.
//   activation channels (tcp_channel.h): mutual proofs over both sides' nonces at connect.
//
// Thread-safe after construction (immutable).
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace ringserve {

class RingSecret {
 public:
  // Reads the secret from `path`. The file must be a regular file (not a symlink; a FIFO or a
  // device is refused without blocking, common/bounded_file.h) owned by this user and not
  // readable or writable by group or others (mode 0600 or 0400), holding 16 to 4096 bytes
  // (surrounding whitespace dropped). PermissionDenied / InvalidArgument / NotFound naming the
  // path and what is wrong otherwise.
  static absl::StatusOr<RingSecret> Load(const std::string& path);
  // Writes a fresh random secret (32 random bytes, hex) to a new file `path` with mode 0600
  // (the file must not exist) and returns it.
  static absl::StatusOr<RingSecret> Create(const std::string& path);
  // From bytes (tests, and keys a process makes for itself).
  static RingSecret FromBytes(std::string bytes) { return RingSecret(std::move(bytes)); }

  // HMAC-SHA256 of `message` under the secret, lowercase hex (64 characters).
  std::string Mac(std::string_view message) const;
  // Whether `mac` is Mac(message), compared in constant time.
  bool Verify(std::string_view message, std::string_view mac) const;

 private:
  explicit RingSecret(std::string key) : key_(std::move(key)) {}
  std::string key_;
};

// `bytes` random bytes from the OS's CSPRNG, lowercase hex.
std::string RandomHex(int bytes);

// Messages the proofs MAC, one per purpose so that a proof for one cannot be replayed as
// another.
std::string ControlProofMessage(std::string_view nonce, std::string_view coordinator_id);
std::string ChannelProofMessage(std::string_view role, std::string_view nonce, int sender_index);

}  // namespace ringserve
