#include "coordinator/ring_engine.h"

#include <algorithm>
#include <limits>
#include <unordered_map>
#include <utility>

#include "common/logging.h"
#include "common/status_macros.h"
#include "coordinator/plan_ahead.h"
#include "coordinator/sampling_extras.h"
#include "fmt/format.h"
#include "ring/plan_codec.h"
#include "ring/sampling_config.h"

namespace ringserve {
namespace {

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

}  // namespace

struct RingEngine::Request {
  std::string id;
  uint64_t seq_id = 0;
  EventCallback callback;
  SamplingParams sampling;
  uint64_t seed = 0;
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> generated_ids;  // every token the client has been sent, in order
  bool want_prompt_logprobs = false;
  std::vector<float> prompt_logprobs;  // by target position - 1, filled as results arrive
  std::unique_ptr<TextStream> text;
  absl::Time submitted;
  std::optional<absl::Time> scheduled;
  std::optional<absl::Time> first_token;
  absl::Time last_token;
  double inter_token_sum_ms = 0;
  double inter_token_max_ms = 0;

  int generated() const { return static_cast<int>(generated_ids.size()); }
  int prompt_tokens() const { return static_cast<int>(prompt_ids.size()); }
};

RingEngine::RingEngine(RingEngineOptions options)
    : options_(std::move(options)),
      seed_rng_(std::random_device{}()),
      telemetry_(options_.stages) {}

int64_t RingEngine::NowUs() const { return absl::ToInt64Microseconds(absl::Now() - start_time_); }

absl::StatusOr<std::unique_ptr<RingEngine>> RingEngine::Start(RingEngineOptions options) {
  if (!options.form_ring) return absl::InvalidArgumentError("RingEngineOptions.form_ring: empty");
  std::unique_ptr<RingEngine> engine(new RingEngine(std::move(options)));
  RS_ASSIGN_OR_RETURN(FormedRing formed, engine->options_.form_ring(0));
  RS_RETURN_IF_ERROR(engine->OpenAndInstall(std::move(formed)));
  engine->engine_thread_ = std::thread([e = engine.get()] { e->EngineLoop(); });
  return engine;
}

absl::Status RingEngine::OpenAndInstall(FormedRing formed) {
  uint64_t generation;
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation = ++next_generation_;
  }
  auto push = [this, generation](LinkEvent event) {
    event.generation = generation;
    std::lock_guard<std::mutex> lock(mu_);
    link_events_.push_back(std::move(event));
    wake_ = true;
    cv_.notify_all();
  };
  // Outside mu_: the link calls its handlers under its own lock.
  absl::Status opened = formed.link->Open(
      {.on_result = [push](v1::StepResult result) { push({.result = std::move(result)}); },
       .on_failure = [push](absl::Status status) { push({.failure = std::move(status)}); }});
  if (!opened.ok()) {
    formed.link->Close(/*stop_stages=*/false);
    return opened;
  }
  std::vector<Delivery> out;
  absl::Status installed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    installed = InstallRingLocked(formed, generation, &out);
  }
  for (auto& [callback, event] : out) callback(event);
  // Outside mu_ (the lock order, ring_engine.h): a link that failed to install, or whatever
  // link it replaced. Closing waits for the link's lock and its stream readers, which may be
  // waiting for mu_ in `push` (a stream that ends meanwhile).
  if (formed.link) formed.link->Close(/*stop_stages=*/false);
  return installed;
}

