#include "coordinator/http/http_server.h"

#include <httplib.h>

#include <algorithm>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "common/logging.h"
#include "common/secure_compare.h"
#include "common/status_macros.h"
#include "coordinator/http/connection_server.h"
#include "coordinator/http/dashboard.h"
#include "coordinator/http/openai_logprobs.h"
#include "coordinator/http/openai_protocol.h"
#include "coordinator/http/request_stream.h"
#include "fmt/format.h"

namespace ringserve::http {
namespace {

using Clock = std::chrono::steady_clock;

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The route label for metrics: known paths as they are, everything else "other".
std::string RouteLabel(const std::string& path) {
  static const std::set<std::string> kKnown = {
      "/v1/completions", "/v1/chat/completions", "/v1/models", "/metrics",
      "/dashboard",      "/dashboard/data",      "/health"};
  if (kKnown.count(path) > 0) return path;
  if (path.rfind("/v1/models/", 0) == 0) return "/v1/models/{id}";
  return "other";
}

void SetJson(httplib::Response& res, int status, const nlohmann::json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                  "application/json");
}

void SetError(httplib::Response& res, const ApiError& error) {
  SetJson(res, error.http_status, ApiErrorJson(error));
  // Overload answers say when to come back (OpenAI clients honour it).
  if (error.http_status == 429 || error.http_status == 503) res.set_header("Retry-After", "1");
}

// A token is at least one byte of text in every tokenizer we load, but a tokenizer can merge
// long runs (whitespace, repeated characters) into single tokens; no vocabulary we know has
// tokens longer than this many bytes. Text over max_context times this cannot fit and is
// refused before tokenizing it.
constexpr int64_t kMaxBytesPerToken = 64;

absl::Status CheckTextFits(std::string_view text, int max_context, std::string_view param) {
  if (max_context <= 0) return absl::OkStatus();
  if (static_cast<int64_t>(text.size()) > kMaxBytesPerToken * max_context) {
    return InvalidParam(param, fmt::format("The prompt ({} bytes) is longer than this model's "
                                           "maximum context length of {} tokens can hold.",
                                           text.size(), max_context));
  }
  return absl::OkStatus();
}

// Everything the generation handlers need once a request has been accepted.
struct Accepted {
  OpenAiRequest request;
  std::shared_ptr<RequestStream> stream;
  ResponseHeader header;
  int prompt_tokens = 0;
};

}  // namespace

class HttpServer::Impl {
 public:
  Impl(Engine& engine, ChatRenderFn chat_render, Options options, ServingMetrics* metrics)
      : engine_(engine),
        chat_render_(std::move(chat_render)),
        options_(std::move(options)),
        metrics_(metrics),
        server_(ConnectionServer::Limits{.max_connections = options_.max_connections,
                                         .request_read_timeout = options_.request_read_timeout,
                                         .idle_timeout = options_.idle_timeout}),
        rng_(std::random_device{}()) {}

  absl::Status Start(int* port);
  void Stop();

 private:
  void InstallRoutes();
  bool Authorized(const httplib::Request& req) const;
  // Waits for the stream's first event: OK, or the status to answer with (queue timeout,
  // client gone, server stopping). Cancels the request when it gives up.
  absl::Status AwaitFirstEvent(const std::shared_ptr<RequestStream>& stream);
  std::string ModelName();
  void HandleModels(const httplib::Request& req, httplib::Response& res);
  void HandleGenerate(ApiKind kind, const httplib::Request& req, httplib::Response& res);
  absl::StatusOr<std::vector<int32_t>> PromptIds(const OpenAiRequest& request,
                                                 const ModelInfo& info);
  absl::Status ResolveMaxTokens(const OpenAiRequest& request, const ModelInfo& info,
                                int prompt_tokens, SamplingParams* sampling) const;
  // `first` is the request's first event, already taken from its stream.
  void RespondStreaming(std::shared_ptr<Accepted> accepted, GenerateEvent first,
                        httplib::Response& res);
  void RespondOnce(std::shared_ptr<Accepted> accepted, httplib::Response& res);
  std::string NewRequestId(ApiKind kind);
  void Register(const std::shared_ptr<RequestStream>& stream);
  void Unregister(const std::shared_ptr<RequestStream>& stream);
  void Release(const std::shared_ptr<RequestStream>& stream);
  // Cancels every choice of the stream's request that has not finished.
  void CancelChoices(const RequestStream& stream);
  // Submits choice `index` (> 0) of an accepted request: its own request id and, when the
  // client gave a seed, seed + index. A refusal arrives on the stream as that choice's error.
  void SubmitChoice(const Accepted& accepted, const GenerateRequest& base, int index);
  // The text of one token (logprobs objects).
  std::string TokenText(int32_t id) { return engine_.Detokenize({id}); }

