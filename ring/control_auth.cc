#include "ring/control_auth.h"

#include "fmt/format.h"

namespace ringserve {
namespace {

// The random part of a nonce, in hex characters; its MAC follows.
constexpr size_t kNonceRandomChars = 32;

std::string Metadata(const grpc::ServerContext& context, const char* key) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(key);
  if (it == metadata.end()) return "";
  return std::string(it->second.data(), it->second.size());
}

}  // namespace

std::string StageAuthenticator::IssueNonce() {
  std::string random = RandomHex(kNonceRandomChars / 2);
  return random + nonce_key_.Mac(random);
}

bool StageAuthenticator::Issued(std::string_view nonce) const {
  return nonce.size() > kNonceRandomChars &&
         nonce_key_.Verify(nonce.substr(0, kNonceRandomChars), nonce.substr(kNonceRandomChars));
}

absl::StatusOr<std::string> StageAuthenticator::Authenticate(const grpc::ServerContext& context) {
  std::string coordinator = Metadata(context, kCoordinatorMetadata);
  if (!secret_.has_value()) return coordinator;
  std::string nonce = Metadata(context, kNonceMetadata);
  std::string proof = Metadata(context, kProofMetadata);
  if (nonce.empty() || proof.empty() || coordinator.empty() || coordinator.size() > 128) {
    return absl::UnauthenticatedError(
        "this stage requires the ring secret: call Challenge and send x-ringserve-nonce, "
        "x-ringserve-coordinator and x-ringserve-proof");
  }
  if (!Issued(nonce)) {
    return absl::UnauthenticatedError("unknown nonce; call Challenge again");
  }
  if (!secret_->Verify(ControlProofMessage(nonce, coordinator), proof)) {
    return absl::UnauthenticatedError("wrong ring secret proof");
  }
  return coordinator;
}

absl::Status StageAuthenticator::Claim(const std::string& coordinator_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!secret_.has_value()) return absl::OkStatus();
  if (!owner_.empty() && owner_ != coordinator_id) {
    return absl::PermissionDeniedError(fmt::format(
        "this stage belongs to coordinator {} until its ring ends", owner_.substr(0, 8)));
  }
  owner_ = coordinator_id;
  return absl::OkStatus();
}

absl::Status StageAuthenticator::CheckOwner(const std::string& coordinator_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (owner_.empty() || owner_ == coordinator_id) return absl::OkStatus();
  return absl::PermissionDeniedError(
      fmt::format("this stage belongs to coordinator {} until its ring ends", owner_.substr(0, 8)));
}

void StageAuthenticator::Release() {
  std::lock_guard<std::mutex> lock(mu_);
  owner_.clear();
}

absl::StatusOr<ControlCredentials> MakeControlCredentials(const std::string& secret_file) {
  // One id for the life of the process: a coordinator that forms its ring again (after a stage
  // failed) is still the owner of the stages that survived.
  static const std::string* const kCoordinatorId = new std::string(RandomHex(16));
  ControlCredentials creds;
  creds.coordinator_id = *kCoordinatorId;
  if (!secret_file.empty()) {
    absl::StatusOr<RingSecret> secret = RingSecret::Load(secret_file);
    if (!secret.ok()) return secret.status();
    creds.secret = std::move(*secret);
  }
  return creds;
}

void AddControlProof(const ControlCredentials& creds, const std::string& nonce,
                     grpc::ClientContext* context) {
  context->AddMetadata(kCoordinatorMetadata, creds.coordinator_id);
  if (!creds.secret.has_value()) return;
  context->AddMetadata(kNonceMetadata, nonce);
  context->AddMetadata(kProofMetadata,
                       creds.secret->Mac(ControlProofMessage(nonce, creds.coordinator_id)));
}

}  // namespace ringserve