absl::Status RingEngine::InstallRingLocked(FormedRing& formed, uint64_t generation,
                                           std::vector<Delivery>* out) {
  SchedulerOptions sched = options_.scheduler;
  sched.kv_num_blocks = formed.kv_num_blocks;
  RS_RETURN_IF_ERROR(Scheduler::Validate(sched));  // formed.link stays with the caller
  const bool reformed = scheduler_ != nullptr;
  if (reformed) telemetry_.CarrySchedulerCounters(scheduler_->Stats());
  scheduler_ = std::make_unique<Scheduler>(sched);
  kv_num_blocks_ = formed.kv_num_blocks;
  std::swap(link_, formed.link);  // the previous link (none: the ring was down) goes back
  generation_ = generation;
  ring_up_ = true;
  health_ = "serving";
  // Re-admit what was running or waiting, oldest first, each with the tokens it has generated.
  std::vector<uint64_t> ids;
  for (const auto& [seq, r] : requests_) ids.push_back(seq);
  std::sort(ids.begin(), ids.end());
  int resumed = 0;
  for (uint64_t seq : ids) {
    Request& r = *requests_.at(seq);
    if (r.generated() > 0) ++resumed;
    if (absl::Status admitted = AdmitLocked(r); !admitted.ok()) {
      FinishRequest(r, FinishReason::kError, admitted, out, {});
    }
  }
  if (reformed) {
    telemetry_.OnRingReformed(resumed);
    RS_LOG_INFO("ring re-formed (attempt {}); {} request(s) resumed, {} waiting", reform_attempt_,
                resumed, ids.size() - resumed);
  }
  telemetry_.SetAllLoadStatus("ready");
  wake_ = true;
  return absl::OkStatus();
}

absl::Status RingEngine::AdmitLocked(Request& r) {
  SequenceParams params{.max_tokens = r.sampling.max_tokens,
                        .stop_token_ids = r.sampling.stop_token_ids,
                        .ignore_eos = r.sampling.ignore_eos,
                        // Once a token went out, so did the prompt's log-probabilities.
                        .prompt_logprobs = r.want_prompt_logprobs && r.generated_ids.empty()};
  absl::Status added = scheduler_->AddRequest(r.seq_id, r.prompt_ids, params, r.generated_ids);
  if (!added.ok()) {
    return absl::Status(added.code(),
                        fmt::format("request {}: {}", r.id, std::string(added.message())));
  }
  return absl::OkStatus();
}

RingEngine::~RingEngine() { Shutdown(/*stop_stages=*/false); }

void RingEngine::Shutdown(bool stop_stages) {
  std::vector<Delivery> out;
  std::unique_ptr<RingLink> link;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return;
    shut_down_ = true;
    stop_ = true;
    cv_.notify_all();
  }
  if (engine_thread_.joinable()) engine_thread_.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    FailAll(absl::UnavailableError("the server is shutting down"), &out);
    stopped_ = true;
    ring_up_ = false;
    health_ = "shut down";
    link = std::move(link_);
  }
  for (auto& [callback, event] : out) callback(event);
  if (link) link->Close(stop_stages);
}

bool RingEngine::healthy() {
  std::lock_guard<std::mutex> lock(mu_);
  return ring_up_ && !stopped_;
}

std::string RingEngine::health_message() {
  std::lock_guard<std::mutex> lock(mu_);
  return health_;
}

bool RingEngine::stopped() {
  std::lock_guard<std::mutex> lock(mu_);
  return stopped_;
}

int RingEngine::kv_num_blocks() {
  std::lock_guard<std::mutex> lock(mu_);
  return kv_num_blocks_;
}