  Engine& engine_;
  const ChatRenderFn chat_render_;
  const Options options_;
  ServingMetrics* const metrics_;
  const int64_t created_ = UnixSeconds();

  ConnectionServer server_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> active_{0};

  std::mutex mu_;
  std::mt19937_64 rng_;
  uint64_t next_id_ = 0;
  std::set<std::shared_ptr<RequestStream>> streams_;
};

absl::Status HttpServer::Impl::Start(int* port) {
  server_.set_payload_max_length(options_.max_body_bytes);
  InstallRoutes();
  absl::StatusOr<int> bound = server_.Bind(options_.host, options_.port);
  if (!bound.ok()) return bound.status();
  *port = *bound;
  server_.Start();
  RS_LOG_INFO("HTTP API on http://{}:{} (OpenAI /v1, /metrics, /dashboard){}", options_.host, *port,
              options_.api_key.empty() ? "" : ", API key required");
  return absl::OkStatus();
}

void HttpServer::Impl::Stop() {
  if (stopping_.exchange(true)) return;
  std::vector<std::shared_ptr<RequestStream>> streams;
  {
    std::lock_guard<std::mutex> lock(mu_);
    streams.assign(streams_.begin(), streams_.end());
  }
  for (const std::shared_ptr<RequestStream>& stream : streams) {
    if (!stream->finished()) CancelChoices(*stream);
    stream->Close();
  }
  server_.Stop();
}

void HttpServer::Impl::InstallRoutes() {
  // cpp-httplib compresses with brotli at quality 11 when a client accepts "br" (browsers do):
  // seconds of CPU for a large /dashboard/data. Offer it gzip only.
  server_.set_pre_routing_handler([](const httplib::Request& req, httplib::Response&) {
    std::string accepted = req.get_header_value("Accept-Encoding");
    if (accepted.find("br") != std::string::npos) {
      auto& headers = const_cast<httplib::Request&>(req).headers;  // httplib owns a mutable one
      headers.erase("Accept-Encoding");
      if (accepted.find("gzip") != std::string::npos) headers.emplace("Accept-Encoding", "gzip");
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  // Counted before the response is written (httplib's logger runs after it, so a client could
  // read /metrics before its previous response was counted).
  server_.set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    metrics_->RecordHttpResponse(RouteLabel(req.path), res.status);
  });
  server_.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty() || res.status != 404) return;
    SetError(res, {.http_status = 404,
                   .message = fmt::format("Unknown route: {} {}", req.method, req.path),
                   .type = "invalid_request_error"});
  });
  server_.set_exception_handler(
      [](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown exception";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        RS_LOG_ERROR("HTTP {} {}: {}", req.method, req.path, what);
        SetError(res, {.http_status = 500, .message = "Internal server error: " + what});
      });

  server_.Get("/v1/models", [this](const auto& req, auto& res) { HandleModels(req, res); });
  server_.Get(R"(/v1/models/(.+))", [this](const auto& req, auto& res) { HandleModels(req, res); });
  server_.Post("/v1/completions", [this](const auto& req, auto& res) {
    HandleGenerate(ApiKind::kCompletion, req, res);
  });
  server_.Post("/v1/chat/completions",
               [this](const auto& req, auto& res) { HandleGenerate(ApiKind::kChat, req, res); });
  auto refuse_unauthorized = [this](const httplib::Request& req, httplib::Response& res) {
    if (!options_.protect_metrics || Authorized(req)) return false;
    SetError(res, ApiErrorFromStatus(absl::UnauthenticatedError("Incorrect API key provided.")));
    return true;
  };
  server_.Get("/metrics",
              [this, refuse_unauthorized](const httplib::Request& req, httplib::Response& res) {
                if (refuse_unauthorized(req, res)) return;
                res.set_content(RenderPrometheus(*metrics_, engine_.Stats(), engine_.Info()),
                                "text/plain; version=0.0.4; charset=utf-8");
              });
  server_.Get("/dashboard", [](const httplib::Request&, httplib::Response& res) {
    std::string_view html = DashboardHtml();
    res.set_content(html.data(), html.size(), "text/html; charset=utf-8");
  });
  server_.Get("/dashboard/data",
              [this, refuse_unauthorized](const httplib::Request& req, httplib::Response& res) {
                if (refuse_unauthorized(req, res)) return;
                res.set_header("Cache-Control", "no-store");
                SetJson(res, 200, DashboardData(engine_.Stats(), engine_.Info()));
              });
  server_.Get(
      "/", [](const httplib::Request&, httplib::Response& res) { res.set_redirect("/dashboard"); });
  server_.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    RingStats stats = engine_.Stats();
    int ready = 0;
    nlohmann::json stages = nlohmann::json::array();
    for (const StageStats& stage : stats.stages) {
      ready += stage.load_status == "ready" ? 1 : 0;
      stages.push_back({{"index", stage.index}, {"status", stage.load_status}});
    }
    bool ok = !stats.stages.empty() && ready == static_cast<int>(stats.stages.size());
    SetJson(res, ok ? 200 : 503,
            {{"status", ok ? "ok" : "starting"}, {"stages_ready", ready}, {"stages", stages}});
  });
}

