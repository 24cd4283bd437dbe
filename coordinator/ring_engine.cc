#include "coordinator/ring_engine.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "common/logging.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "stage/plan_proto.h"
#include "stage/sampling/sampler.h"

namespace ringserve {
namespace {

constexpr int64_t kSpanWindowUs = 5'000'000;    // recent spans and busy fractions
constexpr int64_t kTokenWindowUs = 10'000'000;  // tokens/s
constexpr size_t kMaxSpans = 4096;
constexpr size_t kMaxRecentRequests = 256;

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

}  // namespace

struct RingEngine::Request {
  std::string id;
  uint64_t seq_id = 0;
  EventCallback callback;
  SamplingParams sampling;
  uint64_t seed = 0;
  int prompt_tokens = 0;
  int generated = 0;
  std::unique_ptr<TextStream> text;
  absl::Time submitted;
  std::optional<absl::Time> scheduled;
  std::optional<absl::Time> first_token;
  absl::Time last_token;
  double inter_token_sum_ms = 0;
  double inter_token_max_ms = 0;
};

struct RingEngine::StageTrack {
  std::string endpoint;
  int first_layer = 0;
  int last_layer = 0;
  std::string load_status = "connecting";
  int in_flight = 0;
  int64_t steps = 0;
  int64_t bytes_sent = 0;
  std::deque<StageSpan> spans;                    // recent, oldest first
  std::deque<std::pair<int64_t, int64_t>> waits;  // (end us, wait us), recent
};

RingEngine::RingEngine(RingEngineOptions options)
    : options_(std::move(options)), seed_rng_(std::random_device{}()) {}

int64_t RingEngine::NowUs() const { return absl::ToInt64Microseconds(absl::Now() - start_time_); }

absl::StatusOr<std::unique_ptr<RingEngine>> RingEngine::Start(RingEngineOptions options) {
  RS_RETURN_IF_ERROR(ValidateRingConfig(options.ring));
  std::unique_ptr<RingEngine> engine(new RingEngine(std::move(options)));
  RS_RETURN_IF_ERROR(engine->Connect());
  engine->engine_thread_ = std::thread([e = engine.get()] { e->EngineLoop(); });
  return engine;
}

absl::Status RingEngine::Connect() {
  const RingConfig& ring = options_.ring;
  auto progress = [this](const std::string& line) {
    if (options_.on_progress) {
      options_.on_progress(line);
    } else {
      RS_LOG_INFO("{}", line);
    }
  };
  RS_ASSIGN_OR_RETURN(model_, LoadModelConfig(ring.model_dir));
  if (model_.num_layers != ring.num_layers) {
    return absl::InvalidArgumentError(fmt::format("{}: validated for {} layers, but {} has {}",
                                                  ring.source, ring.num_layers, ring.model_dir,
                                                  model_.num_layers));
  }
  if (std::filesystem::exists(std::filesystem::path(ring.model_dir) / "tokenizer.json")) {
    RS_ASSIGN_OR_RETURN(tokenizer_, Tokenizer::FromDirectory(ring.model_dir));
  } else {
    progress(fmt::format("{} has no tokenizer.json: token-id prompts only, no text output",
                         ring.model_dir));
  }

  // KV pool per stage: capacity is the minimum over stages (the scheduler's global view).
  // kv_blocks fixes it; kv_budget converts bytes with each stage's KV element size (fp32 on
  // the CPU, bf16 on CUDA); otherwise CUDA stages size their pools from memory (0 asks them
  // to) and CPU stages take the engine's default. The stages report what they hold.
  const int block_size = ring.scheduler.kv_block_size;
  std::vector<int> stage_kv_blocks(ring.num_stages());
  for (int i = 0; i < ring.num_stages(); ++i) {
    const StageConfig& stage = ring.stages[i];
    int blocks = options_.default_kv_blocks;
    if (stage.device.is_cuda()) blocks = 0;
    if (ring.scheduler.kv_blocks > 0) blocks = ring.scheduler.kv_blocks;
    if (ring.scheduler.kv_budget_bytes > 0) {
      const int64_t element_bytes = stage.device.is_cuda() ? 2 : 4;
      const int64_t block_bytes = static_cast<int64_t>(block_size) * 2 * model_.kv_size() *
                                  element_bytes * stage.num_layers();
      blocks = static_cast<int>(std::min<int64_t>(
          ring.scheduler.kv_budget_bytes / std::max<int64_t>(block_bytes, 1), 1 << 24));
      if (blocks < 1) {
        return absl::InvalidArgumentError(
            fmt::format("{}: scheduler.kv_budget: {} bytes hold no {}-byte KV block of stage {}",
                        ring.source, ring.scheduler.kv_budget_bytes, block_bytes, i));
      }
    }
    stage_kv_blocks[i] = blocks;
  }
  // Stages sharing one GPU split its memory.
  std::map<std::pair<std::string, int>, int> stages_per_gpu;
  for (const StageConfig& stage : ring.stages) {
    if (stage.device.is_cuda()) stages_per_gpu[{stage.host, stage.device.index}]++;
  }

  const int num_stages = ring.num_stages();
  for (int i = 0; i < num_stages; ++i) {
    auto track = std::make_unique<StageTrack>();
    track->endpoint = ring.stages[i].endpoint();
    track->first_layer = ring.stages[i].first_layer;
    track->last_layer = ring.stages[i].last_layer;
    tracks_.push_back(std::move(track));
  }

  // Connect, configure and join every stage, all stages at once at each step.
  auto parallel = [num_stages](const std::function<absl::Status(int)>& fn) {
    std::vector<absl::Status> statuses(num_stages);
    std::vector<std::thread> threads;
    for (int i = 0; i < num_stages; ++i) threads.emplace_back([&, i] { statuses[i] = fn(i); });
    for (auto& t : threads) t.join();
    for (const auto& s : statuses) RS_RETURN_IF_ERROR(s);
    return absl::OkStatus();
  };
  stages_.resize(num_stages);
  progress(fmt::format("connecting to {} stage(s) (waiting up to {} each)", num_stages,
                       absl::FormatDuration(options_.connect_timeout)));
  RS_ASSIGN_OR_RETURN(const ControlCredentials creds,
                      MakeControlCredentials(ring.ring_secret_file));
  RS_RETURN_IF_ERROR(parallel([&](int i) -> absl::Status {
    RS_ASSIGN_OR_RETURN(stages_[i], StageClient::Connect(i, ring.stages[i].endpoint(),
                                                         options_.connect_timeout, creds));
    return absl::OkStatus();
  }));

  std::vector<std::string> data_endpoints(num_stages);
  std::mutex progress_mu;
  RS_RETURN_IF_ERROR(parallel([&](int i) -> absl::Status {
    const StageConfig& stage = ring.stages[i];
    v1::ConfigureRequest request;
    request.set_stage_index(i);
    request.set_num_stages(num_stages);
    request.set_model_dir(ring.model_dir);
    request.set_first_layer(stage.first_layer);
    request.set_last_layer(stage.last_layer);
    request.set_device(stage.device.ToString());
    request.set_kv_block_size(block_size);
    request.set_kv_num_blocks(stage_kv_blocks[i]);
    request.set_max_batch_tokens(ring.scheduler.max_tokens_per_micro_batch);
    if (stage.device.is_cuda()) {
      request.set_memory_fraction(options_.gpu_memory_utilization /
                                  stages_per_gpu[{stage.host, stage.device.index}]);
    }
    request.set_channel(std::string(ChannelKindName(ring.channel)));
    request.set_data_host(stage.host == "localhost" ? "127.0.0.1" : stage.host);
    request.set_recv_timeout_ms(
        static_cast<int32_t>(absl::ToInt64Milliseconds(options_.step_timeout)));
    RS_ASSIGN_OR_RETURN(
        data_endpoints[i],
        stages_[i]->Configure(request, options_.configure_timeout, [&](const v1::LoadProgress& p) {
          std::lock_guard<std::mutex> lock(progress_mu);
          tracks_[i]->load_status = p.message();
          if (p.ready()) stage_kv_blocks[i] = p.kv_num_blocks();
          progress(fmt::format("stage {} ({}): {}", i, stage.endpoint(), p.message()));
        }));
    return absl::OkStatus();
  }));
  kv_num_blocks_ = *std::min_element(stage_kv_blocks.begin(), stage_kv_blocks.end());
  if (kv_num_blocks_ < 1) {
    return absl::ResourceExhaustedError(fmt::format(
        "{}: a stage reported an empty KV pool ({} blocks)", ring.source, kv_num_blocks_));
  }
  RS_RETURN_IF_ERROR(parallel([&](int i) -> absl::Status {
    v1::ConnectPeersRequest request;
    if (i > 0) request.set_prev_data_endpoint(data_endpoints[i]);
    if (i + 1 < num_stages) request.set_next_data_endpoint(data_endpoints[i + 1]);
    request.set_timeout_ms(
        static_cast<int32_t>(absl::ToInt64Milliseconds(options_.connect_timeout)));
    return stages_[i]->ConnectPeers(request, options_.connect_timeout + absl::Seconds(5));
  }));
  progress(fmt::format("ring of {} stage(s) connected ({} channel, {} KV blocks of {} per stage)",
                       num_stages, ChannelKindName(ring.channel), kv_num_blocks_, block_size));

  SchedulerOptions sched;
  sched.num_stages = num_stages;
  sched.max_micro_batches_in_flight = ring.effective_micro_batches_in_flight();
  sched.max_tokens_per_micro_batch = ring.scheduler.max_tokens_per_micro_batch;
  sched.kv_block_size = block_size;
  sched.kv_num_blocks = kv_num_blocks_;
  sched.max_context = model_.max_position_embeddings;
  sched.eos_token_ids = model_.eos_token_ids;
  if (sched.eos_token_ids.empty() && tokenizer_ && tokenizer_->eos_token_id()) {
    sched.eos_token_ids.push_back(*tokenizer_->eos_token_id());
  }
  sched.decode_packing = options_.decode_packing;
  RS_RETURN_IF_ERROR(Scheduler::Validate(sched));
  scheduler_ = std::make_unique<Scheduler>(sched);

  for (int i = 0; i < num_stages; ++i) {
    RS_RETURN_IF_ERROR(stages_[i]->StartSteps(
        [this](v1::StepResult result) {
          std::lock_guard<std::mutex> lock(mu_);
          results_.push_back(std::move(result));
          wake_ = true;
          cv_.notify_all();
        },
        [this](absl::Status status) {
          std::lock_guard<std::mutex> lock(mu_);
          if (shut_down_ && status.ok()) return;
          if (status.ok()) status = absl::UnavailableError("a stage closed its Steps stream");
          stage_errors_.push_back(status);
          wake_ = true;
          cv_.notify_all();
        }));
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& track : tracks_) track->load_status = "ready";
  health_ = "serving";
  return absl::OkStatus();
}

RingEngine::~RingEngine() { Shutdown(/*stop_stages=*/false); }

void RingEngine::Shutdown(bool stop_stages) {
  std::vector<Delivery> out;
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
    health_ = "shut down";
  }
  for (auto& [callback, event] : out) callback(event);
  for (auto& stage : stages_) {
    if (stage) stage->CloseSteps(absl::Seconds(5));
  }
  if (stop_stages) {
    for (auto& stage : stages_) {
      if (stage) (void)stage->Shutdown(absl::Seconds(2));
    }
  }
}

