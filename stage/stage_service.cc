#include "stage/stage_service.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "common/logging.h"
#include "fmt/format.h"
#include "proto/grpc_status.h"
#include "stage/speculative/load_speculator.h"
#include "stage/stage_backend.h"

namespace ringserve {
namespace {

grpc::Status Invalid(const std::string& message) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message);
}

// Field checks of a ConfigureRequest that need no model; errors name the field.
grpc::Status CheckConfigureRequest(const v1::ConfigureRequest& r) {
  if (r.num_stages() < 1) return Invalid(fmt::format("num_stages: {} < 1", r.num_stages()));
  if (r.stage_index() < 0 || r.stage_index() >= r.num_stages()) {
    return Invalid(
        fmt::format("stage_index: {} is not in [0, {})", r.stage_index(), r.num_stages()));
  }
  if (r.model_dir().empty()) return Invalid("model_dir: empty");
  if (r.first_layer() < 0 || r.last_layer() <= r.first_layer()) {
    return Invalid(
        fmt::format("layers: [{}, {}) is not a non-empty range", r.first_layer(), r.last_layer()));
  }
  if (r.kv_block_size() < 1)
    return Invalid(fmt::format("kv_block_size: {} < 1", r.kv_block_size()));
  if (r.kv_num_blocks() < 0) {
    return Invalid(fmt::format("kv_num_blocks: {} < 0", r.kv_num_blocks()));
  }
  if (r.max_batch_tokens() < 0) {
    return Invalid(fmt::format("max_batch_tokens: {} < 0", r.max_batch_tokens()));
  }
  if (!(r.memory_fraction() >= 0 && r.memory_fraction() <= 1)) {
    return Invalid(fmt::format("memory_fraction: {} is not in [0, 1]", r.memory_fraction()));
  }
  if (auto dtype = ParseKvCacheDtype(r.kv_cache_dtype(), "kv_cache_dtype"); !dtype.ok()) {
    return ToGrpcStatus(dtype.status());
  }
  if (absl::Status backend = CheckBackend(r); !backend.ok()) return ToGrpcStatus(backend);
  if (r.data_port() < 0 || r.data_port() > 65535) {
    return Invalid(fmt::format("data_port: {} is not in [0, 65535]", r.data_port()));
  }
  return grpc::Status::OK;
}

}  // namespace

// Whether `model_dir` (resolved) lies under `root` (resolved). InvalidArgument naming both
// otherwise.
absl::Status CheckModelRoot(const std::string& model_dir, const std::string& root) {
  if (root.empty()) return absl::OkStatus();
  std::error_code error;
  std::filesystem::path dir = std::filesystem::weakly_canonical(model_dir, error);
  std::filesystem::path allowed = std::filesystem::weakly_canonical(root, error);
  auto [end, unused] = std::mismatch(allowed.begin(), allowed.end(), dir.begin(), dir.end());
  if (error || end != allowed.end()) {
    return absl::PermissionDeniedError(
        fmt::format("model_dir: {} is outside this stage's model root {} (stage --model_root)",
                    model_dir, root));
  }
  return absl::OkStatus();
}

StageService::StageService(StageServiceOptions options)
    : options_(std::move(options)), auth_(options_.secret) {}

absl::StatusOr<std::string> StageService::Caller(const grpc::ServerContext& context,
                                                 bool owner_only) {
  absl::StatusOr<std::string> caller = auth_.Authenticate(context);
  if (!caller.ok()) {
    RS_LOG_WARN("refused a control call from {}: {}", context.peer(),
                std::string(caller.status().message()));
    return caller.status();
  }
  if (owner_only) {
    if (absl::Status owner = auth_.CheckOwner(*caller); !owner.ok()) {
      RS_LOG_WARN("refused a control call from {}: {}", context.peer(),
                  std::string(owner.message()));
      return owner;
    }
  }
  return caller;
}

grpc::Status StageService::Challenge(grpc::ServerContext*, const v1::ChallengeRequest*,
                                     v1::ChallengeResponse* response) {
  response->set_secret_required(auth_.secret_required());
  if (auth_.secret_required()) response->set_nonce(auth_.IssueNonce());
  return grpc::Status::OK;
}