bool HttpServer::Impl::Authorized(const httplib::Request& req) const {
  if (options_.api_key.empty()) return true;
  std::string header = req.get_header_value("Authorization");
  static constexpr std::string_view kBearer = "Bearer ";
  return header.size() > kBearer.size() && header.compare(0, kBearer.size(), kBearer) == 0 &&
         SecureEquals(std::string_view(header).substr(kBearer.size()), options_.api_key);
}

std::string HttpServer::Impl::ModelName() {
  return options_.served_model_name.empty() ? engine_.Info().model_id : options_.served_model_name;
}

void HttpServer::Impl::HandleModels(const httplib::Request& req, httplib::Response& res) {
  if (!Authorized(req)) {
    SetError(res, ApiErrorFromStatus(absl::UnauthenticatedError("Incorrect API key provided.")));
    return;
  }
  ModelInfo info = engine_.Info();
  std::string name = ModelName();
  nlohmann::json model = {{"id", name},
                          {"object", "model"},
                          {"created", created_},
                          {"owned_by", "ringserve"},
                          {"max_model_len", info.max_context}};
  if (req.matches.size() > 1) {
    if (req.matches[1] != name) {
      SetError(res, {.http_status = 404,
                     .message = fmt::format("The model '{}' does not exist.", req.matches[1].str()),
                     .type = "invalid_request_error",
                     .param = "model",
                     .code = "model_not_found"});
      return;
    }
    SetJson(res, 200, model);
    return;
  }
  SetJson(res, 200, {{"object", "list"}, {"data", nlohmann::json::array({model})}});
}

std::string HttpServer::Impl::NewRequestId(ApiKind kind) {
  std::lock_guard<std::mutex> lock(mu_);
  return fmt::format("{}-{:012x}{:06x}", kind == ApiKind::kChat ? "chatcmpl" : "cmpl",
                     rng_() & 0xffffffffffffULL, ++next_id_ & 0xffffff);
}

absl::StatusOr<std::vector<int32_t>> HttpServer::Impl::PromptIds(const OpenAiRequest& request,
                                                                 const ModelInfo& info) {
  if (request.kind == ApiKind::kChat) {
    if (!chat_render_) {
      return InvalidParam("messages", "This model has no chat template; use /v1/completions.");
    }
    absl::StatusOr<std::string> prompt =
        chat_render_(request.messages, request.add_generation_prompt, request.chat_template_kwargs);
    if (!prompt.ok()) {
      return InvalidParam("messages", fmt::format("Cannot apply the chat template: {}",
                                                  std::string(prompt.status().message())));
    }
    RS_RETURN_IF_ERROR(CheckTextFits(*prompt, info.max_context, "messages"));
    // The template writes the special tokens (BOS) itself.
    return engine_.Tokenize(*prompt, /*add_special_tokens=*/false);
  }
  if (request.prompt_ids.has_value()) {
    for (int32_t id : *request.prompt_ids) {
      if (info.vocab_size > 0 && id >= info.vocab_size) {
        return InvalidParam(
            "prompt",
            fmt::format("Token id {} is outside the vocabulary (size {}).", id, info.vocab_size));
      }
    }
    return *request.prompt_ids;
  }
  RS_RETURN_IF_ERROR(CheckTextFits(*request.prompt_text, info.max_context, "prompt"));
  return engine_.Tokenize(*request.prompt_text, /*add_special_tokens=*/true);
}

