#include "coordinator/generate_service.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "common/secure_compare.h"
#include "coordinator/http/request_ids.h"
#include "fmt/format.h"
#include "proto/grpc_status.h"

namespace ringserve {
namespace {

v1::FinishReason ToProto(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return v1::FINISH_REASON_STOP;
    case FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case FinishReason::kCancelled:
      return v1::FINISH_REASON_CANCELLED;
    case FinishReason::kError:
      return v1::FINISH_REASON_ERROR;
    case FinishReason::kNone:
      break;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

// Events of one call, handed from the engine thread to the handler thread. Shared, because
// the engine may still deliver after the handler gave up.
struct EventQueue {
  explicit EventQueue(http::ServingMetrics* metrics) : recorder(metrics, "grpc") {}
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<int, GenerateEvent>> events;  // (choice, event)
  http::RequestRecorder recorder;                    // guarded by mu; follows choice 0
};

// As the HTTP API (http_server.cc): no tokenizer we load has tokens longer than this.
constexpr int64_t kMaxBytesPerToken = 64;

grpc::Status Invalid(std::string message) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, std::move(message));
}

// Frees an admission slot when the call ends.
struct SlotRelease {
  std::atomic<int>* active;
  ~SlotRelease() { active->fetch_sub(1); }
};

}  // namespace

grpc::Status GenerateService::CheckAuthorized(const grpc::ServerContext* context) const {
  if (options_.api_key.empty()) return grpc::Status::OK;
  const auto& metadata = context->client_metadata();
  auto it = metadata.find("authorization");
  static constexpr std::string_view kBearer = "Bearer ";
  if (it != metadata.end()) {
    std::string_view value(it->second.data(), it->second.size());
    if (value.size() > kBearer.size() && value.substr(0, kBearer.size()) == kBearer &&
        SecureEquals(value.substr(kBearer.size()), options_.api_key)) {
      return grpc::Status::OK;
    }
  }
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      "Incorrect API key; send it as metadata 'authorization: Bearer <key>'.");
}

GenerateService::GenerateService(Engine* engine, GenerateServiceOptions options)
    : engine_(engine), options_(std::move(options)) {}