absl::Status RingEngine::Submit(GenerateRequest request, EventCallback on_event) {
  const SamplingParams& s = request.sampling;
  const std::string& id = request.request_id;
  const ModelConfig& model = options_.model;
  if (id.empty()) return absl::InvalidArgumentError("request_id: empty");
  if (request.prompt_ids.empty()) {
    return absl::InvalidArgumentError(fmt::format("request {}: prompt: empty", id));
  }
  for (size_t i = 0; i < request.prompt_ids.size(); ++i) {
    int32_t t = request.prompt_ids[i];
    if (t < 0 || t >= model.vocab_size) {
      return absl::InvalidArgumentError(fmt::format(
          "request {}: prompt token {} at position {} is outside the vocabulary [0, {})", id, t, i,
          model.vocab_size));
    }
  }
  SamplingConfig config{.temperature = s.temperature, .top_k = s.top_k, .top_p = s.top_p};
  if (absl::Status valid = ValidateSamplingConfig(config); !valid.ok()) {
    return absl::InvalidArgumentError(
        fmt::format("request {}: {}", id, std::string(valid.message())));
  }
  if (s.max_tokens < 1) {
    return absl::InvalidArgumentError(
        fmt::format("request {}: max_tokens: {} < 1", id, s.max_tokens));
  }
  if (absl::Status valid = ValidateSamplingExtras(s, model.vocab_size); !valid.ok()) {
    return absl::InvalidArgumentError(
        fmt::format("request {}: {}", id, std::string(valid.message())));
  }
  for (const std::string& stop : s.stop) {
    if (stop.empty())
      return absl::InvalidArgumentError(fmt::format("request {}: stop: empty string", id));
  }
  if (!s.stop.empty() && options_.tokenizer == nullptr) {
    return absl::InvalidArgumentError(fmt::format(
        "request {}: stop strings need a tokenizer, and {} has none", id, options_.model_id));
  }
  const int max_context = options_.scheduler.max_context;
  if (max_context > 0 && static_cast<int64_t>(request.prompt_ids.size()) >= max_context) {
    return absl::InvalidArgumentError(
        fmt::format("request {}: prompt of {} tokens leaves no room in the context of {}", id,
                    request.prompt_ids.size(), max_context));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) {
      return absl::UnavailableError(
          fmt::format("request {}: the ring is not serving: {}", id, health_));
    }
    if (seq_by_request_id_.count(id)) {
      return absl::InvalidArgumentError(
          fmt::format("request {}: request_id is already running", id));
    }
    if (!ring_up_ && !request.later_choice) {
      telemetry_.OnRejected();
      return absl::UnavailableError(fmt::format(
          "request {}: the ring is down and re-forming ({}); retry later", id, health_));
    }
    auto r = std::make_unique<Request>();
    r->id = id;
    r->seq_id = next_seq_id_++;
    r->callback = std::move(on_event);
    r->sampling = s;
    r->seed = s.seed.has_value() ? *s.seed : seed_rng_();
    r->prompt_ids = std::move(request.prompt_ids);
    r->want_prompt_logprobs = request.prompt_logprobs;
    if (request.prompt_logprobs) {
      r->prompt_logprobs.assign(r->prompt_ids.size() - 1, std::numeric_limits<float>::quiet_NaN());
    }
    r->text = std::make_unique<TextStream>(options_.tokenizer.get(), s.stop);
    r->submitted = absl::Now();
    if (ring_up_) RS_RETURN_IF_ERROR(AdmitLocked(*r));  // else admitted when the ring is back
    seq_by_request_id_[id] = r->seq_id;
    requests_[r->seq_id] = std::move(r);
    wake_ = true;
  }
  cv_.notify_all();
  return absl::OkStatus();
}

void RingEngine::Cancel(const std::string& request_id) {
  std::lock_guard<std::mutex> lock(mu_);
  cancels_.push_back(request_id);
  wake_ = true;
  cv_.notify_all();
}

absl::StatusOr<std::vector<int32_t>> RingEngine::Tokenize(const std::string& text,
                                                          bool add_special_tokens) {
  if (options_.tokenizer == nullptr) {
    return absl::FailedPreconditionError(
        fmt::format("{} has no tokenizer.json; send token ids", options_.model_id));
  }
  return options_.tokenizer->Encode(text, add_special_tokens);
}

std::string RingEngine::Detokenize(const std::vector<int32_t>& ids) {
  if (options_.tokenizer == nullptr) return "";
  return options_.tokenizer->Decode(ids, /*skip_special_tokens=*/false);
}

ModelInfo RingEngine::Info() {
  ModelInfo info;
  info.model_id = options_.model_id;
  info.architecture = ArchitectureName(options_.model.architecture);
  info.num_layers = options_.model.num_layers;
  info.vocab_size = options_.model.vocab_size;
  info.max_context = options_.model.max_position_embeddings;
  info.eos_token_ids = options_.scheduler.eos_token_ids;
  return info;
}

