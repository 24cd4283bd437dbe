#include "stage/step_executor.h"

#include <utility>

#include "common/logging.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "stage/last_stage_outputs.h"
#include "stage/sampling/sampler.h"
#include "stage/speculative/speculator.h"

namespace ringserve {
namespace {

int64_t MicrosSince(absl::Time start) { return absl::ToInt64Microseconds(absl::Now() - start); }

}  // namespace

absl::StatusOr<std::unique_ptr<StepExecutor>> StepExecutor::Create(
    StepExecutorOptions options, std::unique_ptr<ModelSlice> slice, StageChannels channels) {
  if (slice == nullptr) return absl::InvalidArgumentError("no model slice");
  const bool first = slice->is_first();
  const bool last = slice->is_last();
  std::unique_ptr<StepExecutor> executor(new StepExecutor(options, std::move(slice)));
  // Over a GPU channel the input's wait comes before the upload (see RunChecked).
  executor->prepare_after_input_ = channels.device_receiver != nullptr;
  ActivationBuffer& buffer = executor->slice_->activations();
  auto annotate = [&](const absl::Status& status) {
    return absl::Status(status.code(), fmt::format("stage {}: {}", options.stage_index,
                                                   std::string(status.message())));
  };
  absl::StatusOr<std::unique_ptr<InputPort>> input = MakeInputPort(channels, buffer);
  if (!input.ok()) return annotate(input.status());
  absl::StatusOr<std::unique_ptr<OutputPort>> output = MakeOutputPort(channels, buffer);
  if (!output.ok()) return annotate(output.status());
  executor->input_ = *std::move(input);
  executor->output_ = *std::move(output);
  if ((executor->input_ == nullptr) != first) {
    return annotate(absl::FailedPreconditionError(first ? "the first stage has a previous stage"
                                                        : "no previous stage connected"));
  }
  if ((executor->output_ == nullptr) != last) {
    return annotate(absl::FailedPreconditionError(last ? "the last stage has a next stage"
                                                       : "no next stage connected"));
  }
  return executor;
}

StepExecutor::StepExecutor(StepExecutorOptions options, std::unique_ptr<ModelSlice> slice)
    : options_(options), slice_(std::move(slice)) {}

StepExecutor::~StepExecutor() {
  CloseChannels();
  if (timing_.steps > 0) {
    const double n = static_cast<double>(timing_.steps);
    const bool gpu = slice_->activations().memory() == MemorySpace::kDevice;
    RS_LOG_INFO(
        "stage {}: {} steps; per step: prepare {:.0f} us, waiting for input {:.0f} us, forward "
        "(and sampling) {:.0f} us, sending {:.0f} us, busy {:.0f} us{}",
        options_.stage_index, timing_.steps, timing_.prepare_us / n, timing_.wait_us / n,
        timing_.forward_us / n, timing_.send_us / n, timing_.busy_us / n,
        gpu ? " of GPU time (the CPU only enqueues a GPU stage's work; the last stage waits for "
              "its tokens)"
            : "");
  }
}

void StepExecutor::SetSpeculator(std::unique_ptr<Speculator> speculator) {
  speculator_ = std::move(speculator);
}

void StepExecutor::CloseChannels() {
  if (input_) input_->Close();
  if (output_) output_->Close();
  if (back_edge_) back_edge_->Close();
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

absl::Status StepExecutor::SampleInto(const DecodedPlan& decoded, StepOutcome* outcome) {
  if (speculator_ != nullptr && Speculator::Applies(decoded)) {
    return speculator_->SampleInto(*slice_, decoded, &outcome->tokens, &outcome->prompt_logprobs);
  }
  if (NeedsHostLogits(decoded)) {
    // Prompt log-probabilities, top log-probabilities or suppressed tokens: the logits rows on
    // the host (a GPU slice copies them back), scored and sampled there by the CPU sampler.
    RS_ASSIGN_OR_RETURN(std::vector<float> logits, slice_->LogitsToHost());
    RS_ASSIGN_OR_RETURN(LastStageOutputs outputs,
                        SampleAndScore(logits, slice_->config().vocab_size, decoded));
    outcome->tokens = std::move(outputs.tokens);
    outcome->prompt_logprobs = std::move(outputs.prompt_logprobs);
    return absl::OkStatus();
  }
  RS_ASSIGN_OR_RETURN(SampledRows sampled, slice_->Sample(decoded.batch, decoded.sampling));
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
    outcome->tokens.push_back(token);
    ++row;
  }
  return absl::OkStatus();
}

absl::StatusOr<StepOutcome> StepExecutor::RunChecked(const v1::StepPlan& plan) {
  RS_ASSIGN_OR_RETURN(
      DecodedPlan decoded,
      DecodeStepPlan(plan, slice_->is_first(), slice_->is_last(), slice_->options().kv_block_size));
  if (UsesTokenBackEdge(plan) && back_edge_ == nullptr) {
    return absl::FailedPreconditionError(
        "the plan uses the token back edge, and none is connected");
  }
  // Plan-ahead: stage 0 puts the tokens the last stage sent back into the decodes planned ahead.
  if (slice_->is_first() && back_edge_ != nullptr) {
    RS_RETURN_IF_ERROR(back_edge_->FillAheadTokens(plan, &decoded.batch, options_.recv_timeout));
  }
  const MicroBatch& batch = decoded.batch;
  StepOutcome outcome;
  outcome.num_tokens = static_cast<int>(batch.TotalTokens());

  // The slice prepares the batch (a GPU slice: uploads its metadata) before the input arrives
  // over a host channel (the upload overlaps the previous stage). Over a GPU channel it
  // prepares after the input's wait instead, so its GPU work for the step runs as one burst:
  // stages sharing a GPU then take turns once per step (measured on one H200, 4 stages at 32
  // streams: 89.3% of one stage against 86.0% with the upload first; bench/ring/NOTES.md).
  int64_t prepare_us = 0;
  auto prepare = [&]() -> absl::Status {
    const absl::Time start = absl::Now();
    absl::Status status = slice_->Prepare(batch);
    prepare_us = MicrosSince(start);
    return status;
  };
  if (!prepare_after_input_) RS_RETURN_IF_ERROR(prepare());

  const absl::Time wait_start = absl::Now();
  if (input_ != nullptr) {
    // Sized here too for a batch not yet prepared (InvalidArgument above the buffer's capacity).
    RS_RETURN_IF_ERROR(slice_->activations().Resize(batch.TotalTokens()));
    RS_RETURN_IF_ERROR(input_->Receive(plan.micro_batch_id(), options_.recv_timeout));
    bytes_received_.store(input_->bytes_received());
  }
  outcome.wait_us = MicrosSince(wait_start);
  if (prepare_after_input_) RS_RETURN_IF_ERROR(prepare());

  slice_->BeginStepTiming();
  const absl::Time busy_start = absl::Now();
  if (options_.debug_step_delay > absl::ZeroDuration()) absl::SleepFor(options_.debug_step_delay);
  RS_RETURN_IF_ERROR(slice_->Run(batch));
  const int64_t run_us = MicrosSince(busy_start);
  if (output_ != nullptr) {
    const int64_t before = output_->bytes_sent();
    RS_RETURN_IF_ERROR(output_->Send(plan.micro_batch_id(), options_.send_timeout));
    outcome.bytes_sent = output_->bytes_sent() - before;
    bytes_sent_.store(output_->bytes_sent());
  } else {
    RS_RETURN_IF_ERROR(SampleInto(decoded, &outcome));
    if (back_edge_ != nullptr) {
      RS_RETURN_IF_ERROR(back_edge_->SendIfAsked(plan, outcome.tokens, options_.send_timeout));
    }
  }
  const int64_t cpu_us = MicrosSince(busy_start);
  slice_->EndStepTiming();
  outcome.busy_us = slice_->TakeStepMicros();

  ++timing_.steps;
  timing_.prepare_us += prepare_us;
  timing_.wait_us += outcome.wait_us;
  timing_.forward_us += output_ != nullptr ? run_us : cpu_us;
  timing_.send_us += output_ != nullptr ? cpu_us - run_us : 0;
  timing_.busy_us += outcome.busy_us;
  return outcome;
}

}  // namespace ringserve
