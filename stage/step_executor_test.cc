#include "stage/step_executor.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ring/plan_codec.h"
#include "stage/channels/tcp_channel.h"
#include "stage/sampling/sampler.h"
#include "stage/step_executor_testing.h"

namespace ringserve {
namespace {

using ::testing::HasSubstr;

using ::ringserve::testing::LoadStepExecutorSlice;
using ::ringserve::testing::TwoPromptSampling;

// Stage 0 (layers [0, 2)) sending to stage 1 (layers [2, 3), built with `tail_options`) over a
// real tcp channel on loopback.
struct TcpStages {
  std::unique_ptr<StepExecutor> head;
  std::unique_ptr<StepExecutor> tail;
};
absl::StatusOr<TcpStages> TwoStagesOverTcp(StepExecutorOptions tail_options) {
  auto listener = TcpListener::Listen("127.0.0.1", 0);
  if (!listener.ok()) return listener.status();
  absl::StatusOr<std::unique_ptr<ActivationSender>> sender;
  std::thread connector([&] { sender = TcpConnect((*listener)->endpoint(), 0, absl::Seconds(5)); });
  auto receiver = (*listener)->Accept(0, absl::Seconds(5));
  connector.join();
  if (!sender.ok()) return sender.status();
  if (!receiver.ok()) return receiver.status();

  StageChannels head_channels;
  head_channels.sender = *std::move(sender);
  StageChannels tail_channels;
  tail_channels.receiver = *std::move(receiver);
  auto head = StepExecutor::Create({.stage_index = 0}, LoadStepExecutorSlice({0, 2}),
                                   std::move(head_channels));
  if (!head.ok()) return head.status();
  auto tail =
      StepExecutor::Create(tail_options, LoadStepExecutorSlice({2, 3}), std::move(tail_channels));
  if (!tail.ok()) return tail.status();
  return TcpStages{.head = *std::move(head), .tail = *std::move(tail)};
}

// A device receiving end that is never used (a CPU stage must refuse it when it is built).
class UnusedDeviceReceiver : public DeviceActivationReceiver {
 public:
  absl::Status Recv(uint64_t, void*, size_t, GpuStream, absl::Duration) override {
    return absl::InternalError("not reached");
  }
  void Close() override {}
  int64_t bytes_received() const override { return 0; }
};

// Two sequences: a prompt of 5 tokens (greedy) and one of 3 (sampled at temperature 0.9).
MicroBatch Prefill() { return ringserve::testing::TwoPromptPrefill(); }

// Two CPU stages joined by a real tcp channel return the tokens and logprobs that one slice of
// the whole model gives with the host sampler, step after step (a prefill, then decodes that
// feed the sampled tokens back).
TEST(StepExecutorTest, TwoStagesOverTcpSampleWhatTheWholeModelSamples) {
  std::unique_ptr<ModelSlice> whole = LoadStepExecutorSlice({0, 3});
  ASSERT_NE(whole, nullptr);
  absl::StatusOr<TcpStages> stages = TwoStagesOverTcp({.stage_index = 1});
  ASSERT_TRUE(stages.ok()) << stages.status();
  StepExecutor* head = stages->head.get();
  StepExecutor* tail = stages->tail.get();

  MicroBatch batch = Prefill();
  for (int step = 0; step < 3; ++step) {
    const std::vector<ChunkSamplingWire> wire = TwoPromptSampling(step);
    const v1::StepPlan head_plan = EncodeStepPlan(step, batch, wire, true, false);
    const v1::StepPlan tail_plan = EncodeStepPlan(step, batch, wire, false, true);
    absl::StatusOr<StepOutcome> sent;
    std::thread head_thread([&] { sent = head->Run(head_plan); });
    absl::StatusOr<StepOutcome> got = tail->Run(tail_plan);
    head_thread.join();
    ASSERT_TRUE(sent.ok()) << sent.status();
    ASSERT_TRUE(got.ok()) << got.status();
    const int64_t bytes = batch.TotalTokens() * 64 * int64_t{sizeof(float)};
    // The activations plus one frame header.
    EXPECT_GE(sent->bytes_sent, bytes) << "step " << step;
    EXPECT_LE(sent->bytes_sent, bytes + 64) << "step " << step;
    EXPECT_TRUE(sent->tokens.empty());

    absl::StatusOr<std::vector<float>> logits = whole->Forward(batch, {});
    ASSERT_TRUE(logits.ok()) << logits.status();
    std::vector<RowSampling> rows;
    for (const ChunkSamplingWire& w : wire) {
      rows.push_back({.config = w.config, .token_index = static_cast<uint64_t>(w.token_index)});
    }
    absl::StatusOr<std::vector<int32_t>> want = SampleTokens(*logits, 448, rows);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_EQ(got->tokens.size(), 2u) << "step " << step;
    MicroBatch next;
    for (size_t r = 0; r < 2; ++r) {
      const v1::SampledToken& token = got->tokens[r];
      EXPECT_EQ(token.seq_id(), batch.chunks[r].seq_id);
      EXPECT_EQ(token.token_id(), (*want)[r]) << "step " << step << " row " << r;
      EXPECT_EQ(token.logprob(),
                TokenLogprob(std::span<const float>(*logits).subspan(r * 448, 448), (*want)[r]));
      const SequenceChunk& chunk = batch.chunks[r];
      next.chunks.push_back({.seq_id = chunk.seq_id,
                             .start_position = chunk.start_position + chunk.num_tokens,
                             .num_tokens = 1,
                             .block_table = chunk.block_table,
                             .logits = LogitsMode::kLastToken});
      next.token_ids.push_back(token.token_id());
    }
    batch = next;
  }
  EXPECT_EQ(tail->bytes_received(), head->bytes_sent());
  EXPECT_GT(head->bytes_sent(), 0);
}

// A step waiting for a neighbour that sends nothing reports it (the stage's activity reports,
// for the coordinator's progress watchdog) and ends at AbortChannels, not at its timeout.
TEST(StepExecutorTest, StepWaitingOnASilentNeighbourReportsItAndEndsAtAbort) {
  absl::StatusOr<TcpStages> stages =
      TwoStagesOverTcp({.stage_index = 1, .recv_timeout = absl::Seconds(120)});
  ASSERT_TRUE(stages.ok()) << stages.status();
  StepExecutor* tail = stages->tail.get();
  EXPECT_EQ(tail->Activity().state, ExecutorActivity::State::kIdle);

  const MicroBatch batch = Prefill();
  const v1::StepPlan plan = EncodeStepPlan(7, batch, TwoPromptSampling(0), false, true);
  absl::StatusOr<StepOutcome> got;
  absl::Time returned;
  std::thread tail_thread([&] {
    got = tail->Run(plan);
    returned = absl::Now();
  });
  ExecutorActivity activity;
  const absl::Time wait_until = absl::Now() + absl::Seconds(30);
  do {
    absl::SleepFor(absl::Milliseconds(1));
    activity = tail->Activity();
  } while (activity.state != ExecutorActivity::State::kReceiving && absl::Now() < wait_until);
  EXPECT_EQ(activity.state, ExecutorActivity::State::kReceiving);
  EXPECT_EQ(activity.micro_batch_id, 7u);
  EXPECT_EQ(activity.channel_bytes, 0);  // a tcp channel counts: nothing came
  const absl::Time aborted = absl::Now();
  tail->AbortChannels();
  tail_thread.join();
  EXPECT_TRUE(absl::IsCancelled(got.status())) << got.status();
  EXPECT_THAT(std::string(got.status().message()), HasSubstr("stage 1, micro-batch 7"));
  EXPECT_LT(returned - aborted, absl::Seconds(10));
}

TEST(StepExecutorTest, RefusesAGpuChannelForHostActivations) {
  StageChannels channels;
  channels.device_receiver = std::make_unique<UnusedDeviceReceiver>();
  auto executor =
      StepExecutor::Create({.stage_index = 1}, LoadStepExecutorSlice({2, 3}), std::move(channels));
  ASSERT_FALSE(executor.ok());
  EXPECT_EQ(executor.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(executor.status().message()),
              HasSubstr("stage 1: a GPU channel (cuda_ipc, nccl) for the previous stage"));
}

TEST(StepExecutorTest, RefusesAMissingNeighbour) {
  auto executor =
      StepExecutor::Create({.stage_index = 1}, LoadStepExecutorSlice({2, 3}), StageChannels{});
  ASSERT_FALSE(executor.ok());
  EXPECT_EQ(executor.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(executor.status().message()), HasSubstr("no previous stage connected"));
}

// One stage holding the whole model: no channels; a malformed plan fails with the stage and
// micro-batch named, and a good one still runs after it (nothing was left half-done).
TEST(StepExecutorTest, OneStageRejectsABadPlanAndRunsTheNext) {
  auto executor =
      StepExecutor::Create({.stage_index = 0}, LoadStepExecutorSlice({0, 3}), StageChannels{});
  ASSERT_TRUE(executor.ok()) << executor.status();
  MicroBatch bad = Prefill();
  bad.chunks[1].block_table = {99};
  auto failed = (*executor)->Run(EncodeStepPlan(7, bad, TwoPromptSampling(0), true, true));
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(failed.status().message()), HasSubstr("stage 0, micro-batch 7"));
  auto ran = (*executor)->Run(EncodeStepPlan(8, Prefill(), TwoPromptSampling(0), true, true));
  ASSERT_TRUE(ran.ok()) << ran.status();
  EXPECT_EQ(ran->tokens.size(), 2u);
  EXPECT_EQ(ran->num_tokens, 8);
}

}  // namespace
}  // namespace ringserve