absl::Status HttpServer::Impl::ResolveMaxTokens(const OpenAiRequest& request, const ModelInfo& info,
                                                int prompt_tokens, SamplingParams* sampling) const {
  const int context = info.max_context;
  if (context > 0 && prompt_tokens >= context) {
    return InvalidParam(request.kind == ApiKind::kChat ? "messages" : "prompt",
                        fmt::format("This model's maximum context length is {} tokens, but the "
                                    "prompt has {} tokens.",
                                    context, prompt_tokens));
  }
  if (request.max_tokens.has_value()) {
    if (context > 0 && static_cast<int64_t>(prompt_tokens) + *request.max_tokens > context) {
      return InvalidParam("max_tokens",
                          fmt::format("This model's maximum context length is {} tokens. However, "
                                      "you requested {} tokens ({} in the prompt, {} for the "
                                      "completion).",
                                      context, prompt_tokens + *request.max_tokens, prompt_tokens,
                                      *request.max_tokens));
    }
    sampling->max_tokens = *request.max_tokens;
  } else if (request.kind == ApiKind::kCompletion) {
    sampling->max_tokens = 16;  // OpenAI's default for completions
    if (context > 0) sampling->max_tokens = std::min(16, context - prompt_tokens);
  } else {
    sampling->max_tokens = options_.default_chat_max_tokens;
    if (context > 0) sampling->max_tokens = std::min(sampling->max_tokens, context - prompt_tokens);
  }
  return absl::OkStatus();
}

void HttpServer::Impl::CancelChoices(const RequestStream& stream) {
  for (int i = 0; i < stream.choices(); ++i) {
    if (!stream.choice_finished(i)) engine_.Cancel(stream.ChoiceRequestId(i));
  }
}

void HttpServer::Impl::SubmitChoice(const Accepted& accepted, const GenerateRequest& base,
                                    int index) {
  std::shared_ptr<RequestStream> stream = accepted.stream;
  GenerateRequest request = base;
  request.request_id = stream->ChoiceRequestId(index);
  request.later_choice = true;
  if (request.sampling.seed.has_value()) *request.sampling.seed += static_cast<uint64_t>(index);
  absl::Status submitted = engine_.Submit(
      std::move(request),
      [stream, index](const GenerateEvent& event) { stream->OnEvent(index, event); });
  if (!submitted.ok()) {
    GenerateEvent failed;
    failed.finished = true;
    failed.finish_reason = FinishReason::kError;
    failed.error = submitted;
    stream->OnEvent(index, failed);
  }
}

void HttpServer::Impl::Register(const std::shared_ptr<RequestStream>& stream) {
  std::lock_guard<std::mutex> lock(mu_);
  streams_.insert(stream);
}

void HttpServer::Impl::Unregister(const std::shared_ptr<RequestStream>& stream) {
  std::lock_guard<std::mutex> lock(mu_);
  streams_.erase(stream);
}

// Called exactly once per accepted request when its response is over, delivered or not.
void HttpServer::Impl::Release(const std::shared_ptr<RequestStream>& stream) {
  if (!stream->finished()) {
    RS_LOG_INFO("request {}: client went away, cancelling", stream->request_id());
    CancelChoices(*stream);
  }
  Unregister(stream);
  active_.fetch_sub(1);  // before the gauge: a gauge at 0 means the slots are free
  metrics_->AddInFlight(-1);
}

