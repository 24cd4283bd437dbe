// The coordinator's HTTP front: the OpenAI-compatible API, Prometheus metrics and the
// ring-utilization dashboard, on one port (cpp-httplib).
//
//   POST /v1/completions, /v1/chat/completions   OpenAI API; SSE when "stream": true
//   GET  /v1/models, /v1/models/{id}             the served model
//   GET  /metrics                                Prometheus text format (metrics.h)
//   GET  /dashboard, /dashboard/data             the page (inline JS/CSS) and its JSON feed
//   GET  /health                                 200 when every stage is ready, else 503
//
// With Options::api_key set, /v1/* requires "Authorization: Bearer <key>" (401 otherwise;
// compared in constant time); /metrics and /dashboard/data too when Options::protect_metrics;
// /health stays open. Stage control endpoints are never shown on these pages.
//
// What a client controls is bounded (connection_server.h for the connection limits): bodies
// over max_body_bytes get 413, JSON nested deeper than kMaxJsonDepth 400, prompts longer than
// the context 400 (text prompts far longer in bytes before tokenizing), more than
// max_concurrent_requests generation requests (running + waiting) 429 with Retry-After, a
// request that waits longer than queue_timeout for its first token 503 with Retry-After, and
// a new request while the engine's ring is down and re-forming 503 with Retry-After at once
// (the engine refuses it with Unavailable; coordinator/ring_engine.h).
// Every connection has its own thread, so /health and /metrics answer while generation is
// saturated. Responses wait for the first event, so a request that fails before streaming
// starts gets its error status (non-streaming ones get it whenever they fail).
// A request whose client disconnects is cancelled in the engine (its KV blocks are freed):
// streams notice on their next write (tokens or a keep-alive comment every
// Options::keepalive_interval), waiting and non-streaming requests by watching the socket.
//
// Usage:
//   HttpServer server(engine, chat_render, {.host = "0.0.0.0", .port = 8000});
//   RS_RETURN_IF_ERROR(server.Start());   // listening when this returns
//   ...
//   server.Stop();
//
// Thread-safety: Start and Stop from one thread; requests are served on the server's own
// thread pool. The engine must outlive the server.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/engine.h"
#include "coordinator/http/metrics.h"
#include "nlohmann/json.hpp"

namespace ringserve::http {

// Renders an OpenAI `messages` array into prompt text with the model's chat template
// (e.g. chat::ChatTemplate::Render; see MakeChatRenderer in http_api.h). `kwargs` are extra
// template variables (chat_template_kwargs). Must be thread-safe. Errors are returned to the
// client as 400.
using ChatRenderFn = std::function<absl::StatusOr<std::string>(
    const nlohmann::ordered_json& messages, bool add_generation_prompt,
    const nlohmann::ordered_json& kwargs)>;

class HttpServer {
 public:
  struct Options {
    std::string host = "127.0.0.1";
    int port = 0;  // 0 = any free port (see port())
    // Required bearer token for /v1/*; empty = no authentication.
    std::string api_key{};
    // The model id clients must name; empty = the engine's ModelInfo::model_id.
    std::string served_model_name{};
    // Generation requests admitted at once (running + waiting in the engine's queue); more
    // get 429 with Retry-After.
    int max_concurrent_requests = 256;
    // A request that has not had its first event this long after admission is cancelled and
    // answered 503 with Retry-After (0 = no limit).
    std::chrono::milliseconds queue_timeout{120000};
    // Request bodies larger than this get 413.
    size_t max_body_bytes = 4 << 20;
    // Open connections (each has a thread); more are answered 503 at once and closed.
    int max_connections = 512;
    // Request line + headers + body must arrive within this time.
    std::chrono::milliseconds request_read_timeout{10000};
    // Idle keep-alive connections are closed after this.
    std::chrono::milliseconds idle_timeout{5000};
    // /metrics and /dashboard/data require the API key too (when one is set).
    bool protect_metrics = false;
    // max_tokens for chat requests that give none: the rest of the context, capped here.
    int default_chat_max_tokens = 4096;
    // How long a stream may be silent before a keep-alive comment (disconnect detection).
    std::chrono::milliseconds keepalive_interval{1000};
    // Shared metrics (e.g. with the gRPC service); nullptr = the server keeps its own.
    ServingMetrics* metrics = nullptr;
  };

  // `chat_render` builds /v1/chat/completions prompts; when empty that route answers 400.
  HttpServer(Engine& engine, ChatRenderFn chat_render, Options options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds host:port and starts serving. InvalidArgument for a bad host, Unavailable when the
  // port cannot be bound.
  absl::Status Start();
  // Cancels the requests in progress, closes the port and joins the threads. Idempotent.
  void Stop();

  // The bound port (after Start).
  int port() const { return port_; }
  ServingMetrics& metrics() { return *metrics_; }

  class Impl;

 private:
  std::unique_ptr<ServingMetrics> owned_metrics_;
  ServingMetrics* metrics_ = nullptr;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace ringserve::http