bool RingEngine::healthy() {
  std::lock_guard<std::mutex> lock(mu_);
  return !failed_ && !shut_down_;
}

std::string RingEngine::health_message() {
  std::lock_guard<std::mutex> lock(mu_);
  return health_;
}

absl::Status RingEngine::Submit(GenerateRequest request, EventCallback on_event) {
  const SamplingParams& s = request.sampling;
  const std::string& id = request.request_id;
  if (id.empty()) return absl::InvalidArgumentError("request_id: empty");
  if (request.prompt_ids.empty()) {
    return absl::InvalidArgumentError(fmt::format("request {}: prompt: empty", id));
  }
  for (size_t i = 0; i < request.prompt_ids.size(); ++i) {
    int32_t t = request.prompt_ids[i];
    if (t < 0 || t >= model_.vocab_size) {
      return absl::InvalidArgumentError(fmt::format(
          "request {}: prompt token {} at position {} is outside the vocabulary [0, {})", id, t, i,
          model_.vocab_size));
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
  for (const std::string& stop : s.stop) {
    if (stop.empty())
      return absl::InvalidArgumentError(fmt::format("request {}: stop: empty string", id));
  }
  if (!s.stop.empty() && tokenizer_ == nullptr) {
    return absl::InvalidArgumentError(fmt::format(
        "request {}: stop strings need a tokenizer, and {} has none", id, options_.ring.model_dir));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_ || shut_down_) {
      return absl::UnavailableError(
          fmt::format("request {}: the ring is not serving: {}", id, health_));
    }
    if (seq_by_request_id_.count(id)) {
      return absl::InvalidArgumentError(
          fmt::format("request {}: request_id is already running", id));
    }
    auto r = std::make_unique<Request>();
    r->id = id;
    r->seq_id = next_seq_id_++;
    r->callback = std::move(on_event);
    r->sampling = s;
    r->seed = s.seed.has_value() ? *s.seed : seed_rng_();
    r->prompt_tokens = static_cast<int>(request.prompt_ids.size());
    r->text = std::make_unique<TextStream>(tokenizer_.get(), s.stop);
    r->submitted = absl::Now();
    SequenceParams params{
        .max_tokens = s.max_tokens, .stop_token_ids = s.stop_token_ids, .ignore_eos = s.ignore_eos};
    absl::Status added = scheduler_->AddRequest(r->seq_id, std::move(request.prompt_ids), params);
    if (!added.ok()) {
      return absl::Status(added.code(),
                          fmt::format("request {}: {}", id, std::string(added.message())));
    }
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
  if (tokenizer_ == nullptr) {
    return absl::FailedPreconditionError(
        fmt::format("{} has no tokenizer.json; send token ids", options_.ring.model_dir));
  }
  return tokenizer_->Encode(text, add_special_tokens);
}

std::string RingEngine::Detokenize(const std::vector<int32_t>& ids) {
  if (tokenizer_ == nullptr) return "";
  return tokenizer_->Decode(ids, /*skip_special_tokens=*/false);
}

ModelInfo RingEngine::Info() {
  ModelInfo info;
  info.model_id = std::filesystem::path(options_.ring.model_dir).filename().string();
  if (info.model_id.empty()) info.model_id = options_.ring.model_dir;
  info.architecture = ArchitectureName(model_.architecture);
  info.num_layers = model_.num_layers;
  info.vocab_size = model_.vocab_size;
  info.max_context = model_.max_position_embeddings;
  info.eos_token_ids = scheduler_ ? scheduler_->options().eos_token_ids : model_.eos_token_ids;
  return info;
}

void RingEngine::EngineLoop() {
  while (true) {
    std::vector<Delivery> out;
    std::vector<std::pair<int, v1::StepPlan>> plans;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return wake_ || stop_; });
      if (stop_) return;
      wake_ = false;
      while (!stage_errors_.empty()) {
        absl::Status error = stage_errors_.front();
        stage_errors_.pop_front();
        if (!failed_) FailAll(error, &out);
      }
      while (!results_.empty()) {
        v1::StepResult result = std::move(results_.front());
        results_.pop_front();
        if (!failed_) HandleResult(result, &out);
      }
      while (!cancels_.empty()) {
        std::string id = std::move(cancels_.front());
        cancels_.pop_front();
        auto it = seq_by_request_id_.find(id);
        if (it == seq_by_request_id_.end()) continue;
        Request& request = *requests_.at(it->second);
        scheduler_->Cancel(request.seq_id);
        counters_.requests_cancelled++;
        FinishRequest(request, FinishReason::kCancelled, absl::OkStatus(), &out, {});
      }
      if (!failed_) plans = PlanLocked();
    }
    // Plans first: the stages (and their GPUs) start the next step while the clients' events
    // are delivered.
    for (auto& [stage, plan] : plans) stages_[stage]->SendPlan(std::move(plan));
    for (auto& [callback, event] : out) callback(event);
  }
}