void HttpServer::Impl::HandleGenerate(ApiKind kind, const httplib::Request& req,
                                      httplib::Response& res) {
  auto reject = [&](const absl::Status& status) {
    metrics_->RecordOutcome("http", RequestOutcome::kRejected);
    ApiError error = ApiErrorFromStatus(status);
    RS_LOG_DEBUG("HTTP {} rejected ({}): {}", req.path, error.http_status, error.message);
    SetError(res, error);
  };
  if (!Authorized(req)) {
    reject(absl::UnauthenticatedError(
        "Incorrect API key provided. Send it as 'Authorization: Bearer <key>'."));
    return;
  }
  if (stopping_) {
    reject(absl::UnavailableError("The server is shutting down."));
    return;
  }
  absl::StatusOr<OpenAiRequest> parsed =
      kind == ApiKind::kChat ? ParseChatRequest(req.body) : ParseCompletionRequest(req.body);
  if (!parsed.ok()) {
    reject(parsed.status());
    return;
  }
  std::string model_name = ModelName();
  if (parsed->model != model_name) {
    metrics_->RecordOutcome("http", RequestOutcome::kRejected);
    SetError(res, {.http_status = 404,
                   .message = fmt::format("The model '{}' does not exist; this server serves '{}'.",
                                          parsed->model, model_name),
                   .type = "invalid_request_error",
                   .param = "model",
                   .code = "model_not_found"});
    return;
  }
  ModelInfo info = engine_.Info();
  absl::StatusOr<std::vector<int32_t>> prompt_ids = PromptIds(*parsed, info);
  if (!prompt_ids.ok()) {
    reject(prompt_ids.status());
    return;
  }
  GenerateRequest generate;
  generate.prompt_ids = std::move(*prompt_ids);
  generate.sampling = parsed->sampling;
  if (absl::Status status =
          ResolveMaxTokens(*parsed, info, generate.prompt_ids.size(), &generate.sampling);
      !status.ok()) {
    reject(status);
    return;
  }
  if (generate.sampling.min_tokens > generate.sampling.max_tokens) {
    reject(InvalidParam("min_tokens",
                        fmt::format("'min_tokens' ({}) must not exceed the maximum "
                                    "number of tokens to generate ({}).",
                                    generate.sampling.min_tokens, generate.sampling.max_tokens)));
    return;
  }
  if (active_.fetch_add(1) >= options_.max_concurrent_requests) {
    active_.fetch_sub(1);
    reject(absl::ResourceExhaustedError(
        fmt::format("The server is serving its limit of {} requests; retry later.",
                    options_.max_concurrent_requests)));
    return;
  }
  auto accepted = std::make_shared<Accepted>();
  accepted->request = std::move(*parsed);
  accepted->header = {.id = NewRequestId(kind), .created = UnixSeconds(), .model = model_name};
  accepted->prompt_tokens = static_cast<int>(generate.prompt_ids.size());
  accepted->stream =
      std::make_shared<RequestStream>(accepted->header.id, metrics_, accepted->request.n);
  generate.request_id = accepted->header.id;
  std::shared_ptr<RequestStream> stream = accepted->stream;
  Register(stream);
  metrics_->AddInFlight(1);
  // n > 1: choice 0 goes first; the others follow once it has a token, when its prompt's full
  // KV blocks are in the prefix cache, so they skip that prefill (coordinator/scheduler).
  const GenerateRequest base = accepted->request.n > 1 ? generate : GenerateRequest{};
  absl::Status submitted = engine_.Submit(
      std::move(generate), [stream](const GenerateEvent& event) { stream->OnEvent(0, event); });
  if (!submitted.ok()) {
    Unregister(stream);
    metrics_->AddInFlight(-1);
    active_.fetch_sub(1);
    reject(submitted);
    return;
  }
  // Until the first event nothing is committed: a queue timeout, or a request that fails
  // before its first token, gets its own status.
  if (absl::Status waited = AwaitFirstEvent(stream); !waited.ok()) {
    if (absl::IsCancelled(waited)) {
      Release(stream);
      return;  // the client went away: nobody reads this answer
    }
    SetError(res, ApiErrorFromStatus(waited));
    Release(stream);
    return;
  }
  for (int i = 1; i < accepted->request.n; ++i) SubmitChoice(*accepted, base, i);
  if (accepted->request.stream) {
    GenerateEvent first;
    accepted->stream->Next(std::chrono::milliseconds(0), &first);  // queued: no wait
    if (first.finished && (first.finish_reason == FinishReason::kError ||
                           first.finish_reason == FinishReason::kCancelled)) {
      absl::Status error = first.finish_reason == FinishReason::kCancelled
                               ? absl::UnavailableError("The request was cancelled.")
                           : first.error.ok() ? absl::InternalError("generation failed")
                                              : first.error;
      RS_LOG_WARN("request {} failed: {}", accepted->header.id, error.ToString());
      SetError(res, ApiErrorFromStatus(error));
      Release(stream);
      return;
    }
    RespondStreaming(std::move(accepted), std::move(first), res);
  } else {
    RespondOnce(std::move(accepted), res);
  }
}

