#include "stage/step_executor.h"

#include <cmath>
#include <utility>

#include "common/status_macros.h"
#include "fmt/format.h"
#include "stage/sampling/sampler.h"

namespace ringserve {
namespace {

int64_t MicrosSince(absl::Time start) { return absl::ToInt64Microseconds(absl::Now() - start); }

// log softmax of `token` in `row`.
float LogProb(std::span<const float> row, int32_t token) {
  float max = -INFINITY;
  for (float v : row) max = std::max(max, v);
  double sum = 0;
  for (float v : row) sum += std::exp(static_cast<double>(v - max));
  return static_cast<float>(row[token] - max - std::log(sum));
}

}  // namespace

StepExecutor::StepExecutor(StepExecutorOptions options, std::unique_ptr<ModelSlice> slice,
                           std::unique_ptr<ActivationReceiver> receiver,
                           std::unique_ptr<ActivationSender> sender)
    : options_(options),
      slice_(std::move(slice)),
      receiver_(std::move(receiver)),
      sender_(std::move(sender)) {}

StepExecutor::~StepExecutor() { CloseChannels(); }

void StepExecutor::CloseChannels() {
  if (receiver_) receiver_->Close();
  if (sender_) sender_->Close();
}

absl::StatusOr<StepOutcome> StepExecutor::Run(const v1::StepPlan& plan) {
  absl::StatusOr<StepOutcome> outcome = RunChecked(plan);
  if (!outcome.ok()) {
    CloseChannels();
    return absl::Status(
        outcome.status().code(),
        fmt::format("stage {}, micro-batch {}: {}", options_.stage_index, plan.micro_batch_id(),
                    std::string(outcome.status().message())));
  }
  return outcome;
}

absl::StatusOr<StepOutcome> StepExecutor::RunChecked(const v1::StepPlan& plan) {
  const bool first = slice_->is_first();
  const bool last = slice_->is_last();
  RS_ASSIGN_OR_RETURN(DecodedPlan decoded,
                      DecodeStepPlan(plan, first, last, slice_->options().kv_block_size));
  StepOutcome outcome;
  const int64_t total_tokens = decoded.batch.TotalTokens();
  const int hidden = slice_->config().hidden_size;
  outcome.num_tokens = static_cast<int>(total_tokens);

  absl::Time wait_start = absl::Now();
  if (!first) {
    if (receiver_ == nullptr) return absl::FailedPreconditionError("no previous stage connected");
    hidden_in_.resize(static_cast<size_t>(total_tokens) * hidden);
    RS_RETURN_IF_ERROR(receiver_->Recv(plan.micro_batch_id(),
                                       std::as_writable_bytes(std::span<float>(hidden_in_)),
                                       options_.recv_timeout));
    bytes_received_.store(receiver_->bytes_received());
  }
  outcome.wait_us = MicrosSince(wait_start);

  absl::Time busy_start = absl::Now();
  if (options_.debug_step_delay > absl::ZeroDuration()) absl::SleepFor(options_.debug_step_delay);
  RS_ASSIGN_OR_RETURN(
      std::vector<float> out,
      slice_->Forward(decoded.batch, first ? std::span<const float>() : hidden_in_));
  if (!last) {
    if (out.size() != static_cast<size_t>(total_tokens) * hidden) {
      return absl::InternalError(fmt::format("slice returned {} values, expected {} x {}",
                                             out.size(), total_tokens, hidden));
    }
    outcome.busy_us = MicrosSince(busy_start);
    if (sender_ == nullptr) return absl::FailedPreconditionError("no next stage connected");
    int64_t before = sender_->bytes_sent();
    RS_RETURN_IF_ERROR(sender_->Send(
        plan.micro_batch_id(), std::as_bytes(std::span<const float>(out)), options_.send_timeout));
    outcome.bytes_sent = sender_->bytes_sent() - before;
    bytes_sent_.store(sender_->bytes_sent());
    return outcome;
  }

  const int vocab = slice_->config().vocab_size;
  if (out.size() != decoded.sampling.size() * static_cast<size_t>(vocab)) {
    return absl::InternalError(fmt::format("slice returned {} logits, expected {} rows x {}",
                                           out.size(), decoded.sampling.size(), vocab));
  }
  RS_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, SampleTokens(out, vocab, decoded.sampling));
  size_t row = 0;
  for (const SequenceChunk& chunk : decoded.batch.chunks) {
    if (chunk.logits != LogitsMode::kLastToken) continue;
    v1::SampledToken token;
    token.set_seq_id(chunk.seq_id);
    token.set_token_id(tokens[row]);
    token.set_logprob(
        LogProb(std::span<const float>(out).subspan(row * vocab, vocab), tokens[row]));
    outcome.tokens.push_back(token);
    ++row;
  }
  outcome.busy_us = MicrosSince(busy_start);
  return outcome;
}

}  // namespace ringserve