grpc::Status GenerateService::Generate(grpc::ServerContext* context,
                                       const v1::GenerateRequest* request,
                                       grpc::ServerWriter<v1::GenerateResponse>* writer) {
  auto queue = std::make_shared<EventQueue>(options_.metrics);
  auto reject = [this](const grpc::Status& status) {
    if (options_.metrics != nullptr) {
      options_.metrics->RecordOutcome("grpc", http::RequestOutcome::kRejected);
    }
    return status;
  };
  if (grpc::Status auth = CheckAuthorized(context); !auth.ok()) return reject(auth);
  const ringserve::ModelInfo info = engine_->Info();
  const int context_tokens = info.max_context;
  GenerateRequest r;
  if (request->request_id().empty()) {
    r.request_id = fmt::format("grpc{}{}", http::kServerIdMark, next_id_.fetch_add(1));
  } else if (absl::Status client_id = http::CheckClientRequestId(request->request_id());
             !client_id.ok()) {
    return reject(ToGrpcStatus(client_id));
  } else {
    r.request_id = request->request_id();
  }
  switch (request->prompt_case()) {
    case v1::GenerateRequest::kText: {
      if (context_tokens > 0 &&
          static_cast<int64_t>(request->text().size()) > kMaxBytesPerToken * context_tokens) {
        return reject(Invalid(fmt::format(
            "prompt: the text ({} bytes) is longer than the model's context of {} tokens can hold",
            request->text().size(), context_tokens)));
      }
      auto ids = engine_->Tokenize(request->text(), request->add_special_tokens());
      if (!ids.ok()) return reject(ToGrpcStatus(ids.status()));
      r.prompt_ids = std::move(*ids);
      break;
    }
    case v1::GenerateRequest::kTokenIds:
      r.prompt_ids.assign(request->token_ids().ids().begin(), request->token_ids().ids().end());
      break;
    default:
      return reject(
          grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "prompt: neither text nor token_ids"));
  }
  const v1::SamplingParams& s = request->sampling();
  r.sampling.temperature = s.temperature();
  r.sampling.top_k = s.top_k();
  r.sampling.top_p = s.top_p() == 0.0f ? 1.0f : s.top_p();
  if (s.has_seed()) r.sampling.seed = s.seed();
  const int64_t prompt_tokens = static_cast<int64_t>(r.prompt_ids.size());
  if (s.max_tokens() < 0) return reject(Invalid("max_tokens: must not be negative"));
  if (context_tokens > 0 && prompt_tokens >= context_tokens) {
    return reject(Invalid(fmt::format(
        "prompt: this model's maximum context length is {} tokens, but the prompt has {} tokens",
        context_tokens, prompt_tokens)));
  }
  if (s.max_tokens() == 0) {
    r.sampling.max_tokens = options_.default_max_tokens;
    if (context_tokens > 0) {
      r.sampling.max_tokens = static_cast<int>(
          std::min<int64_t>(r.sampling.max_tokens, context_tokens - prompt_tokens));
    }
  } else {
    if (context_tokens > 0 && prompt_tokens + s.max_tokens() > context_tokens) {
      return reject(Invalid(
          fmt::format("max_tokens: this model's maximum context length is {} tokens; the prompt "
                      "has {} and max_tokens asks for {} more",
                      context_tokens, prompt_tokens, s.max_tokens())));
    }
    r.sampling.max_tokens = s.max_tokens();
  }
  r.sampling.stop.assign(s.stop().begin(), s.stop().end());
  r.sampling.stop_token_ids.assign(s.stop_token_ids().begin(), s.stop_token_ids().end());
  r.sampling.ignore_eos = s.ignore_eos();
  r.sampling.min_tokens = s.min_tokens();
  r.sampling.logprobs = s.logprobs();
  r.sampling.top_logprobs = s.top_logprobs();
  r.prompt_logprobs = request->prompt_logprobs();
  const int n = request->n() == 0 ? 1 : request->n();
  if (n < 1 || n > kMaxChoices) {
    return reject(Invalid(fmt::format("n: {} is not in [1, {}]", request->n(), kMaxChoices)));
  }
  const std::string id = r.request_id;
  auto choice_id = [&id](int i) { return http::ChoiceRequestId(id, i); };
  auto on_event = [queue](int index) {
    return [queue, index](const GenerateEvent& event) {
      std::lock_guard<std::mutex> lock(queue->mu);
      if (index == 0) queue->recorder.OnEvent(event);
      queue->events.emplace_back(index, event);
      queue->cv.notify_all();
    };
  };
  const GenerateRequest base = n > 1 ? r : GenerateRequest{};
  if (options_.max_concurrent_requests > 0 &&
      active_.fetch_add(1) >= options_.max_concurrent_requests) {
    active_.fetch_sub(1);
    return reject(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                               fmt::format("The server is serving its limit of {} requests; retry "
                                           "later.",
                                           options_.max_concurrent_requests)));
  }
  if (options_.max_concurrent_requests <= 0) active_.fetch_add(1);
  SlotRelease slot{&active_};

  absl::Status submitted = engine_->Submit(std::move(r), on_event(0));
  if (!submitted.ok()) return reject(ToGrpcStatus(submitted));

  // Choices 1..n-1 once choice 0 has an event (see GenerateRequest.n).
  int submitted_choices = 1;
  std::vector<bool> finished(n, false);
  int num_finished = 0;
  auto cancel_all = [&]() {
    for (int i = 0; i < submitted_choices; ++i) {
      if (!finished[i]) engine_->Cancel(choice_id(i));
    }
  };
  bool cancelled = false;
  absl::Time cancel_deadline;
  while (true) {
    std::deque<std::pair<int, GenerateEvent>> batch;
    {
      std::unique_lock<std::mutex> lock(queue->mu);
      // The sync API has no cancellation callback; look at IsCancelled between events.
      queue->cv.wait_for(lock, std::chrono::milliseconds(50),
                         [&] { return !queue->events.empty(); });
      batch.swap(queue->events);
    }
    for (auto& [index, event] : batch) {
      if (cancelled) {
        if (event.finished) finished[index] = true;
        if (event.finished && ++num_finished == submitted_choices) {
          return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
        }
        continue;
      }
      while (submitted_choices < n) {
        GenerateRequest next = base;
        next.request_id = choice_id(submitted_choices);
        next.later_choice = true;
        if (next.sampling.seed.has_value()) *next.sampling.seed += submitted_choices;
        absl::Status status = engine_->Submit(std::move(next), on_event(submitted_choices));
        if (!status.ok()) {
          // Only the choices submitted: a refused choice's id was never this call's to cancel.
          cancel_all();
          return ToGrpcStatus(status);
        }
        ++submitted_choices;
      }
      v1::GenerateResponse response;
      response.set_request_id(id);
      response.set_index(index);
      response.mutable_token_ids()->Add(event.token_ids.begin(), event.token_ids.end());
      response.mutable_prompt_logprobs()->Add(event.prompt_logprobs.begin(),
                                              event.prompt_logprobs.end());
      for (const TokenLogprobs& lp : event.logprobs) {
        v1::TokenLogprob* out = response.add_logprobs();
        out->set_token_id(lp.token_id);
        out->set_logprob(lp.logprob);
        for (const auto& [id, logprob] : lp.top) {
          out->add_top_token_ids(id);
          out->add_top_logprobs(logprob);
        }
      }
      response.set_text(std::move(event.text_delta));
      response.set_finished(event.finished);
      response.set_finish_reason(ToProto(event.finish_reason));
      response.mutable_usage()->set_prompt_tokens(event.usage.prompt_tokens);
      response.mutable_usage()->set_completion_tokens(event.usage.completion_tokens);
      if (!event.error.ok()) response.set_error(std::string(event.error.message()));
      if (event.finished) {
        finished[index] = true;
        ++num_finished;
      }
      if (!writer->Write(response)) {
        if (num_finished == n) return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
        cancelled = true;
        break;
      }
      if (event.finished && event.finish_reason == FinishReason::kError) {
        cancel_all();
        return ToGrpcStatus(event.error);
      }
      if (num_finished == n) return grpc::Status::OK;
    }
    if (!cancelled && context->IsCancelled()) cancelled = true;
    if (cancelled) {
      if (cancel_deadline == absl::Time()) {
        RS_LOG_INFO("request {}: client went away, cancelling", id);
        cancel_all();
        cancel_deadline = absl::Now() + absl::Seconds(10);
      } else if (absl::Now() > cancel_deadline) {
        return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
      }
    }
  }
}

