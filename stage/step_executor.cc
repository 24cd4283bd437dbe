#include "stage/step_executor.h"

#include <cmath>
#include <utility>

#include "common/logging.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "stage/last_stage_outputs.h"
#include "stage/sampling/sampler.h"

namespace ringserve {
namespace {

int64_t MicrosSince(absl::Time start) { return absl::ToInt64Microseconds(absl::Now() - start); }

}  // namespace

StepExecutor::StepExecutor(StepExecutorOptions options, std::unique_ptr<ModelSlice> slice,
                           StageChannels channels)
    : options_(options),
      slice_(std::move(slice)),
      resident_(dynamic_cast<ResidentSlice*>(slice_.get())),
      channels_(std::move(channels)) {}

StepExecutor::~StepExecutor() {
  CloseChannels();
  if (timing_.steps > 0) {
    const double n = static_cast<double>(timing_.steps);
    const std::string gpu =
        resident_ == nullptr
            ? std::string()
            : fmt::format(
                  ", GPU time {:.0f} us (the CPU only enqueues a GPU stage's work; the "
                  "last stage waits for its tokens)",
                  timing_.gpu_us / n);
    RS_LOG_INFO(
        "stage {}: {} steps; per step: prepare {:.0f} us, waiting for input {:.0f} us, forward "
        "(and sampling) {:.0f} us, sending {:.0f} us{}",
        options_.stage_index, timing_.steps, timing_.prepare_us / n, timing_.wait_us / n,
        timing_.forward_us / n, timing_.send_us / n, gpu);
  }
}

void StepExecutor::CloseChannels() {
  if (channels_.receiver) channels_.receiver->Close();
  if (channels_.sender) channels_.sender->Close();
  if (channels_.device_receiver) channels_.device_receiver->Close();
  if (channels_.device_sender) channels_.device_sender->Close();
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

absl::Status StepExecutor::ReceiveInput(uint64_t micro_batch_id, int64_t total_tokens) {
  const size_t values = static_cast<size_t>(total_tokens) * slice_->config().hidden_size;
  if (channels_.device_receiver != nullptr) {
    if (resident_ == nullptr) {
      return absl::FailedPreconditionError("a GPU channel needs a CUDA slice");
    }
    if (total_tokens > resident_->max_batch_tokens()) {
      return absl::InvalidArgumentError(fmt::format("{} tokens exceed the stage's {}", total_tokens,
                                                    resident_->max_batch_tokens()));
    }
    RS_RETURN_IF_ERROR(channels_.device_receiver->Recv(
        micro_batch_id, resident_->device_hidden(), values * sizeof(float), resident_->gpu_stream(),
        options_.recv_timeout));
    bytes_received_.store(channels_.device_receiver->bytes_received());
    return absl::OkStatus();
  }
  if (channels_.receiver == nullptr) {
    return absl::FailedPreconditionError("no previous stage connected");
  }
  hidden_in_.resize(values);
  RS_RETURN_IF_ERROR(channels_.receiver->Recv(
      micro_batch_id, std::as_writable_bytes(std::span<float>(hidden_in_)), options_.recv_timeout));
  bytes_received_.store(channels_.receiver->bytes_received());
  if (resident_ != nullptr) RS_RETURN_IF_ERROR(resident_->CopyHiddenIn(hidden_in_));
  return absl::OkStatus();
}

absl::Status StepExecutor::SendOutput(uint64_t micro_batch_id, std::span<const float> host_out,
                                      int64_t total_tokens, StepOutcome* outcome) {
  const size_t values = static_cast<size_t>(total_tokens) * slice_->config().hidden_size;
  if (channels_.device_sender != nullptr) {
    if (resident_ == nullptr) {
      return absl::FailedPreconditionError("a GPU channel needs a CUDA slice");
    }
    const int64_t before = channels_.device_sender->bytes_sent();
    RS_RETURN_IF_ERROR(channels_.device_sender->Send(
        micro_batch_id, resident_->device_hidden(), values * sizeof(float), resident_->gpu_stream(),
        options_.send_timeout));
    outcome->bytes_sent = channels_.device_sender->bytes_sent() - before;
    bytes_sent_.store(channels_.device_sender->bytes_sent());
    return absl::OkStatus();
  }
  if (channels_.sender == nullptr) return absl::FailedPreconditionError("no next stage connected");
  if (resident_ != nullptr) {
    hidden_out_.resize(values);
    RS_RETURN_IF_ERROR(resident_->CopyHiddenOut(hidden_out_));
    host_out = hidden_out_;
  }
  if (host_out.size() != values) {
    return absl::InternalError(fmt::format("slice returned {} values, expected {} x {}",
                                           host_out.size(), total_tokens,
                                           slice_->config().hidden_size));
  }
  const int64_t before = channels_.sender->bytes_sent();
  RS_RETURN_IF_ERROR(
      channels_.sender->Send(micro_batch_id, std::as_bytes(host_out), options_.send_timeout));
  outcome->bytes_sent = channels_.sender->bytes_sent() - before;
  bytes_sent_.store(channels_.sender->bytes_sent());
  return absl::OkStatus();
}

int64_t StepExecutor::EndGpuStep() {
  resident_->EndStepTiming();
  const int64_t gpu_us = resident_->TakeStepGpuMicros();
  timing_.gpu_us += gpu_us;
  return gpu_us;
}

absl::StatusOr<StepOutcome> StepExecutor::RunChecked(const v1::StepPlan& plan) {
  const bool first = slice_->is_first();
  const bool last = slice_->is_last();
  RS_ASSIGN_OR_RETURN(DecodedPlan decoded,
                      DecodeStepPlan(plan, first, last, slice_->options().kv_block_size));
  StepOutcome outcome;
  const int64_t total_tokens = decoded.batch.TotalTokens();
  outcome.num_tokens = static_cast<int>(total_tokens);

  // A GPU slice uploads the batch's metadata before its input arrives over a host channel (the
  // upload overlaps the previous stage). Over a GPU channel the stage enqueues the upload after
  // the input's wait instead, so its GPU work for the step runs as one burst: stages sharing a
  // GPU then take turns once per step (measured on one H200, 4 stages at 32 streams: 89.3% of
  // one stage against 86.0% with the upload first; bench/ring/NOTES.md).
  const bool prepare_after_input = channels_.device_receiver != nullptr;
  int64_t prepare_us = 0;
  auto prepare = [&]() -> absl::Status {
    if (resident_ == nullptr) return absl::OkStatus();
    absl::Time start = absl::Now();
    absl::Status status = resident_->PrepareResident(decoded.batch);
    prepare_us = MicrosSince(start);
    return status;
  };
  if (!prepare_after_input) RS_RETURN_IF_ERROR(prepare());

  absl::Time wait_start = absl::Now();
  if (!first) RS_RETURN_IF_ERROR(ReceiveInput(plan.micro_batch_id(), total_tokens));
  outcome.wait_us = MicrosSince(wait_start);
  if (prepare_after_input) RS_RETURN_IF_ERROR(prepare());
  timing_.Add(prepare_us, outcome.wait_us);

  absl::Time busy_start = absl::Now();
  if (options_.debug_step_delay > absl::ZeroDuration()) absl::SleepFor(options_.debug_step_delay);
  if (resident_ != nullptr) resident_->BeginStepTiming();
  if (!last) {
    std::vector<float> out;
    if (resident_ != nullptr) {
      RS_RETURN_IF_ERROR(resident_->ForwardResident(decoded.batch));
    } else {
      RS_ASSIGN_OR_RETURN(
          out, slice_->Forward(decoded.batch, first ? std::span<const float>() : hidden_in_));
    }
    const int64_t forward_us = MicrosSince(busy_start);
    RS_RETURN_IF_ERROR(SendOutput(plan.micro_batch_id(), out, total_tokens, &outcome));
    const int64_t cpu_us = MicrosSince(busy_start);
    timing_.AddCompute(forward_us, cpu_us - forward_us);
    outcome.busy_us = resident_ != nullptr ? EndGpuStep() : cpu_us;
    return outcome;
  }

  if (resident_ != nullptr) {
    if (HasAllTokensChunk(decoded.batch)) {
      return absl::UnimplementedError(
          "prompt log-probabilities (ALL_TOKENS logits) need a CPU last stage");
    }
    RS_ASSIGN_OR_RETURN(SampledRows sampled,
                        resident_->SampleResident(decoded.batch, decoded.sampling));
    if (sampled.tokens.size() != decoded.sampling.size() ||
        sampled.logprobs.size() != sampled.tokens.size()) {
      return absl::InternalError(fmt::format("slice sampled {} tokens for {} rows",
                                             sampled.tokens.size(), decoded.sampling.size()));
    }
    size_t row = 0;
    for (const SequenceChunk& chunk : decoded.batch.chunks) {
      if (chunk.logits != LogitsMode::kLastToken) continue;
      v1::SampledToken token;
      token.set_seq_id(chunk.seq_id);
      token.set_token_id(sampled.tokens[row]);
      token.set_logprob(sampled.logprobs[row]);
      outcome.tokens.push_back(token);
      ++row;
    }
  } else {
    RS_ASSIGN_OR_RETURN(
        std::vector<float> logits,
        slice_->Forward(decoded.batch, first ? std::span<const float>() : hidden_in_));
    RS_ASSIGN_OR_RETURN(LastStageOutputs outputs,
                        SampleAndScore(logits, slice_->config().vocab_size, decoded));
    outcome.tokens = std::move(outputs.tokens);
    outcome.prompt_logprobs = std::move(outputs.prompt_logprobs);
  }
  const int64_t cpu_us = MicrosSince(busy_start);
  timing_.AddCompute(cpu_us, 0);
  outcome.busy_us = resident_ != nullptr ? EndGpuStep() : cpu_us;
  return outcome;
}

}  // namespace ringserve