void RingEngine::EngineLoop() {
  while (true) {
    std::vector<Delivery> out;
    std::vector<std::pair<int, v1::StepPlan>> plans;
    std::unique_ptr<RingLink> failed_link;
    RingLink* link = nullptr;
    bool reform = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return wake_ || stop_; });
      if (stop_) return;
      wake_ = false;
      while (!link_events_.empty()) {
        LinkEvent event = std::move(link_events_.front());
        link_events_.pop_front();
        if (event.generation != generation_ || !ring_up_) continue;  // a ring already gone
        absl::Status status = event.failure;
        if (event.result) status = HandleResult(*event.result, &out);
        if (!status.ok()) failed_link = RingDownLocked(status, &out);
      }
      while (!cancels_.empty()) {
        std::string id = std::move(cancels_.front());
        cancels_.pop_front();
        auto it = seq_by_request_id_.find(id);
        if (it == seq_by_request_id_.end()) continue;
        Request& request = *requests_.at(it->second);
        if (scheduler_) scheduler_->Cancel(request.seq_id);
        FinishRequest(request, FinishReason::kCancelled, absl::OkStatus(), &out, {});
      }
      if (ring_up_) {
        plans = PlanLocked();
        link = link_.get();
      }
      reform = !ring_up_ && !stopped_;
    }
    // Plans first: the stages (and their GPUs) start the next step while the clients' events
    // are delivered.
    for (auto& [stage, plan] : plans) link->Send(stage, std::move(plan));
    for (auto& [callback, event] : out) callback(event);
    if (failed_link) failed_link->Close(/*stop_stages=*/false);
    if (reform) TryReform();
  }
}

void RingEngine::TryReform() {
  int attempt;
  {
    std::lock_guard<std::mutex> lock(mu_);
    attempt = ++reform_attempt_;
  }
  absl::StatusOr<FormedRing> formed = options_.form_ring(attempt);
  absl::Status status = formed.ok() ? OpenAndInstall(std::move(*formed)) : formed.status();
  std::unique_lock<std::mutex> lock(mu_);
  if (status.ok()) return;
  RS_LOG_WARN("re-forming the ring (attempt {}) failed: {}", attempt,
              std::string(status.message()));
  health_ =
      fmt::format("recovering: attempt {} failed: {}", attempt, std::string(status.message()));
  if (!requests_.empty() && absl::Now() - down_since_ >= options_.ring_down_timeout) {
    std::vector<Delivery> out;
    FailAll(
        absl::UnavailableError(fmt::format(
            "the ring has been down for {} (it failed: {}; re-forming it: {})",
            absl::FormatDuration(absl::Trunc(absl::Now() - down_since_, absl::Milliseconds(100))),
            down_reason_, std::string(status.message()))),
        &out);
    lock.unlock();
    for (auto& [callback, event] : out) callback(event);
    lock.lock();
  }
  cv_.wait_for(lock, absl::ToChronoMilliseconds(options_.reform_backoff), [&] { return stop_; });
  wake_ = true;  // try again
}

std::unique_ptr<RingLink> RingEngine::RingDownLocked(const absl::Status& status,
                                                     std::vector<Delivery>* out) {
  ring_up_ = false;
  down_since_ = absl::Now();
  down_reason_ = std::string(status.message());
  generation_ = 0;  // every queued event of the failed ring is stale now
  telemetry_.OnRingFailed();
  if (!options_.recover) {
    stopped_ = true;
    health_ = fmt::format("failed: {}", std::string(status.message()));
    RS_LOG_ERROR("ring failed: {}", std::string(status.message()));
    FailAll(status, out);
  } else {
    health_ = fmt::format("recovering: {}", std::string(status.message()));
    RS_LOG_WARN("ring failed, re-forming it: {}", std::string(status.message()));
  }
  return std::move(link_);
}

