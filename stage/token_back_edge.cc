#include "stage/token_back_edge.h"

#include <cstring>
#include <deque>
#include <span>
#include <string>

#include "common/status_macros.h"
#include "fmt/format.h"

namespace ringserve {
namespace {

constexpr size_t kHeaderBytes = 12;  // micro_batch_id u64, count u32
constexpr size_t kEntryBytes = 12;   // seq_id u64, token i32

class InProcessBackEdge final : public TokenBackEdge {
 public:
  void Close() override {}
  void Abort() override {}
  int64_t bytes_moved() const override { return 0; }

 protected:
  absl::Status Send(uint64_t micro_batch_id, const Message& message, absl::Duration) override {
    queue_.emplace_back(micro_batch_id, message);
    return absl::OkStatus();
  }
  absl::StatusOr<std::pair<uint64_t, Message>> ReceiveNext(absl::Duration) override {
    // The one stage ran every plan before this one, so what a plan names was sent already.
    if (queue_.empty()) return absl::InternalError("token back edge: no message was sent");
    std::pair<uint64_t, Message> next = std::move(queue_.front());
    queue_.pop_front();
    return next;
  }

 private:
  std::deque<std::pair<uint64_t, Message>> queue_;
};

class LinkBackEdge final : public TokenBackEdge {
 public:
  explicit LinkBackEdge(std::unique_ptr<TcpLink> link) : link_(std::move(link)) {}
  void Close() override { link_->Close(); }
  void Abort() override { link_->Abort(); }
  int64_t bytes_moved() const override { return link_->bytes_moved(); }

 protected:
  absl::Status Send(uint64_t micro_batch_id, const Message& message,
                    absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    std::byte header[kHeaderBytes];
    const uint32_t count = static_cast<uint32_t>(message.size());
    std::memcpy(header, &micro_batch_id, 8);
    std::memcpy(header + 8, &count, 4);
    const std::string what = fmt::format("token back edge to {}", link_->peer());
    RS_RETURN_IF_ERROR(link_->Write(0, header, deadline, what));
    if (count == 0) return absl::OkStatus();
    bytes_.resize(message.size() * kEntryBytes);
    for (size_t i = 0; i < message.size(); ++i) {
      std::memcpy(&bytes_[i * kEntryBytes], &message[i].first, 8);
      std::memcpy(&bytes_[i * kEntryBytes + 8], &message[i].second, 4);
    }
    return link_->Write(micro_batch_id, bytes_, deadline, what);
  }

  absl::StatusOr<std::pair<uint64_t, Message>> ReceiveNext(absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    const std::string what = fmt::format("token back edge from {}", link_->peer());
    std::byte header[kHeaderBytes];
    RS_RETURN_IF_ERROR(link_->Read(0, header, deadline, what));
    uint64_t id = 0;
    uint32_t count = 0;
    std::memcpy(&id, header, 8);
    std::memcpy(&count, header + 8, 4);
    std::pair<uint64_t, Message> out{id, {}};
    if (count == 0) return out;
    bytes_.resize(static_cast<size_t>(count) * kEntryBytes);
    RS_RETURN_IF_ERROR(link_->Read(id, bytes_, deadline, what));
    out.second.resize(count);
    for (size_t i = 0; i < count; ++i) {
      std::memcpy(&out.second[i].first, &bytes_[i * kEntryBytes], 8);
      std::memcpy(&out.second[i].second, &bytes_[i * kEntryBytes + 8], 4);
    }
    return out;
  }

