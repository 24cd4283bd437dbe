#include "stage/step_executor.h"

#include <algorithm>
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

// Steps of a one-stage ring whose sampling is left in flight at once (plans sent ahead): one
// running, one collected while the next runs (more would only delay each token's report).
constexpr int kStepSamplingsAhead = 2;
static_assert(kStepSamplingsAhead <= ModelSlice::kMaxSamplesInFlight);

}  // namespace

absl::StatusOr<std::unique_ptr<StepExecutor>> StepExecutor::Create(
    StepExecutorOptions options, std::unique_ptr<ModelSlice> slice, StageChannels channels) {
  if (slice == nullptr) return absl::InvalidArgumentError("no model slice");
  const bool first = slice->is_first();
  const bool last = slice->is_last();
  std::unique_ptr<StepExecutor> executor(new StepExecutor(options, std::move(slice)));
  // Over a GPU channel the input's wait comes before the upload (see SubmitChecked).
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
    : options_(options), slice_(std::move(slice)) {
  activity_.since = absl::Now();
}

StepExecutor::~StepExecutor() {
  CloseChannels();
  if (timing_.steps > 0) {
    const double n = static_cast<double>(timing_.steps);
    const bool gpu = slice_->activations().memory() == MemorySpace::kDevice;
    RS_LOG_INFO(
        "stage {}: {} steps ({} fed on the device); per step: prepare {:.0f} us, waiting for "
        "input {:.0f} us, forward (and sampling) {:.0f} us, sending {:.0f} us, busy {:.0f} us{}",
        options_.stage_index, timing_.steps, fed_steps_, timing_.prepare_us / n,
        timing_.wait_us / n, timing_.forward_us / n, timing_.send_us / n, timing_.busy_us / n,
        gpu ? " of GPU time (the CPU only enqueues a GPU stage's work; the last stage waits for "
              "its tokens)"
            : "");
    if (timing_.idle_steps > 0) {
      RS_LOG_INFO("stage {}: {} steps came with none in flight, {:.0f} us after the previous one",
                  options_.stage_index, timing_.idle_steps,
                  static_cast<double>(timing_.idle_us) / timing_.idle_steps);
    }
  }
  if (timing_.spec_steps > 0) {
    const double n = static_cast<double>(timing_.spec_steps);
    const SpeculatorStats stats = speculator_->stats();
    const double plans = static_cast<double>(std::max<int64_t>(1, stats.plans));
    RS_LOG_INFO(
        "stage {}: {} speculating steps; per step: forward, verification and drafting {:.0f} us "
        "(the target's rows {:.0f} us, drafting {:.0f} us), busy {:.0f} us; {} of them with none "
        "in flight, {:.0f} us after the previous one",
        options_.stage_index, timing_.spec_steps, timing_.spec_forward_us / n,
        stats.target_rows_us / plans, stats.draft_us / plans, timing_.spec_busy_us / n,
        timing_.spec_idle_steps,
        static_cast<double>(timing_.spec_idle_us) / std::max<int64_t>(1, timing_.spec_idle_steps));
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

void StepExecutor::AbortChannels() {
  // The ends are set before the first step and live as long as the executor.
  if (input_) input_->Abort();
  if (output_) output_->Abort();
  if (back_edge_) back_edge_->Abort();
  std::lock_guard<std::mutex> lock(activity_mu_);
  aborted_ = true;
  aborted_cv_.notify_all();
}

ExecutorActivity StepExecutor::Activity() const {
  ExecutorActivity activity;
  {
    std::lock_guard<std::mutex> lock(activity_mu_);
    activity = activity_;
  }
  // The sum over the stage's channels; unknown (-1) as soon as one of them cannot tell (a GPU
  // channel): a sum of the others alone would stand still during a long transfer over it, and
  // the coordinator would take a working stage for a stalled one.
  const bool none = input_ == nullptr && output_ == nullptr && back_edge_ == nullptr;
  const int64_t moved[] = {input_ ? input_->bytes_moved() : 0, output_ ? output_->bytes_moved() : 0,
                           back_edge_ ? back_edge_->bytes_moved() : 0};
  activity.channel_bytes = none ? -1 : 0;
  for (int64_t bytes : moved) {
    if (bytes < 0) {
      activity.channel_bytes = -1;
      break;
    }
    if (!none) activity.channel_bytes += bytes;
  }
  return activity;
}

void StepExecutor::SetActivity(ExecutorActivity::State state, uint64_t micro_batch_id) {
  std::lock_guard<std::mutex> lock(activity_mu_);
  if (activity_.state == state && activity_.micro_batch_id == micro_batch_id) return;
  activity_.state = state;
  activity_.micro_batch_id = micro_batch_id;
  activity_.since = absl::Now();
}

absl::Status StepExecutor::DebugStall(uint64_t micro_batch_id) {
  SetActivity(ExecutorActivity::State::kReceiving, micro_batch_id);
  RS_LOG_WARN("stage {}: stalling before micro-batch {} (--debug_stall_after_steps)",
              options_.stage_index, micro_batch_id);
  std::unique_lock<std::mutex> lock(activity_mu_);
  aborted_cv_.wait(lock, [&] { return aborted_; });
  return absl::CancelledError("aborted while stalled (--debug_stall_after_steps)");
}

absl::StatusOr<StepOutcome> StepExecutor::Run(const v1::StepPlan& plan) {
  if (!pending_.empty()) {
    return absl::FailedPreconditionError(fmt::format("stage {}: Run with {} steps in flight",
                                                     options_.stage_index, pending_.size()));
  }
  RS_RETURN_IF_ERROR(Submit(plan));
  return FinishOldest();
}

absl::Status StepExecutor::AnnotateError(const absl::Status& status, uint64_t micro_batch_id) {
  CloseChannels();
  return absl::Status(status.code(),
                      fmt::format("stage {}, micro-batch {}: {}", options_.stage_index,
                                  micro_batch_id, std::string(status.message())));
}

absl::Status StepExecutor::Submit(v1::StepPlan plan) {
  const uint64_t id = plan.micro_batch_id();
  int64_t idle_before_us = -1;
  if (pending_.empty()) {
    std::lock_guard<std::mutex> lock(activity_mu_);
    // Gaps longer than this are a ring without work, not a turn between steps.
    constexpr absl::Duration kLongestTurn = absl::Milliseconds(50);
    const absl::Duration idle = absl::Now() - activity_.since;
    if (activity_.state == ExecutorActivity::State::kIdle && timing_.steps > 0 &&
        idle < kLongestTurn) {
      idle_before_us = absl::ToInt64Microseconds(idle);
    }
  }
  PendingStep& step = pending_.emplace_back();
  step.plan = std::move(plan);
  step.idle_before_us = idle_before_us;
  const absl::Status status = SubmitChecked(step);
  if (status.ok()) return status;
  if (step.sampling_in_flight) --samplings_in_flight_;
  pending_.pop_back();
  if (pending_.empty()) SetActivity(ExecutorActivity::State::kIdle, id);
  return AnnotateError(status, id);
}

bool StepExecutor::OldestFinishes() const {
  return !pending_.empty() && (!pending_.front().sampling_in_flight || slice_->SampleReady());
}

absl::StatusOr<StepOutcome> StepExecutor::FinishOldest() {
  if (pending_.empty()) return absl::FailedPreconditionError("no step in flight");
  PendingStep& step = pending_.front();
  const uint64_t id = step.plan.micro_batch_id();
  absl::Status status = Complete(step);
  StepOutcome outcome = std::move(step.outcome);
  if (step.sampling_in_flight) --samplings_in_flight_;
  pending_.pop_front();
  if (pending_.empty()) SetActivity(ExecutorActivity::State::kIdle, id);
  if (!status.ok()) return AnnotateError(status, id);
  return outcome;
}

absl::Status StepExecutor::FinishSamplingsBefore(const PendingStep* step) {
  for (PendingStep& older : pending_) {
    if (&older == step) break;
    if (older.sampling_in_flight || older.fed) RS_RETURN_IF_ERROR(Complete(older));
  }
  return absl::OkStatus();
}

absl::Status StepExecutor::TokensFromRows(const DecodedPlan& decoded, const SampledRows& sampled,
                                          StepOutcome* outcome) const {
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

absl::Status StepExecutor::Complete(PendingStep& step) {
  if (step.fed) {
    // The step before it was completed first (its message is on the back edge): the back
    // edge's bookkeeping, and the host copy of the tokens the device fed.
    step.fed = false;
    SetActivity(ExecutorActivity::State::kReceiving, step.plan.micro_batch_id());
    RS_RETURN_IF_ERROR(
        back_edge_->FillAheadTokens(step.plan, &step.decoded.batch, options_.recv_timeout));
  }
  if (!step.sampling_in_flight) return absl::OkStatus();
  step.sampling_in_flight = false;
  --samplings_in_flight_;
  SetActivity(ExecutorActivity::State::kComputing, step.plan.micro_batch_id());
  RS_ASSIGN_OR_RETURN(SampledRows sampled, slice_->WaitSample());
  RS_RETURN_IF_ERROR(TokensFromRows(step.decoded, sampled, &step.outcome));
  SetActivity(ExecutorActivity::State::kSending, step.plan.micro_batch_id());
  RS_RETURN_IF_ERROR(
      back_edge_->SendIfAsked(step.plan, step.outcome.tokens, options_.send_timeout));
  step.outcome.busy_us = slice_->TakeStepMicros();
  timing_.busy_us += step.outcome.busy_us;
  return absl::OkStatus();
}

bool StepExecutor::CanDefer(const PendingStep& step) const {
  return options_.sampling_in_flight && slice_->can_sample_async() && back_edge_ != nullptr &&
         step.plan.send_tokens_back() &&
         !(speculator_ != nullptr && Speculator::Applies(step.decoded)) &&
         !NeedsHostLogits(step.decoded) && !step.decoded.sampling.empty();
}

absl::Status StepExecutor::TakeAheadTokens(PendingStep& step, std::vector<TokenFeed>* feeds) {
  const v1::StepPlan& plan = step.plan;
  const uint64_t through = std::max(plan.back_edge_through(), plan.tokens_from());
  // The device can feed the step when the only step whose tokens are not on the host is the
  // one just before it, and that is the step its ahead tokens come from.
  const PendingStep* base = pending_.size() >= 2 ? &pending_[pending_.size() - 2] : nullptr;
  const bool feedable = slice_->can_sample_async() && samplings_in_flight_ == 1 &&
                        base != nullptr && base->sampling_in_flight &&
                        base->plan.micro_batch_id() == through &&
                        (plan.ahead_chunks_size() == 0 || plan.tokens_from() == through);
  if (!feedable) {
    // The messages of every earlier step first (their own back-edge reads included).
    RS_RETURN_IF_ERROR(FinishSamplingsBefore(&step));
    SetActivity(ExecutorActivity::State::kReceiving, plan.micro_batch_id());
    return back_edge_->FillAheadTokens(plan, &step.decoded.batch, options_.recv_timeout);
  }
  // Row of each sequence in the base's sampled rows (LAST_TOKEN chunks, in chunk order).
  std::vector<std::pair<uint64_t, int32_t>> base_rows;
  for (const SequenceChunk& chunk : base->decoded.batch.chunks) {
    if (chunk.logits == LogitsMode::kLastToken) {
      base_rows.emplace_back(chunk.seq_id, static_cast<int32_t>(base_rows.size()));
    }
  }
  MicroBatch& batch = step.decoded.batch;
  std::vector<int64_t> ends(batch.chunks.size());
  int64_t offset = 0;
  for (size_t c = 0; c < batch.chunks.size(); ++c) ends[c] = offset += batch.chunks[c].num_tokens;
  for (int32_t c : plan.ahead_chunks()) {
    if (c < 0 || static_cast<size_t>(c) >= batch.chunks.size()) {
      return absl::InvalidArgumentError(fmt::format("micro-batch {}: ahead chunk {} of {}",
                                                    plan.micro_batch_id(), c, batch.chunks.size()));
    }
    const uint64_t seq = batch.chunks[c].seq_id;
    const auto found = std::find_if(base_rows.begin(), base_rows.end(),
                                    [&](const auto& entry) { return entry.first == seq; });
    if (found == base_rows.end()) {
      return absl::InvalidArgumentError(
          fmt::format("micro-batch {}: micro-batch {} sampled no token for sequence {}",
                      plan.micro_batch_id(), plan.tokens_from(), seq));
    }
    const int32_t row = static_cast<int32_t>(ends[c] - 1);
    batch.token_ids[row] = 0;  // a valid id until the device writes the sampled one
    feeds->push_back({.token_row = row, .sampled_row = found->second});
  }
  step.fed = true;
  if (fed_steps_++ == 0) {
    RS_LOG_INFO("stage {}: sampling left in flight, the next step's tokens fed on the device",
                options_.stage_index);
  }
  return absl::OkStatus();
}

absl::Status StepExecutor::SubmitChecked(PendingStep& step) {
  const v1::StepPlan& plan = step.plan;
  const uint64_t id = plan.micro_batch_id();
  SetActivity(ExecutorActivity::State::kComputing, id);
  RS_ASSIGN_OR_RETURN(step.decoded, DecodeStepPlan(plan, slice_->is_first(), slice_->is_last(),
                                                   slice_->options().kv_block_size));
  if (UsesTokenBackEdge(plan) && back_edge_ == nullptr) {
    return absl::FailedPreconditionError(
        "the plan uses the token back edge, and none is connected");
  }
  // Plan-ahead: stage 0 puts the tokens the last stage sent back into the decodes planned ahead.
  std::vector<TokenFeed> feeds;
  if (slice_->is_first() && back_edge_ != nullptr)
    RS_RETURN_IF_ERROR(TakeAheadTokens(step, &feeds));
  const MicroBatch& batch = step.decoded.batch;
  StepOutcome& outcome = step.outcome;
  outcome.num_tokens = static_cast<int>(batch.TotalTokens());

  // The slice prepares the batch (a GPU slice: uploads its metadata) before the input arrives
  // over a host channel (the upload overlaps the previous stage). Over a GPU channel it
  // prepares after the input's wait instead, so its GPU work for the step runs as one burst:
  // stages sharing a GPU then take turns once per step (measured on one H200, 4 stages at 32
  // streams: 89.3% of one stage against 86.0% with the upload first; bench/ring/NOTES.md).
  int64_t prepare_us = 0;
  auto prepare = [&]() -> absl::Status {
    SetActivity(ExecutorActivity::State::kComputing, id);
    const absl::Time start = absl::Now();
    absl::Status status = step.fed ? slice_->PrepareFed(batch, feeds) : slice_->Prepare(batch);
    prepare_us = MicrosSince(start);
    return status;
  };
  if (!prepare_after_input_) RS_RETURN_IF_ERROR(prepare());

  const absl::Time wait_start = absl::Now();
  if (options_.debug_stall_after_steps > 0 && timing_.steps >= options_.debug_stall_after_steps) {
    return DebugStall(id);
  }
  if (input_ != nullptr) {
    SetActivity(ExecutorActivity::State::kReceiving, id);
    // Sized here too for a batch not yet prepared (InvalidArgument above the buffer's capacity).
    RS_RETURN_IF_ERROR(slice_->activations().Resize(batch.TotalTokens()));
    RS_RETURN_IF_ERROR(input_->Receive(plan.micro_batch_id(), options_.recv_timeout));
    bytes_received_.store(input_->bytes_received());
  }
  outcome.wait_us = MicrosSince(wait_start);
  if (prepare_after_input_) RS_RETURN_IF_ERROR(prepare());

  SetActivity(ExecutorActivity::State::kComputing, id);
  slice_->BeginStepTiming();
  const absl::Time busy_start = absl::Now();
  if (options_.debug_step_delay > absl::ZeroDuration()) absl::SleepFor(options_.debug_step_delay);
  RS_RETURN_IF_ERROR(slice_->Run(batch));
  const int64_t run_us = MicrosSince(busy_start);
  bool deferred = false;
  if (output_ != nullptr) {
    const int64_t before = output_->bytes_sent();
    SetActivity(ExecutorActivity::State::kSending, id);
    RS_RETURN_IF_ERROR(output_->Send(plan.micro_batch_id(), options_.send_timeout));
    outcome.bytes_sent = output_->bytes_sent() - before;
    bytes_sent_.store(output_->bytes_sent());
  } else if (CanDefer(step)) {
    // At most kStepSamplingsAhead samplings wait; this one leaves the step in flight.
    if (samplings_in_flight_ >= kStepSamplingsAhead) {
      RS_RETURN_IF_ERROR(FinishSamplingsBefore(&step));
    }
    RS_RETURN_IF_ERROR(slice_->SampleAsync(batch, step.decoded.sampling));
    step.sampling_in_flight = true;
    ++samplings_in_flight_;
    deferred = true;
  } else {
    // Sampling here needs the slice's samplings collected first (in order).
    if (samplings_in_flight_ > 0) RS_RETURN_IF_ERROR(FinishSamplingsBefore(&step));
    RS_RETURN_IF_ERROR(SampleInto(step.decoded, &outcome));
    if (back_edge_ != nullptr) {
      SetActivity(ExecutorActivity::State::kSending, id);
      RS_RETURN_IF_ERROR(back_edge_->SendIfAsked(plan, outcome.tokens, options_.send_timeout));
    }
  }
  const int64_t cpu_us = MicrosSince(busy_start);
  slice_->EndStepTiming();
  if (!deferred) {
    outcome.busy_us = slice_->TakeStepMicros();
    timing_.busy_us += outcome.busy_us;
  }

  // A step whose sampling is in flight is still computing (on the device) until collected.
  if (!deferred) SetActivity(ExecutorActivity::State::kIdle, id);
  ++timing_.steps;
  timing_.prepare_us += prepare_us;
  timing_.wait_us += outcome.wait_us;
  timing_.forward_us += output_ != nullptr ? run_us : cpu_us;
  timing_.send_us += output_ != nullptr ? cpu_us - run_us : 0;
  const bool idle_before = step.idle_before_us >= 0;
  timing_.idle_steps += idle_before ? 1 : 0;
  timing_.idle_us += idle_before ? step.idle_before_us : 0;
  if (speculator_ != nullptr && Speculator::Applies(step.decoded)) {
    ++timing_.spec_steps;
    timing_.spec_forward_us += cpu_us;
    timing_.spec_busy_us += outcome.busy_us;
    timing_.spec_idle_steps += idle_before ? 1 : 0;
    timing_.spec_idle_us += idle_before ? step.idle_before_us : 0;
  }
  return absl::OkStatus();
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
  return TokensFromRows(decoded, sampled, outcome);
}

}  // namespace ringserve