std::vector<std::pair<int, v1::StepPlan>> RingEngine::PlanLocked() {
  std::vector<std::pair<int, v1::StepPlan>> plans;
  const int num_stages = static_cast<int>(stages_.size());
  const absl::Time now = absl::Now();
  while (std::optional<MicroBatchPlan> plan = scheduler_->NextMicroBatch()) {
    std::vector<ChunkSamplingWire> sampling(plan->entries.size());
    for (size_t i = 0; i < plan->entries.size(); ++i) {
      const PlannedChunk& entry = plan->entries[i];
      auto it = requests_.find(entry.seq_id);
      if (it == requests_.end()) continue;
      Request& r = *it->second;
      if (!r.scheduled) r.scheduled = now;
      sampling[i].config = SamplingConfig{.temperature = r.sampling.temperature,
                                          .top_k = r.sampling.top_k,
                                          .top_p = r.sampling.top_p,
                                          .seed = r.seed};
      sampling[i].token_index = entry.token_index;
    }
    for (int s = 0; s < num_stages; ++s) {
      plans.emplace_back(
          s, EncodeStepPlan(plan->id, plan->batch, sampling, s == 0, s == num_stages - 1));
      tracks_[s]->in_flight++;
    }
    plan_sent_us_[plan->id] = NowUs();
    RS_LOG_DEBUG("micro-batch {}: {} chunks, {} tokens, {} decodes", plan->id,
                 plan->batch.chunks.size(), plan->num_tokens(), plan->num_decodes());
  }
  return plans;
}

