// The token back edge of plan-ahead (coordinator/plan_ahead.h): the last stage sends each
// micro-batch's sampled tokens straight to stage 0, which puts them into the decodes the
// coordinator planned ahead (placeholders in the plan's token ids), so stage 0 never waits for
// the coordinator between steps.
//
// One message per micro-batch whose plan has send_tokens_back (with plan-ahead: every plan),
// in micro-batch order: the (sequence id, token) pairs the last stage sampled, in chunk order.
// Between stages of a ring of several it travels over a TcpLink (stage/channels/tcp_channel.h:
// framed, CRC-checked, authenticated with the ring secret), whatever the activation channel:
// the tokens are on the host at both ends (the last stage copies them there for its
// StepResult; stage 0's Prepare takes host token ids). A one-stage ring keeps them in process.
// Wire form: a frame tagged 0 holding {micro_batch_id u64, count u32}, then (count > 0) a frame
// tagged micro_batch_id holding count x {seq_id u64, token i32}, little endian.
//
// Not thread-safe: the stage's executor thread only (Abort and bytes_moved: any thread).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/stage.pb.h"
#include "ring/micro_batch.h"
#include "stage/channels/tcp_channel.h"

namespace ringserve {

class TokenBackEdge {
 public:
  using Message = std::vector<std::pair<uint64_t, int32_t>>;  // (seq id, token), chunk order

  // A one-stage ring: what the stage sends it receives itself.
  static std::unique_ptr<TokenBackEdge> InProcess();
  // The last stage's end (sending) or stage 0's (receiving) of a link between them.
  static std::unique_ptr<TokenBackEdge> OverLink(std::unique_ptr<TcpLink> link);

  virtual ~TokenBackEdge() = default;

  // Last stage: when `plan` has send_tokens_back, sends `tokens` (the step's sampled tokens, in
  // chunk order) as the plan's message. Errors as TcpLink::Write.
  absl::Status SendIfAsked(const v1::StepPlan& plan, const std::vector<v1::SampledToken>& tokens,
                           absl::Duration timeout);

  // Stage 0: takes the messages of every micro-batch up to back_edge_through (and tokens_from),
  // fills the placeholder of each chunk in ahead_chunks (the last of the chunk's token ids in
  // `batch`) with the token micro-batch tokens_from sampled for the chunk's sequence, then
  // forgets the messages below back_edge_keep_from. InvalidArgument naming the micro-batch when
  // a chunk index is out of range or its token is not in the message; DataLoss for messages out
  // of order; the link's errors (Unavailable, DeadlineExceeded).
  absl::Status FillAheadTokens(const v1::StepPlan& plan, MicroBatch* batch, absl::Duration timeout);

  // Closes the link: the peer's pending calls fail.
  virtual void Close() = 0;
  // Thread-safe: TcpLink::Abort and bytes_moved (nothing and 0 in process).
  virtual void Abort() = 0;
  virtual int64_t bytes_moved() const = 0;

 protected:
  virtual absl::Status Send(uint64_t micro_batch_id, const Message& message,
                            absl::Duration timeout) = 0;
  // The next message in micro-batch order.
  virtual absl::StatusOr<std::pair<uint64_t, Message>> ReceiveNext(absl::Duration timeout) = 0;

 private:
  uint64_t received_through_ = 0;
  std::map<uint64_t, Message> received_;  // by micro-batch id, until used or forgotten
};

// True when `plan` uses a back edge (sends on it or takes from it).
bool UsesTokenBackEdge(const v1::StepPlan& plan);

// Stage `stage_index` of `num_stages` joins the back edge: one stage keeps it in process; stage
// 0 accepts the last stage on its activation `listener`; the last stage connects to
// `first_endpoint` (stage 0's activation listener); other stages have none (returns null).
// Errors name the peer (as TcpListener::AcceptLink, TcpConnectLink).
absl::StatusOr<std::unique_ptr<TokenBackEdge>> ConnectTokenBackEdge(
    int stage_index, int num_stages, TcpListener* listener, const std::string& first_endpoint,
    absl::Duration timeout, const RingSecret* secret);

}  // namespace ringserve
