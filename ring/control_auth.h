// Who may tell a stage what to do: checks the ring-secret proof on every control call (the
// scheme is described in proto/stage.proto) and tracks which coordinator the stage belongs to.
//
// Thread-safe.
#pragma once

#include <deque>
#include <mutex>
#include <optional>
#include <string>

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
  explicit StageAuthenticator(std::optional<RingSecret> secret) : secret_(std::move(secret)) {}

  bool secret_required() const { return secret_.has_value(); }

  // A fresh nonce; the last kMaxNonces issued stay valid (several coordinators' attempts,
  // reconnects), older ones are forgotten.
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

  static constexpr size_t kMaxNonces = 256;

 private:
  const std::optional<RingSecret> secret_;
  std::mutex mu_;
  std::deque<std::string> nonces_;
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