void RingEngine::HandleResult(const v1::StepResult& result, std::vector<Delivery>* out) {
  const int num_stages = static_cast<int>(stages_.size());
  const int index = result.stage_index();
  if (index < 0 || index >= num_stages) return;
  if (!result.error().empty()) {
    FailAll(absl::InternalError(result.error()), out);
    return;
  }
  StageTrack& track = *tracks_[index];
  const int64_t now = NowUs();
  track.in_flight = std::max(0, track.in_flight - 1);
  track.steps++;
  track.bytes_sent += result.bytes_sent();
  // The stage reports durations on its own clock; place the span so it ends now.
  StageSpan span{.micro_batch_id = result.micro_batch_id(),
                 .stage_index = index,
                 .start_us = now - result.busy_us(),
                 .end_us = now,
                 .num_tokens = result.num_tokens()};
  track.spans.push_back(span);
  track.waits.emplace_back(now, result.wait_us());
  while (!track.spans.empty() &&
         (track.spans.front().end_us < now - kSpanWindowUs || track.spans.size() > kMaxSpans)) {
    track.spans.pop_front();
  }
  while (!track.waits.empty() && track.waits.front().first < now - kSpanWindowUs) {
    track.waits.pop_front();
  }
  if (index != num_stages - 1) return;

  plan_sent_us_.erase(result.micro_batch_id());
  std::vector<int32_t> tokens;
  tokens.reserve(result.tokens_size());
  for (const auto& t : result.tokens()) tokens.push_back(t.token_id());
  absl::StatusOr<MicroBatchResult> done =
      scheduler_->OnMicroBatchDone(result.micro_batch_id(), tokens);
  if (!done.ok()) {
    FailAll(absl::InternalError(fmt::format("micro-batch {}: {}", result.micro_batch_id(),
                                            std::string(done.status().message()))),
            out);
    return;
  }
  recent_tokens_.emplace_back(now, static_cast<int>(done->tokens.size()));
  for (const TokenUpdate& update : done->tokens) HandleToken(update, out);
}