absl::Status HttpServer::Impl::AwaitFirstEvent(const std::shared_ptr<RequestStream>& stream) {
  const Clock::time_point deadline = options_.queue_timeout.count() > 0
                                         ? Clock::now() + options_.queue_timeout
                                         : Clock::time_point::max();
  while (true) {
    auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    switch (stream->WaitForEvent(std::min(left, options_.keepalive_interval))) {
      case RequestStream::Wait::kEvent:
        return absl::OkStatus();
      case RequestStream::Wait::kClosed:
        return absl::UnavailableError("The server is shutting down.");
      case RequestStream::Wait::kTimeout:
        break;
    }
    if (!ConnectionServer::PeerConnected()) {
      return absl::CancelledError("client went away");  // Release cancels it
    }
    if (Clock::now() >= deadline) {
      CancelChoices(*stream);
      metrics_->RecordOutcome("http", RequestOutcome::kRejected);
      return absl::UnavailableError(
          fmt::format("The request waited {} ms for the server without starting; retry later.",
                      options_.queue_timeout.count()));
    }
  }
}

void HttpServer::Impl::RespondStreaming(std::shared_ptr<Accepted> accepted, GenerateEvent first,
                                        httplib::Response& res) {
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  struct State {
    bool started = false;
    bool done = false;
    std::optional<GenerateEvent> first;  // choice 0's
    std::vector<int64_t> text_offsets;   // per choice: completions' logprobs text_offset
    int finished = 0;                    // choices finished
    Usage usage;                         // the prompt once, every choice's completion tokens
  };
  auto state = std::make_shared<State>();
  state->first = std::move(first);
  state->text_offsets.assign(accepted->request.n, 0);
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, accepted, state](size_t, httplib::DataSink& sink) -> bool {
        const OpenAiRequest& request = accepted->request;
        const ResponseHeader& header = accepted->header;
        auto write = [&sink](const std::string& data) {
          return sink.write(data.data(), data.size());
        };
        if (state->done) return false;
        if (!state->started) {
          state->started = true;
          // The role chunks go out at once: clients see headers and the role immediately.
          for (int i = 0; request.kind == ApiKind::kChat && i < request.n; ++i) {
            if (!write(SseEvent(ChatChunk(header, "", /*first=*/true, FinishReason::kNone, i)))) {
              return false;
            }
          }
        }
        GenerateEvent event;
        int index = 0;
        if (state->first.has_value()) {
          event = *std::move(state->first);
          state->first.reset();
        } else {
          switch (accepted->stream->Next(options_.keepalive_interval, &event, &index)) {
            case RequestStream::Wait::kClosed:
              return false;
            case RequestStream::Wait::kTimeout:
              return write(": keep-alive\n\n");
            case RequestStream::Wait::kEvent:
              break;
          }
        }
        if (event.finished && event.finish_reason == FinishReason::kError) {
          absl::Status error =
              event.error.ok() ? absl::InternalError("generation failed") : event.error;
          RS_LOG_WARN("request {} failed: {}", header.id, error.ToString());
          state->done = true;
          if (!write(SseEvent(ApiErrorJson(ApiErrorFromStatus(error))))) return false;
          if (!write(std::string(kSseDone))) return false;
          sink.done();
          return true;
        }
        if (event.finished && event.finish_reason == FinishReason::kCancelled) {
          state->done = true;
          return false;  // cancelled under us (server stopping): end the response uncleanly
        }
        FinishReason reason = event.finished ? event.finish_reason : FinishReason::kNone;
        nlohmann::json logprobs;
        if (request.sampling.logprobs && !event.logprobs.empty()) {
          auto text = [this](int32_t id) { return TokenText(id); };
          logprobs =
              request.kind == ApiKind::kChat
                  ? ChatLogprobsJson(event.logprobs, text)
                  : CompletionLogprobsJson(event.logprobs, text, &state->text_offsets[index]);
        }
        if (!event.text_delta.empty() || event.finished || !logprobs.is_null()) {
          nlohmann::json chunk =
              request.kind == ApiKind::kChat
                  ? ChatChunk(header, event.text_delta, /*first=*/false, reason, index, logprobs)
                  : CompletionChunk(header, event.text_delta, reason, index, logprobs);
          if (!write(SseEvent(chunk))) return false;
        }
        if (event.finished) {
          state->usage.prompt_tokens = event.usage.prompt_tokens;
          state->usage.completion_tokens += event.usage.completion_tokens;
          if (++state->finished < request.n) return true;
          state->done = true;
          if (request.include_usage &&
              !write(SseEvent(UsageChunk(request.kind, header, state->usage)))) {
            return false;
          }
          if (!write(std::string(kSseDone))) return false;
          RS_LOG_DEBUG("request {}: done, {} + {} tokens", header.id, state->usage.prompt_tokens,
                       state->usage.completion_tokens);
          sink.done();
        }
        return true;
      },
      [this, stream = accepted->stream](bool) { Release(stream); });
}

