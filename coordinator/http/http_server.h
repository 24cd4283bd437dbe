// The coordinator's HTTP front: the OpenAI-compatible API, Prometheus metrics and the
// ring-utilization dashboard, on one port (cpp-httplib).
//
//   POST /v1/completions, /v1/chat/completions   OpenAI API; SSE when "stream": true
//   GET  /v1/models, /v1/models/{id}             the served model
//   GET  /metrics                                Prometheus text format (metrics.h)
//   GET  /dashboard, /dashboard/data             the page (inline JS/CSS) and its JSON feed
//   GET  /health                                 200 when every stage is ready, else 503
//
// With Options::api_key set, /v1/* requires "Authorization: Bearer <key>" (401 otherwise);
// /metrics, /dashboard and /health stay open (bind them to a private address in production).
// A request whose client disconnects is cancelled in the engine (its KV blocks are freed):
// streams notice on their next write (tokens or a keep-alive comment every
// Options::keepalive_interval), non-streaming requests that take longer than that interval
// are answered with chunked encoding and leading JSON whitespace for the same reason.
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
    // Worker threads: each open stream holds one.
    int num_threads = 64;
    // Generation requests served at once (streams + waits); more get 429.
    int max_concurrent_requests = 256;
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