void RingEngine::HandleToken(const TokenUpdate& update, std::vector<Delivery>* out) {
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
  r.generated++;
  counters_.generated_tokens++;

  const bool hidden = update.finish_reason == FinishReason::kStop;  // EOS / stop token id
  TextStream::Piece piece = r.text->Add(update.token, hidden);
  GenerateEvent event;
  event.token_ids.push_back(update.token);
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
  event.usage = Usage{r.prompt_tokens, r.generated};
  out->emplace_back(r.callback, std::move(event));
}

void RingEngine::FinishRequest(Request& r, FinishReason reason, absl::Status error,
                               std::vector<Delivery>* out, GenerateEvent event) {
  event.finished = true;
  event.finish_reason = reason;
  event.usage = Usage{r.prompt_tokens, r.generated};
  event.error = std::move(error);
  if (reason == FinishReason::kError) {
    counters_.requests_failed++;
  } else if (reason != FinishReason::kCancelled) {
    counters_.requests_finished++;
  }
  counters_.prompt_tokens += r.prompt_tokens;

  const absl::Time now = absl::Now();
  RequestTiming timing;
  timing.request_id = r.id;
  timing.queue_ms = Ms((r.scheduled ? *r.scheduled : now) - r.submitted);
  timing.ttft_ms = r.first_token ? Ms(*r.first_token - r.submitted) : 0;
  timing.mean_inter_token_ms = r.generated > 1 ? r.inter_token_sum_ms / (r.generated - 1) : 0;
  timing.max_inter_token_ms = r.inter_token_max_ms;
  timing.prompt_tokens = r.prompt_tokens;
  timing.completion_tokens = r.generated;
  timing.finish_reason = reason;
  sum_queue_ms_ += timing.queue_ms;
  if (r.first_token) {
    sum_ttft_ms_ += timing.ttft_ms;
    timed_requests_++;
  }
  if (r.generated > 1) {
    sum_inter_token_ms_ += r.inter_token_sum_ms;
    inter_token_samples_ += r.generated - 1;
  }
  recent_requests_.push_back(std::move(timing));
  if (recent_requests_.size() > kMaxRecentRequests) recent_requests_.pop_front();

  out->emplace_back(std::move(r.callback), std::move(event));
  const uint64_t seq_id = r.seq_id;
  seq_by_request_id_.erase(r.id);
  requests_.erase(seq_id);  // destroys r
}