std::vector<std::pair<int, v1::StepPlan>> RingEngine::PlanLocked() {
  std::vector<std::pair<int, v1::StepPlan>> plans;
  const int num_stages = link_->num_stages();
  const absl::Time now = absl::Now();
  while (std::optional<MicroBatchPlan> plan = scheduler_->NextMicroBatch()) {
    std::vector<ChunkSamplingWire> sampling(plan->entries.size());
    for (size_t i = 0; i < plan->entries.size(); ++i) {
      const PlannedChunk& entry = plan->entries[i];
      sampling[i].speculation = entry.speculation;
      auto it = requests_.find(entry.seq_id);
      if (it == requests_.end()) continue;
      Request& r = *it->second;
      if (!r.scheduled) r.scheduled = now;
      sampling[i].config = SamplingConfig{.temperature = r.sampling.temperature,
                                          .top_k = r.sampling.top_k,
                                          .top_p = r.sampling.top_p,
                                          .seed = r.seed};
      sampling[i].token_index = entry.token_index;
      sampling[i].samples = entry.samples;
      sampling[i].score_token_ids = entry.score_token_ids;
      sampling[i].top_logprobs = TopLogprobsToAsk(r.sampling);
      sampling[i].suppress_token_ids =
          SuppressedTokenIds(r.sampling, options_.scheduler.eos_token_ids, entry.token_index);
    }
    for (int s = 0; s < num_stages; ++s) {
      plans.emplace_back(s, EncodeStepPlan(plan->id, plan->batch, sampling, s == 0,
                                           s == num_stages - 1, plan->released_speculation));
      if (scheduler_->options().plan_ahead) {
        AddPlanAheadFields(*plan, s == 0, s == num_stages - 1, &plans.back().second);
      }
    }
    telemetry_.OnPlanSent();
    RS_LOG_DEBUG("micro-batch {}: {} chunks, {} tokens, {} decodes", plan->id,
                 plan->batch.chunks.size(), plan->num_tokens(), plan->num_decodes());
  }
  return plans;
}

absl::Status RingEngine::HandleResult(const v1::StepResult& result, std::vector<Delivery>* out) {
  const int num_stages = link_->num_stages();
  const int index = result.stage_index();
  if (index < 0 || index >= num_stages) {
    return absl::InternalError(
        fmt::format("a step result names stage {} of {}", index, num_stages));
  }
  if (!result.error().empty()) {
    return absl::InternalError(fmt::format("stage {}: micro-batch {}: {}", index,
                                           result.micro_batch_id(), result.error()));
  }
  const int64_t now = NowUs();
  telemetry_.OnStepResult(result, now);
  if (index != num_stages - 1) return absl::OkStatus();

  for (const v1::PromptLogprobs& scores : result.prompt_logprobs()) StorePromptLogprobs(scores);
  std::vector<int32_t> tokens;
  tokens.reserve(result.tokens_size());
  std::vector<SpeculativeTokens> speculation;  // empty unless the stage speculated
  for (const auto& t : result.tokens()) {
    tokens.push_back(t.token_id());
    if (t.accepted_ids_size() > 0 || t.draft_ids_size() > 0) speculation.resize(tokens.size());
  }
  if (!speculation.empty()) {
    speculation.resize(tokens.size());
    for (int i = 0; i < result.tokens_size(); ++i) {
      const v1::SampledToken& t = result.tokens(i);
      speculation[i].accepted.assign(t.accepted_ids().begin(), t.accepted_ids().end());
      speculation[i].drafts.assign(t.draft_ids().begin(), t.draft_ids().end());
    }
  }
  absl::StatusOr<MicroBatchResult> done =
      scheduler_->OnMicroBatchDone(result.micro_batch_id(), tokens, speculation);
  if (!done.ok()) {
    return absl::InternalError(fmt::format("micro-batch {}: {}", result.micro_batch_id(),
                                           std::string(done.status().message())));
  }
  telemetry_.OnTokens(static_cast<int>(done->tokens.size()), now);
  std::unordered_map<uint64_t, const v1::SampledToken*> sampled;  // one token per sequence
  for (const auto& t : result.tokens()) sampled[t.seq_id()] = &t;
  for (const TokenUpdate& update : done->tokens) HandleToken(update, sampled[update.seq_id], out);
  return absl::OkStatus();
}

void RingEngine::StorePromptLogprobs(const v1::PromptLogprobs& scores) {
  auto it = requests_.find(scores.seq_id());
  if (it == requests_.end() || !it->second->want_prompt_logprobs) return;
  std::vector<float>& out = it->second->prompt_logprobs;
  // Entry i scores position start + 1 + i; a re-prefill after preemption repeats positions,
  // and positions past the prompt (generated tokens) are not reported.
  for (int i = 0; i < scores.logprobs_size(); ++i) {
    const int64_t slot = static_cast<int64_t>(scores.start_position()) + i;
    if (slot >= 0 && slot < static_cast<int64_t>(out.size())) out[slot] = scores.logprobs(i);
  }
}