StageService::~StageService() = default;

void StageService::SetStatus(const std::string& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = status;
  }
  RS_LOG_INFO("{}", status);
  if (options_.on_status) options_.on_status(status);
}

void StageService::ResetLocked() {
  executor_.reset();
  slice_.reset();
  listener_.reset();
}

grpc::Status StageService::Configure(grpc::ServerContext* context,
                                     const v1::ConfigureRequest* request,
                                     grpc::ServerWriter<v1::LoadProgress>* writer) {
  absl::StatusOr<std::string> caller = Caller(*context, /*owner_only=*/true);
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  grpc::Status check = CheckConfigureRequest(*request);
  if (!check.ok()) return check;
  if (absl::Status root = CheckModelRoot(request->model_dir(), options_.model_root); !root.ok()) {
    return ToGrpcStatus(root);
  }
  if (!request->speculative_model_dir().empty()) {
    absl::Status root = CheckModelRoot(request->speculative_model_dir(), options_.model_root);
    if (!root.ok()) return ToGrpcStatus(root);
  }
  std::string data_endpoint;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (configuring_ || steps_active_) {
      return grpc::Status(
          grpc::StatusCode::FAILED_PRECONDITION,
          steps_active_ ? "stage is running a Steps stream" : "stage is already being configured");
    }
    if (absl::Status claimed = auth_.Claim(*caller); !claimed.ok()) return ToGrpcStatus(claimed);
    configuring_ = true;
    ResetLocked();
    config_ = *request;
    status_ = "configuring";
  }
  InitLogging("stage", request->stage_index());
  auto finish = [&](grpc::Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    configuring_ = false;
    if (!status.ok()) {
      ResetLocked();
      auth_.Release();
      status_ = "failed: " + status.error_message();
    }
    return status;
  };

  // The previous stage connects to us; bind first so the coordinator learns the endpoint.
  std::unique_ptr<TcpListener> listener;
  // Stage 0 of a ring of several listens too: the last stage's token back edge comes there.
  if (request->stage_index() > 0 || request->num_stages() > 1) {
    auto bound = TcpListener::Listen(options_.bind_host, request->data_port(),
                                     options_.secret ? &*options_.secret : nullptr);
    if (!bound.ok()) return finish(ToGrpcStatus(bound.status()));
    listener = std::move(*bound);
    int port = 0;
    std::string ignored_host;
    (void)SplitHostPort(listener->endpoint(), "data endpoint", &ignored_host, &port);
    std::string host = request->data_host().empty() ? options_.bind_host : request->data_host();
    data_endpoint = fmt::format("{}:{}", host, port);
  }
  v1::LoadProgress progress;
  progress.set_phase("binding");
  progress.set_data_endpoint(data_endpoint);
  progress.set_message(data_endpoint.empty() ? "first stage: no activation listener"
                                             : "activations in on " + data_endpoint);
  writer->Write(progress);

  std::string what = fmt::format(
      "stage {}/{}: loading layers [{}, {}) of {}", request->stage_index(), request->num_stages(),
      request->first_layer(), request->last_layer(), request->model_dir());
  SetStatus(what);
  progress.set_phase("loading");
  progress.set_message(what);
  progress.set_done(0);
  progress.set_total(1);
  writer->Write(progress);

  absl::Time start = absl::Now();
  std::string summary;
  // A request the loader cannot satisfy (e.g. 2^30 KV blocks: bad_alloc) must fail this call
  // and leave the stage configurable, not escape and leave it "configuring" forever.
  absl::StatusOr<std::unique_ptr<ModelSlice>> slice =
      absl::InternalError("loading the slice did not finish");
  try {
    v1::ConfigureRequest effective = *request;
    if (effective.kv_cache_dtype().empty()) {
      effective.set_kv_cache_dtype(std::string(KvCacheDtypeName(options_.kv_cache_dtype)));
    }
    slice = LoadStageSlice(effective, &summary);
  } catch (const std::bad_alloc&) {
    slice = absl::ResourceExhaustedError(
        fmt::format("stage {}: out of memory loading layers [{}, {}) with {} KV blocks of {}",
                    request->stage_index(), request->first_layer(), request->last_layer(),
                    request->kv_num_blocks(), request->kv_block_size()));
  } catch (const std::exception& e) {
    slice = absl::InternalError(
        fmt::format("stage {}: loading failed: {}", request->stage_index(), e.what()));
  }
  if (!slice.ok()) return finish(ToGrpcStatus(slice.status()));
  const bool want_first = request->stage_index() == 0;
  const bool want_last = request->stage_index() == request->num_stages() - 1;
  if ((*slice)->is_first() != want_first || (*slice)->is_last() != want_last) {
    return finish(Invalid(fmt::format(
        "layers: [{}, {}) of a {}-layer model do not fit stage {} of {} (the first stage starts "
        "at layer 0, the last ends at layer {})",
        request->first_layer(), request->last_layer(), (*slice)->config().num_layers,
        request->stage_index(), request->num_stages(), (*slice)->config().num_layers)));
  }
  // The last stage's draft model (speculative decoding), loaded with the slice.
  absl::StatusOr<std::unique_ptr<Speculator>> speculator = LoadSpeculator(*request, **slice);
  if (!speculator.ok()) return finish(ToGrpcStatus(speculator.status()));
  std::string ready =
      fmt::format("stage {}/{}: ready, layers [{}, {}) loaded in {:.2f} s ({})",
                  request->stage_index(), request->num_stages(), request->first_layer(),
                  request->last_layer(), absl::ToDoubleSeconds(absl::Now() - start), summary);
  const int kv_num_blocks = (*slice)->options().kv_num_blocks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    slice_ = std::move(*slice);
    speculator_ = std::move(*speculator);
    listener_ = std::move(listener);
  }
  SetStatus(ready);
  progress.set_phase("ready");
  progress.set_message(ready);
  progress.set_done(1);
  progress.set_ready(true);
  progress.set_kv_num_blocks(kv_num_blocks);
  writer->Write(progress);
  if (options_.on_ready) options_.on_ready(ready);
  return finish(grpc::Status::OK);
}