void HttpServer::Impl::RespondOnce(std::shared_ptr<Accepted> accepted, httplib::Response& res) {
  // Waits here for the whole answer, so that a failure gets its HTTP status; a client that goes
  // away is noticed by watching its socket, and its request cancelled (Release).
  const OpenAiRequest& request = accepted->request;
  std::vector<ChoiceOutput> choices(request.n);
  std::vector<std::vector<TokenLogprobs>> logprobs(request.n);
  for (int i = 0; i < request.n; ++i) choices[i].index = i;
  Usage usage;
  int finished = 0;
  GenerateEvent last;
  Clock::time_point next_peer_check = Clock::now() + options_.keepalive_interval;
  while (true) {
    GenerateEvent event;
    int index = 0;
    RequestStream::Wait wait = accepted->stream->Next(options_.keepalive_interval, &event, &index);
    if (wait == RequestStream::Wait::kClosed) {
      SetError(res, ApiErrorFromStatus(absl::UnavailableError("The server is shutting down.")));
      break;
    }
    if (Clock::now() >= next_peer_check) {
      if (!ConnectionServer::PeerConnected()) break;
      next_peer_check = Clock::now() + options_.keepalive_interval;
    }
    if (wait == RequestStream::Wait::kTimeout) continue;
    choices[index].text += event.text_delta;
    logprobs[index].insert(logprobs[index].end(), event.logprobs.begin(), event.logprobs.end());
    if (!event.finished) continue;
    choices[index].reason = event.finish_reason;
    usage.prompt_tokens = event.usage.prompt_tokens;
    usage.completion_tokens += event.usage.completion_tokens;
    last = std::move(event);
    if (last.finish_reason == FinishReason::kError ||
        last.finish_reason == FinishReason::kCancelled) {
      absl::Status error =
          last.finish_reason == FinishReason::kCancelled
              ? absl::UnavailableError("The request was cancelled (server shutting down).")
          : last.error.ok() ? absl::InternalError("generation failed")
                            : last.error;
      if (last.finish_reason == FinishReason::kError) {
        RS_LOG_WARN("request {} failed: {}", accepted->header.id, error.ToString());
      }
      SetError(res, ApiErrorFromStatus(error));
      break;
    }
    if (++finished < request.n) continue;
    if (request.sampling.logprobs) {
      auto text = [this](int32_t id) { return TokenText(id); };
      for (int i = 0; i < request.n; ++i) {
        int64_t offset = 0;
        choices[i].logprobs = request.kind == ApiKind::kChat
                                  ? ChatLogprobsJson(logprobs[i], text)
                                  : CompletionLogprobsJson(logprobs[i], text, &offset);
      }
    }
    const ResponseHeader& header = accepted->header;
    SetJson(res, 200,
            request.kind == ApiKind::kChat ? ChatResponse(header, choices, usage)
                                           : CompletionResponse(header, choices, usage));
    break;
  }
  Release(accepted->stream);
}

HttpServer::HttpServer(Engine& engine, ChatRenderFn chat_render, Options options) {
  if (options.metrics == nullptr) {
    owned_metrics_ = std::make_unique<ServingMetrics>();
    metrics_ = owned_metrics_.get();
  } else {
    metrics_ = options.metrics;
  }
  impl_ = std::make_unique<Impl>(engine, std::move(chat_render), std::move(options), metrics_);
}

HttpServer::~HttpServer() { Stop(); }

absl::Status HttpServer::Start() { return impl_->Start(&port_); }

void HttpServer::Stop() { impl_->Stop(); }

}  // namespace ringserve::http