void RingEngine::FailAll(const absl::Status& status, std::vector<Delivery>* out) {
  if (!shut_down_) {
    failed_ = true;
    health_ = fmt::format("failed: {}", std::string(status.message()));
    RS_LOG_ERROR("ring failed: {}", std::string(status.message()));
  }
  std::vector<uint64_t> ids;
  for (const auto& [seq, r] : requests_) ids.push_back(seq);
  std::sort(ids.begin(), ids.end());
  for (uint64_t seq : ids) {
    Request& r = *requests_.at(seq);
    scheduler_->Cancel(seq);
    FinishRequest(r, FinishReason::kError,
                  absl::Status(status.code(),
                               fmt::format("request {}: {}", r.id, std::string(status.message()))),
                  out, {});
  }
}

RingStats RingEngine::Stats() {
  std::lock_guard<std::mutex> lock(mu_);
  RingStats stats;
  const int64_t now = NowUs();
  const int64_t window = std::min<int64_t>(kSpanWindowUs, std::max<int64_t>(now, 1));
  SchedulerStats sched = scheduler_ ? scheduler_->Stats() : SchedulerStats{};
  for (size_t i = 0; i < tracks_.size(); ++i) {
    const StageTrack& t = *tracks_[i];
    StageStats s;
    s.index = static_cast<int>(i);
    s.endpoint = t.endpoint;
    s.first_layer = t.first_layer;
    s.last_layer = t.last_layer;
    int64_t busy = 0;
    int n = 0;
    for (const StageSpan& span : t.spans) {
      if (span.end_us < now - window) continue;
      busy += span.end_us - std::max(span.start_us, now - window);
      ++n;
    }
    s.busy_fraction = std::min(1.0, static_cast<double>(busy) / static_cast<double>(window));
    s.mean_step_ms = n > 0 ? static_cast<double>(busy) / n / 1000.0 : 0;
    int64_t wait = 0;
    for (const auto& [end, w] : t.waits) wait += w;
    s.mean_wait_ms = t.waits.empty() ? 0 : static_cast<double>(wait) / t.waits.size() / 1000.0;
    s.micro_batches_in_flight = t.in_flight;
    s.kv_blocks_used = sched.kv_blocks_used;
    s.kv_blocks_total = kv_num_blocks_;
    s.bytes_sent = t.bytes_sent;
    s.load_status = t.load_status;
    s.steps = t.steps;
    stats.stages.push_back(std::move(s));
    for (const StageSpan& span : t.spans) stats.recent_spans.push_back(span);
  }
  std::sort(stats.recent_spans.begin(), stats.recent_spans.end(),
            [](const StageSpan& a, const StageSpan& b) { return a.start_us < b.start_us; });
  stats.requests = counters_;
  stats.requests.queue_depth = sched.waiting;
  stats.requests.running = sched.running;
  stats.requests.micro_batches_in_flight = sched.micro_batches_in_flight;
  stats.requests.preemptions = sched.preemptions;
  while (!recent_tokens_.empty() && recent_tokens_.front().first < now - kTokenWindowUs) {
    recent_tokens_.pop_front();
  }
  int64_t tokens = 0;
  for (const auto& [t, n] : recent_tokens_) tokens += n;
  const int64_t token_window = std::min<int64_t>(kTokenWindowUs, std::max<int64_t>(now, 1));
  stats.requests.tokens_per_second = static_cast<double>(tokens) * 1e6 / token_window;
  const int64_t finished = static_cast<int64_t>(
      counters_.requests_finished + counters_.requests_failed + counters_.requests_cancelled);
  stats.requests.mean_queue_ms = finished > 0 ? sum_queue_ms_ / finished : 0;
  stats.requests.mean_ttft_ms = timed_requests_ > 0 ? sum_ttft_ms_ / timed_requests_ : 0;
  stats.requests.mean_inter_token_ms =
      inter_token_samples_ > 0 ? sum_inter_token_ms_ / inter_token_samples_ : 0;
  stats.recent_requests.assign(recent_requests_.begin(), recent_requests_.end());
  return stats;
}

}  // namespace ringserve