grpc::Status StageService::ConnectPeers(grpc::ServerContext* context,
                                        const v1::ConnectPeersRequest* request,
                                        v1::ConnectPeersResponse*) {
  if (absl::StatusOr<std::string> caller = Caller(*context, /*owner_only=*/true); !caller.ok()) {
    return ToGrpcStatus(caller.status());
  }
  std::unique_ptr<ModelSlice> slice;
  std::unique_ptr<Speculator> speculator;
  std::unique_ptr<TcpListener> listener;
  v1::ConfigureRequest config;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (slice_ == nullptr) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          executor_ ? "peers are already connected" : "stage is not configured");
    }
    slice = std::move(slice_);
    speculator = std::move(speculator_);
    listener = std::move(listener_);
    config = config_;
  }
  const int index = config.stage_index();
  const bool first = index == 0;
  const bool last = index == config.num_stages() - 1;
  absl::Duration timeout =
      absl::Milliseconds(request->timeout_ms() > 0 ? request->timeout_ms() : 30000);
  auto fail = [&](const absl::Status& status) {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = "failed: " + std::string(status.message());
    RS_LOG_ERROR("{}", status_);
    return ToGrpcStatus(status);
  };
  if (!first && request->prev_data_endpoint().empty()) {
    return fail(
        absl::InvalidArgumentError("prev_data_endpoint: empty on a stage that is not first"));
  }
  if (!last && request->next_data_endpoint().empty()) {
    return fail(
        absl::InvalidArgumentError("next_data_endpoint: empty on a stage that is not last"));
  }

  auto channels =
      ConnectStageChannels(config, *slice, listener.get(), request->next_data_endpoint(), timeout,
                           options_.secret ? &*options_.secret : nullptr);
  if (!channels.ok()) return fail(channels.status());
  std::unique_ptr<TokenBackEdge> back_edge;
  if (request->token_back_edge()) {
    auto edge = ConnectTokenBackEdge(index, config.num_stages(), listener.get(),
                                     request->first_data_endpoint(), timeout,
                                     options_.secret ? &*options_.secret : nullptr);
    if (!edge.ok()) return fail(edge.status());
    back_edge = *std::move(edge);
  }

  StepExecutorOptions executor_options;
  executor_options.stage_index = index;
  executor_options.debug_step_delay = options_.debug_step_delay;
  executor_options.debug_stall_after_steps = options_.debug_stall_after_steps;
  const char* in_flight = std::getenv("RINGSERVE_SAMPLING_IN_FLIGHT");
  executor_options.sampling_in_flight = in_flight == nullptr || std::string(in_flight) != "0";
  if (config.recv_timeout_ms() > 0) {
    executor_options.recv_timeout = absl::Milliseconds(config.recv_timeout_ms());
    executor_options.send_timeout = executor_options.recv_timeout;
    step_limit_us_.store(int64_t{config.recv_timeout_ms()} * 1000 + 60'000'000);
  }
  absl::StatusOr<std::unique_ptr<StepExecutor>> created =
      StepExecutor::Create(executor_options, std::move(slice), std::move(*channels));
  if (!created.ok()) return fail(created.status());
  (*created)->AttachTokenBackEdge(std::move(back_edge));
  if (speculator != nullptr) (*created)->SetSpeculator(std::move(speculator));
  std::shared_ptr<StepExecutor> executor = *std::move(created);
  {
    std::lock_guard<std::mutex> lock(mu_);
    executor_ = std::move(executor);
    status_ = fmt::format("stage {}/{}: ready, connected", index, config.num_stages());
  }
  RS_LOG_INFO("connected: prev {}, next {}", first ? "-" : request->prev_data_endpoint(),
              last ? "-" : request->next_data_endpoint());
  return grpc::Status::OK;
}