 private:
  std::unique_ptr<TcpLink> link_;
  std::vector<std::byte> bytes_;
};

}  // namespace

std::unique_ptr<TokenBackEdge> TokenBackEdge::InProcess() {
  return std::make_unique<InProcessBackEdge>();
}

std::unique_ptr<TokenBackEdge> TokenBackEdge::OverLink(std::unique_ptr<TcpLink> link) {
  return std::make_unique<LinkBackEdge>(std::move(link));
}

absl::StatusOr<std::unique_ptr<TokenBackEdge>> ConnectTokenBackEdge(
    int stage_index, int num_stages, TcpListener* listener, const std::string& first_endpoint,
    absl::Duration timeout, const RingSecret* secret) {
  const bool first = stage_index == 0;
  const bool last = stage_index == num_stages - 1;
  if (first && last) return TokenBackEdge::InProcess();
  if (first) {
    if (listener == nullptr) {
      return absl::FailedPreconditionError("token back edge: stage 0 has no activation listener");
    }
    RS_ASSIGN_OR_RETURN(std::unique_ptr<TcpLink> link,
                        listener->AcceptLink(num_stages - 1, timeout));
    return TokenBackEdge::OverLink(std::move(link));
  }
  if (last) {
    if (first_endpoint.empty()) {
      return absl::InvalidArgumentError(
          "first_data_endpoint: empty on the last stage of a ring with a token back edge");
    }
    RS_ASSIGN_OR_RETURN(std::unique_ptr<TcpLink> link,
                        TcpConnectLink(first_endpoint, stage_index, timeout, secret));
    return TokenBackEdge::OverLink(std::move(link));
  }
  return std::unique_ptr<TokenBackEdge>();
}

bool UsesTokenBackEdge(const v1::StepPlan& plan) {
  return plan.send_tokens_back() || plan.back_edge_through() != 0 || plan.tokens_from() != 0 ||
         plan.ahead_chunks_size() != 0;
}

absl::Status TokenBackEdge::SendIfAsked(const v1::StepPlan& plan,
                                        const std::vector<v1::SampledToken>& tokens,
                                        absl::Duration timeout) {
  if (!plan.send_tokens_back()) return absl::OkStatus();
  Message message;
  message.reserve(tokens.size());
  for (const v1::SampledToken& t : tokens) message.emplace_back(t.seq_id(), t.token_id());
  return Send(plan.micro_batch_id(), message, timeout);
}

absl::Status TokenBackEdge::FillAheadTokens(const v1::StepPlan& plan, MicroBatch* batch,
                                            absl::Duration timeout) {
  const uint64_t id = plan.micro_batch_id();
  const uint64_t through = std::max(plan.back_edge_through(), plan.tokens_from());
  while (received_through_ < through) {
    RS_ASSIGN_OR_RETURN(auto next, ReceiveNext(timeout));
    if (next.first <= received_through_) {
      return absl::DataLossError(fmt::format("token back edge: micro-batch {} came after {}",
                                             next.first, received_through_));
    }
    received_through_ = next.first;
    received_[next.first] = std::move(next.second);
  }
  if (plan.ahead_chunks_size() > 0) {
    auto it = received_.find(plan.tokens_from());
    if (it == received_.end()) {
      return absl::InvalidArgumentError(
          fmt::format("micro-batch {}: the tokens of micro-batch {} are not on the token back edge",
                      id, plan.tokens_from()));
    }
    // Chunk start offsets into the token ids.
    std::vector<int64_t> ends(batch->chunks.size());
    int64_t offset = 0;
    for (size_t c = 0; c < batch->chunks.size(); ++c)
      ends[c] = offset += batch->chunks[c].num_tokens;
    for (int32_t c : plan.ahead_chunks()) {
      if (c < 0 || static_cast<size_t>(c) >= batch->chunks.size()) {
        return absl::InvalidArgumentError(
            fmt::format("micro-batch {}: ahead chunk {} of {}", id, c, batch->chunks.size()));
      }
      const uint64_t seq = batch->chunks[c].seq_id;
      const int32_t* token = nullptr;
      for (const auto& [sampled_seq, sampled] : it->second) {
        if (sampled_seq == seq) token = &sampled;
      }
      if (token == nullptr) {
        return absl::InvalidArgumentError(
            fmt::format("micro-batch {}: micro-batch {} sampled no token for sequence {}", id,
                        plan.tokens_from(), seq));
      }
      batch->token_ids[ends[c] - 1] = *token;
    }
    received_.erase(it);
  }
  received_.erase(received_.begin(), received_.lower_bound(plan.back_edge_keep_from()));
  return absl::OkStatus();
}

}  // namespace ringserve