grpc::Status GenerateService::Tokenize(grpc::ServerContext* context,
                                       const v1::TokenizeRequest* request,
                                       v1::TokenizeResponse* response) {
  if (grpc::Status auth = CheckAuthorized(context); !auth.ok()) return auth;
  const int context_tokens = engine_->Info().max_context;
  if (context_tokens > 0 &&
      static_cast<int64_t>(request->text().size()) > kMaxBytesPerToken * context_tokens) {
    return Invalid("text: longer than the model's context can hold");
  }
  auto ids = engine_->Tokenize(request->text(), request->add_special_tokens());
  if (!ids.ok()) return ToGrpcStatus(ids.status());
  response->mutable_token_ids()->Add(ids->begin(), ids->end());
  return grpc::Status::OK;
}

grpc::Status GenerateService::Detokenize(grpc::ServerContext* context,
                                         const v1::DetokenizeRequest* request,
                                         v1::DetokenizeResponse* response) {
  if (grpc::Status auth = CheckAuthorized(context); !auth.ok()) return auth;
  response->set_text(engine_->Detokenize(
      std::vector<int32_t>(request->token_ids().begin(), request->token_ids().end())));
  return grpc::Status::OK;
}

grpc::Status GenerateService::ModelInfo(grpc::ServerContext* context, const v1::ModelInfoRequest*,
                                        v1::ModelInfoResponse* response) {
  if (grpc::Status auth = CheckAuthorized(context); !auth.ok()) return auth;
  ringserve::ModelInfo info = engine_->Info();
  response->set_model_id(info.model_id);
  response->set_architecture(info.architecture);
  response->set_num_layers(info.num_layers);
  response->set_vocab_size(info.vocab_size);
  response->set_max_context(info.max_context);
  response->mutable_eos_token_ids()->Add(info.eos_token_ids.begin(), info.eos_token_ids.end());
  response->set_num_stages(options_.num_stages);
  return grpc::Status::OK;
}