void RingEngine::HandleToken(const TokenUpdate& update, const v1::SampledToken* sampled,
                             std::vector<Delivery>* out) {
  auto it = requests_.find(update.seq_id);
  if (it == requests_.end()) return;
  Request& r = *it->second;
  const absl::Time now = absl::Now();
  if (!r.first_token) {
    r.first_token = now;
  } else {
    double gap = Ms(now - r.last_token);
    r.inter_token_sum_ms += gap;
    r.inter_token_max_ms = std::max(r.inter_token_max_ms, gap);
  }
  r.last_token = now;
  r.generated_ids.push_back(update.token);
  telemetry_.OnGeneratedToken();

  const bool hidden = update.finish_reason == FinishReason::kStop;  // EOS / stop token id
  TextStream::Piece piece = r.text->Add(update.token, hidden);
  GenerateEvent event;
  if (r.want_prompt_logprobs && r.generated() == 1) event.prompt_logprobs = r.prompt_logprobs;
  event.token_ids.push_back(update.token);
  if (r.sampling.logprobs && sampled != nullptr)
    event.logprobs.push_back(ToTokenLogprobs(*sampled));
  event.text_delta = std::move(piece.text);
  if (piece.stopped) {
    scheduler_->Finish(r.seq_id);
    FinishRequest(r, FinishReason::kStop, absl::OkStatus(), out, std::move(event));
    return;
  }
  if (update.finish_reason != FinishReason::kNone) {
    TextStream::Piece tail = r.text->Finish();
    event.text_delta += tail.text;
    FinishRequest(r, tail.stopped ? FinishReason::kStop : update.finish_reason, absl::OkStatus(),
                  out, std::move(event));
    return;
  }
  event.usage = Usage{r.prompt_tokens(), r.generated()};
  out->emplace_back(r.callback, std::move(event));
}

void RingEngine::FinishRequest(Request& r, FinishReason reason, absl::Status error,
                               std::vector<Delivery>* out, GenerateEvent event) {
  event.finished = true;
  event.finish_reason = reason;
  event.usage = Usage{r.prompt_tokens(), r.generated()};
  event.error = std::move(error);

  const absl::Time now = absl::Now();
  RequestTiming timing;
  timing.request_id = r.id;
  timing.queue_ms = Ms((r.scheduled ? *r.scheduled : now) - r.submitted);
  timing.ttft_ms = r.first_token ? Ms(*r.first_token - r.submitted) : 0;
  timing.mean_inter_token_ms = r.generated() > 1 ? r.inter_token_sum_ms / (r.generated() - 1) : 0;
  timing.max_inter_token_ms = r.inter_token_max_ms;
  timing.prompt_tokens = r.prompt_tokens();
  timing.completion_tokens = r.generated();
  timing.finish_reason = reason;
  telemetry_.OnRequestFinished(timing, r.inter_token_sum_ms, r.first_token.has_value());

  out->emplace_back(std::move(r.callback), std::move(event));
  const uint64_t seq_id = r.seq_id;
  seq_by_request_id_.erase(r.id);
  requests_.erase(seq_id);  // destroys r
}

void RingEngine::FailAll(const absl::Status& status, std::vector<Delivery>* out) {
  std::vector<uint64_t> ids;
  for (const auto& [seq, r] : requests_) ids.push_back(seq);
  std::sort(ids.begin(), ids.end());
  for (uint64_t seq : ids) {
    Request& r = *requests_.at(seq);
    if (scheduler_) scheduler_->Cancel(seq);
    FinishRequest(r, FinishReason::kError,
                  absl::Status(status.code(),
                               fmt::format("request {}: {}", r.id, std::string(status.message()))),
                  out, {});
  }
}

RingStats RingEngine::Stats() {
  std::lock_guard<std::mutex> lock(mu_);
  return telemetry_.Snapshot(NowUs(), scheduler_ ? scheduler_->Stats() : SchedulerStats{},
                             kv_num_blocks_);
}

}  // namespace ringserve
