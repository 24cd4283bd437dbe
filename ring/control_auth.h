// Who may tell a stage what to do: checks the ring-secret proof on every control call (the
// scheme is described in proto/stage.proto) and tracks which coordinator the stage belongs to.
//
// Thread-safe.
#pragma once

#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/ring_secret.h"
#include "grpcpp/grpcpp.h"

namespace ringserve {

inline constexpr char kNonceMetadata[] = "x-ringserve-nonce";
inline constexpr char kCoordinatorMetadata[] = "x-ringserve-coordinator";
inline constexpr char kProofMetadata[] = "x-ringserve-proof";

class StageAuthenticator {
 public:
  // Without a secret every caller is accepted (the stage then listens on loopback only, or
  // was started with --insecure) and owns nothing.
  explicit StageAuthenticator(std::optional<RingSecret> secret)
      : secret_(std::move(secret)), nonce_key_(RingSecret::FromBytes(RandomHex(32))) {}

  bool secret_required() const { return secret_.has_value(); }

  // A fresh nonce: random bytes and their MAC under a key of this process, so every nonce it
  // issued stays valid for its life (a coordinator proves with the one it got at connect time
  // until its ring ends) and issuing keeps no state: strangers calling Challenge cannot flush
  // a coordinator's nonce.
  std::string IssueNonce();

  // The caller's coordinator id when its proof is valid; Unauthenticated otherwise (the
  // message says what was missing, never what the right proof would be).
  absl::StatusOr<std::string> Authenticate(const grpc::ServerContext& context);

  // Ownership. Claim: the stage belongs to `coordinator_id` from now on (Configure); fails
  // with PermissionDenied while another coordinator owns it. CheckOwner: PermissionDenied
  // unless the stage is unowned or owned by `coordinator_id`. Release: unowned again (the
  // owner's ring ended).
  absl::Status Claim(const std::string& coordinator_id);
  absl::Status CheckOwner(const std::string& coordinator_id);
  void Release();

 private:
  // Whether `nonce` is one IssueNonce made.
  bool Issued(std::string_view nonce) const;

  const std::optional<RingSecret> secret_;
  const RingSecret nonce_key_;
  std::mutex mu_;
  std::string owner_;
};

// The coordinator's side: proves knowledge of the secret to one stage.
struct ControlCredentials {
  std::string coordinator_id;
  std::optional<RingSecret> secret;  // none: the stages run without one
};

// Loads the secret at `secret_file` (none when empty); the coordinator id is this process's
// (random, the same for every call).
absl::StatusOr<ControlCredentials> MakeControlCredentials(const std::string& secret_file);

// Adds the proof for `nonce` to `context` (nothing when creds has no secret).
void AddControlProof(const ControlCredentials& creds, const std::string& nonce,
                     grpc::ClientContext* context);

}  // namespace ringserve
