// The token back edge over a real loopback link (ConnectTokenBackEdge, as a ring of three
// stages joins it) and in process: placeholders filled from the named micro-batch, messages
// taken through back_edge_through, forgotten below back_edge_keep_from, errors named.
#include "stage/token_back_edge.h"

#include <thread>

#include "gtest/gtest.h"

namespace ringserve {
namespace {

v1::SampledToken Sampled(uint64_t seq, int32_t token) {
  v1::SampledToken t;
  t.set_seq_id(seq);
  t.set_token_id(token);
  return t;
}

// The last stage's plan of micro-batch `id`.
v1::StepPlan LastPlan(uint64_t id) {
  v1::StepPlan plan;
  plan.set_micro_batch_id(id);
  plan.set_send_tokens_back(true);
  return plan;
}

// Stage 0's plan `id`: one decode of each of `seqs`, those listed in `ahead` planned ahead.
v1::StepPlan FirstPlan(uint64_t id, const std::vector<uint64_t>& seqs,
                       const std::vector<int32_t>& ahead, uint64_t tokens_from, uint64_t through,
                       uint64_t keep_from) {
  v1::StepPlan plan;
  plan.set_micro_batch_id(id);
  for (uint64_t seq : seqs) {
    v1::ChunkPlan* c = plan.add_chunks();
    c->set_seq_id(seq);
    c->set_num_tokens(1);
    plan.add_token_ids(static_cast<int32_t>(100 + seq));
  }
  for (int32_t c : ahead) {
    plan.add_ahead_chunks(c);
    plan.set_token_ids(c, 0);
  }
  plan.set_tokens_from(tokens_from);
  plan.set_back_edge_through(through);
  plan.set_back_edge_keep_from(keep_from);
  return plan;
}

MicroBatch BatchOf(const v1::StepPlan& plan) {
  MicroBatch batch;
  for (const auto& c : plan.chunks()) {
    SequenceChunk chunk;
    chunk.seq_id = c.seq_id();
    chunk.num_tokens = c.num_tokens();
    batch.chunks.push_back(chunk);
  }
  batch.token_ids.assign(plan.token_ids().begin(), plan.token_ids().end());
  return batch;
}

struct Ends {
  std::unique_ptr<TokenBackEdge> first;
  std::unique_ptr<TokenBackEdge> last;
};

Ends ConnectThreeStageRing() {
  Ends ends;
  auto listener = TcpListener::Listen("127.0.0.1", 0);
  EXPECT_TRUE(listener.ok()) << listener.status();
  if (!listener.ok()) return ends;
  std::thread last([&] {
    auto edge =
        ConnectTokenBackEdge(2, 3, nullptr, (*listener)->endpoint(), absl::Seconds(5), nullptr);
    EXPECT_TRUE(edge.ok()) << edge.status();
    if (edge.ok()) ends.last = std::move(*edge);
  });
  auto first = ConnectTokenBackEdge(0, 3, listener->get(), "", absl::Seconds(5), nullptr);
  last.join();
  EXPECT_TRUE(first.ok()) << first.status();
  if (first.ok()) ends.first = std::move(*first);
  // The middle stage has no end.
  auto middle = ConnectTokenBackEdge(1, 3, nullptr, "", absl::Seconds(5), nullptr);
  EXPECT_TRUE(middle.ok() && *middle == nullptr);
  return ends;
}

TEST(TokenBackEdgeTest, FillsPlaceholdersFromTheNamedMicroBatchOverALink) {
  Ends ends = ConnectThreeStageRing();
  ASSERT_TRUE(ends.first && ends.last);
  const absl::Duration timeout = absl::Seconds(5);
  ASSERT_TRUE(ends.last->SendIfAsked(LastPlan(1), {Sampled(7, 70), Sampled(8, 80)}, timeout).ok());
  ASSERT_TRUE(ends.last->SendIfAsked(LastPlan(2), {}, timeout).ok());
  ASSERT_TRUE(ends.last->SendIfAsked(LastPlan(3), {Sampled(9, 90)}, timeout).ok());
  v1::StepPlan no_send = LastPlan(4);
  no_send.set_send_tokens_back(false);
  ASSERT_TRUE(ends.last->SendIfAsked(no_send, {Sampled(9, 91)}, timeout).ok());  // not sent

  // Plan 4 follows plan 1: sequence 8's token is a placeholder, sequence 5 was known.
  v1::StepPlan plan = FirstPlan(4, {5, 8}, {1}, 1, 2, 3);
  MicroBatch batch = BatchOf(plan);
  ASSERT_TRUE(ends.first->FillAheadTokens(plan, &batch, timeout).ok());
  EXPECT_EQ(batch.token_ids, (std::vector<int32_t>{105, 80}));
  // Plan 5 follows plan 3 (taken now); plan 1's message was used, plan 2's forgotten.
  v1::StepPlan next = FirstPlan(5, {9}, {0}, 3, 2, 5);
  MicroBatch next_batch = BatchOf(next);
  ASSERT_TRUE(ends.first->FillAheadTokens(next, &next_batch, timeout).ok());
  EXPECT_EQ(next_batch.token_ids, (std::vector<int32_t>{90}));
  // A plan naming a forgotten micro-batch, or a sequence it did not sample, is refused.
  v1::StepPlan stale = FirstPlan(6, {7}, {0}, 1, 3, 5);
  MicroBatch stale_batch = BatchOf(stale);
  absl::Status refused = ends.first->FillAheadTokens(stale, &stale_batch, timeout);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
}

TEST(TokenBackEdgeTest, OneStageKeepsItsTokensInProcessAndNamesAMissingSequence) {
  auto edge = ConnectTokenBackEdge(0, 1, nullptr, "", absl::Seconds(1), nullptr);
  ASSERT_TRUE(edge.ok() && *edge != nullptr);
  ASSERT_TRUE((*edge)->SendIfAsked(LastPlan(1), {Sampled(3, 33)}, absl::Seconds(1)).ok());
  v1::StepPlan plan = FirstPlan(2, {3, 4}, {0, 1}, 1, 1, 2);
  MicroBatch batch = BatchOf(plan);
  absl::Status status = (*edge)->FillAheadTokens(plan, &batch, absl::Seconds(1));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("sequence 4"), std::string::npos) << status;
}

TEST(TokenBackEdgeTest, TheLastStageNeedsStageZerosEndpoint) {
  auto edge = ConnectTokenBackEdge(1, 2, nullptr, "", absl::Seconds(1), nullptr);
  EXPECT_EQ(edge.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ringserve