grpc::Status StageService::Steps(grpc::ServerContext* context,
                                 grpc::ServerReaderWriter<v1::StepResult, v1::StepPlan>* stream) {
  if (absl::StatusOr<std::string> caller = Caller(*context, /*owner_only=*/true); !caller.ok()) {
    return ToGrpcStatus(caller.status());
  }
  std::shared_ptr<StepExecutor> executor;
  int index = 0;
  absl::Duration activity_interval = absl::ZeroDuration();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (executor_ == nullptr || steps_active_) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          steps_active_ ? "a Steps stream is already running"
                                        : "stage is not configured and connected");
    }
    steps_active_ = true;
    executor = executor_;
    index = config_.stage_index();
    activity_interval = absl::Milliseconds(config_.activity_interval_ms());
  }
  // Results (worker) and activity reports (reporter) share the stream: one Write at a time.
  std::mutex write_mu;
  auto write = [&](const v1::StepResult& result) {
    std::lock_guard<std::mutex> lock(write_mu);
    return stream->Write(result);
  };

  // The handler thread reads plans into a queue; the worker submits them in order and writes
  // their results, so a long step never stops plans from being received. A step may finish
  // after the next one was submitted (StepExecutor::Submit: the one-stage ring with plans sent
  // ahead): with a step in flight the worker takes the next plan as soon as it arrives, and
  // checks every kFinishPoll whether the step's tokens are there. After a failed step the
  // worker writes the results of the steps before it, then one carrying the error, and stops;
  // the handler returns once the coordinator closes its side (it does on seeing the error) or
  // sends another plan.
  constexpr auto kFinishPoll = std::chrono::microseconds(50);
  std::mutex queue_mu;
  std::condition_variable queue_cv;
  std::deque<v1::StepPlan> queue;
  bool reading_done = false;
  std::string error;
  std::thread worker([&] {
    // Writes one step's result; false when the worker must stop (after an error).
    auto write_result = [&](uint64_t micro_batch_id, absl::StatusOr<StepOutcome> outcome) {
      v1::StepResult result;
      result.set_micro_batch_id(micro_batch_id);
      result.set_stage_index(index);
      in_flight_.fetch_sub(1);
      if (!outcome.ok()) {
        std::string message(outcome.status().message());
        if (absl::IsCancelled(outcome.status())) {
          RS_LOG_INFO("{}", message);  // aborted: the ring ended while the step waited
        } else {
          RS_LOG_ERROR("{}", message);
        }
        result.set_error(message);
        write(result);
        std::lock_guard<std::mutex> lock(queue_mu);
        error = message;
        in_flight_.fetch_sub(static_cast<int>(queue.size()));
        queue.clear();
        return false;
      }
      for (auto& token : outcome->tokens) *result.add_tokens() = std::move(token);
      for (auto& scores : outcome->prompt_logprobs) {
        *result.add_prompt_logprobs() = std::move(scores);
      }
      result.set_busy_us(outcome->busy_us);
      result.set_wait_us(outcome->wait_us);
      result.set_bytes_sent(outcome->bytes_sent);
      result.set_num_tokens(outcome->num_tokens);
      busy_us_.fetch_add(outcome->busy_us);
      steps_.fetch_add(1);
      bytes_sent_.store(executor->bytes_sent());
      bytes_received_.store(executor->bytes_received());
      if (!write(result)) {
        std::lock_guard<std::mutex> lock(queue_mu);
        error = "the coordinator went away";
        in_flight_.fetch_sub(static_cast<int>(queue.size()));
        queue.clear();
        return false;
      }
      return true;
    };
    // The oldest step's result (blocking until its tokens are there).
    auto finish_oldest = [&] {
      step_started_us_.store(absl::ToUnixMicros(absl::Now()));
      const uint64_t id = executor->oldest_micro_batch_id();
      absl::StatusOr<StepOutcome> outcome = executor->FinishOldest();
      step_started_us_.store(executor->steps_in_flight() > 0 ? absl::ToUnixMicros(absl::Now()) : 0);
      return write_result(id, std::move(outcome));
    };
    while (true) {
      std::optional<v1::StepPlan> plan;
      bool input_done = false;
      {
        std::unique_lock<std::mutex> lock(queue_mu);
        auto ready = [&] { return !queue.empty() || reading_done; };
        if (executor->steps_in_flight() == 0) {
          queue_cv.wait(lock, ready);
        } else {
          queue_cv.wait_for(lock, kFinishPoll, ready);
        }
        if (!queue.empty()) {
          plan = std::move(queue.front());
          queue.pop_front();
        }
        input_done = reading_done && queue.empty();
      }
      if (plan.has_value()) {
        const uint64_t id = plan->micro_batch_id();
        step_started_us_.store(absl::ToUnixMicros(absl::Now()));
        const absl::Status submitted = executor->Submit(*std::move(plan));
        if (!submitted.ok()) {
          // The steps before it keep their order, then the error.
          while (executor->steps_in_flight() > 0) {
            if (!finish_oldest()) return;
          }
          write_result(id, submitted);
          return;
        }
      }
      // Results in plan order: every step but the newest at once (the newest keeps the device
      // busy meanwhile), the newest when its tokens are there or no plan can follow.
      while (executor->steps_in_flight() > 1 ||
             (executor->steps_in_flight() == 1 && (executor->OldestFinishes() || input_done))) {
        if (!finish_oldest()) return;
      }
      if (input_done && executor->steps_in_flight() == 0) return;
    }
  });

  // Activity reports (ConfigureRequest.activity_interval_ms): one at once, then one per
  // interval, until the stream ends.
  std::mutex report_mu;
  std::condition_variable report_cv;
  bool reporting_done = false;
  std::thread reporter;
  if (activity_interval > absl::ZeroDuration()) {
    reporter = std::thread([&] {
      std::unique_lock<std::mutex> lock(report_mu);
      do {
        const ExecutorActivity now = executor->Activity();
        v1::StepResult report;
        report.set_stage_index(index);
        v1::StageActivity* activity = report.mutable_activity();
        activity->set_state(static_cast<v1::StageActivity::State>(now.state));
        activity->set_micro_batch_id(now.micro_batch_id);
        activity->set_state_us(absl::ToInt64Microseconds(absl::Now() - now.since));
        activity->set_channel_bytes(now.channel_bytes);
        if (!write(report)) return;
      } while (!report_cv.wait_for(lock, absl::ToChronoMicroseconds(activity_interval),
                                   [&] { return reporting_done; }));
    });
  }

  v1::StepPlan plan;
  while (stream->Read(&plan)) {
    std::lock_guard<std::mutex> lock(queue_mu);
    if (!error.empty()) break;
    in_flight_.fetch_add(1);
    queue.push_back(std::move(plan));
    queue_cv.notify_one();
  }
  {
    std::lock_guard<std::mutex> lock(queue_mu);
    reading_done = true;
    queue_cv.notify_one();
  }
  // The coordinator closed the stream (or went away): the ring is over. A step still waiting
  // on a neighbour that takes or sends nothing (stopped, wedged, cut off) would hold this stage
  // until the step timeout, and refuse the next Configure meanwhile: abort its channels.
  executor->AbortChannels();
  worker.join();
  {
    std::lock_guard<std::mutex> lock(report_mu);
    reporting_done = true;
    report_cv.notify_all();
  }
  if (reporter.joinable()) reporter.join();
  executor->CloseChannels();
  {
    std::lock_guard<std::mutex> lock(mu_);
    steps_active_ = false;
    ResetLocked();
    auth_.Release();  // the ring ended: another coordinator may take the stage over
    status_ = error.empty() ? "waiting for configuration (the ring was closed)"
                            : "waiting for configuration (last ring failed: " + error + ")";
  }
  RS_LOG_INFO("steps stream ended{}", error.empty() ? "" : ": " + error);
  if (!error.empty()) return grpc::Status(grpc::StatusCode::ABORTED, error);
  return grpc::Status::OK;
}