grpc::Status GenerateService::Health(grpc::ServerContext*, const v1::HealthRequest*,
                                     v1::HealthResponse* response) {
  auto [serving, message] =
      options_.health ? options_.health() : std::pair<bool, std::string>(true, "serving");
  response->set_serving(serving);
  response->set_message(message);
  return grpc::Status::OK;
}

grpc::Status GenerateService::Stats(grpc::ServerContext* context, const v1::StatsRequest*,
                                    v1::StatsResponse* response) {
  if (grpc::Status auth = CheckAuthorized(context); !auth.ok()) return auth;
  RingStats stats = engine_->Stats();
  for (const StageStats& s : stats.stages) {
    v1::StageStatsProto* p = response->add_stages();
    p->set_index(s.index);
    p->set_endpoint(s.endpoint);
    p->set_first_layer(s.first_layer);
    p->set_last_layer(s.last_layer);
    p->set_busy_fraction(s.busy_fraction);
    p->set_mean_step_ms(s.mean_step_ms);
    p->set_micro_batches_in_flight(s.micro_batches_in_flight);
    p->set_kv_blocks_used(s.kv_blocks_used);
    p->set_kv_blocks_total(s.kv_blocks_total);
    p->set_bytes_sent(s.bytes_sent);
    p->set_load_status(s.load_status);
    p->set_steps(s.steps);
  }
  const RequestStats& r = stats.requests;
  response->set_requests_finished(r.requests_finished);
  response->set_requests_failed(r.requests_failed);
  response->set_requests_cancelled(r.requests_cancelled);
  response->set_prompt_tokens(r.prompt_tokens);
  response->set_generated_tokens(r.generated_tokens);
  response->set_queue_depth(r.queue_depth);
  response->set_running(r.running);
  response->set_tokens_per_second(r.tokens_per_second);
  response->set_mean_queue_ms(r.mean_queue_ms);
  response->set_mean_ttft_ms(r.mean_ttft_ms);
  response->set_preemptions(r.preemptions);
  response->set_ring_restarts(r.ring_restarts);
  response->set_resumed_requests(r.resumed_requests);
  response->set_rejected(r.rejected);
  response->set_prefix_lookup_tokens(r.prefix_lookup_tokens);
  response->set_prefix_hit_tokens(r.prefix_hit_tokens);
  response->set_ahead_decodes(r.ahead_decodes);
  response->set_ahead_discarded(r.ahead_discarded);
  response->set_speculative_verifications(r.speculative_verifications);
  response->set_speculative_drafts_verified(r.speculative_drafts_verified);
  response->set_speculative_drafts_accepted(r.speculative_drafts_accepted);
  response->set_speculative_verification_tokens(r.speculative_verification_tokens);
  response->set_mean_inter_token_ms(r.mean_inter_token_ms);
  response->set_micro_batches_in_flight(r.micro_batches_in_flight);
  return grpc::Status::OK;
}

}  // namespace ringserve
