// Wires the HTTP front (http_server.h) into a coordinator: reads the model's chat template,
// parses the listen address, starts the server. coordinator_main calls StartHttpApi once the
// engine is up, when hosts.yaml sets `api.http` (or --http_listen is given):
//
//   std::unique_ptr<http::HttpServer> http;
//   if (!ring->http_listen.empty()) {
//     RS_ASSIGN_OR_RETURN(http, http::StartHttpApi(*engine, ring->model_dir,
//                                                  {.listen = ring->http_listen}));
//   }
//   ...                      // serve until signalled
//   http->Stop();            // before the engine shuts down
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "coordinator/chat/chat_template.h"
#include "coordinator/engine.h"
#include "coordinator/http/http_server.h"

namespace ringserve::http {

struct HttpApiOptions {
  std::string listen;  // "host:port", e.g. "0.0.0.0:8000"; port 0 = any free port
  // Bearer token required on /v1/*; empty = none. See ReadApiKeyFile.
  std::string api_key{};
  // The model id clients use; empty = the engine's ModelInfo::model_id.
  std::string served_model_name{};
  // Where tokenizer_config.json (with chat_template) is; empty = the model directory.
  std::string chat_template_dir{};
  ServingMetrics* metrics = nullptr;  // shared metrics; nullptr = the server's own
  bool protect_metrics = false;       // /metrics and /dashboard/data need api_key too
};

// Starts serving on options.listen. Without a chat template in tokenizer_config.json the
// server still starts (chat requests then get 400) and a warning is logged; a template that
// fails to parse is an error. InvalidArgument for a bad address, Unavailable when the port
// cannot be bound. The engine must outlive the returned server; Stop() it before the engine.
absl::StatusOr<std::unique_ptr<HttpServer>> StartHttpApi(Engine& engine,
                                                         const std::string& model_dir,
                                                         const HttpApiOptions& options);

// "host:port" -> (host, port); IPv6 as "[::1]:8000". InvalidArgument naming `what`.
absl::StatusOr<std::pair<std::string, int>> ParseListenAddress(const std::string& address,
                                                               const std::string& what);

// Reads an API key from a file (one line; surrounding whitespace dropped; a regular file of at
// most kMaxKeyFileBytes, common/bounded_file.h). InvalidArgument naming the path if the file is
// empty, not a regular file (a FIFO, a device) or too large; NotFound if it does not exist.
absl::StatusOr<std::string> ReadApiKeyFile(const std::string& path);

// Renders chat prompts with `chat_template` (thread-safe; shares the parsed template).
ChatRenderFn MakeChatRenderer(chat::ChatTemplate chat_template);

}  // namespace ringserve::http