bool StageService::ExecutorAlive() const {
  const int64_t started = step_started_us_.load();
  return started == 0 || absl::ToUnixMicros(absl::Now()) - started < step_limit_us_.load();
}

grpc::Status StageService::Health(grpc::ServerContext* context, const v1::StageHealthRequest*,
                                  v1::StageHealthResponse* response) {
  if (absl::StatusOr<std::string> caller = Caller(*context, /*owner_only=*/false); !caller.ok()) {
    return ToGrpcStatus(caller.status());
  }
  std::lock_guard<std::mutex> lock(mu_);
  response->set_configured(slice_ != nullptr || executor_ != nullptr);
  response->set_ready(executor_ != nullptr);
  response->set_status(status_);
  return grpc::Status::OK;
}

grpc::Status StageService::Stats(grpc::ServerContext* context, const v1::StageStatsRequest*,
                                 v1::StageStatsResponse* response) {
  if (absl::StatusOr<std::string> caller = Caller(*context, /*owner_only=*/false); !caller.ok()) {
    return ToGrpcStatus(caller.status());
  }
  std::lock_guard<std::mutex> lock(mu_);
  response->set_stage_index(config_.stage_index());
  response->set_busy_us(busy_us_.load());
  response->set_steps(steps_.load());
  response->set_in_flight(in_flight_.load());
  response->set_bytes_sent(bytes_sent_.load());
  response->set_bytes_received(bytes_received_.load());
  response->set_uptime_us(absl::ToInt64Microseconds(absl::Now() - start_time_));
  response->set_load_status(status_);
  response->set_first_layer(config_.first_layer());
  response->set_last_layer(config_.last_layer());
  response->set_kv_blocks_total(config_.kv_num_blocks());
  return grpc::Status::OK;
}

grpc::Status StageService::Shutdown(grpc::ServerContext* context, const v1::ShutdownRequest*,
                                    v1::ShutdownResponse*) {
  if (absl::StatusOr<std::string> caller = Caller(*context, /*owner_only=*/true); !caller.ok()) {
    return ToGrpcStatus(caller.status());
  }
  RS_LOG_INFO("shutdown requested");
  if (options_.on_shutdown) options_.on_shutdown();
  return grpc::Status::OK;
}

}  // namespace ringserve
