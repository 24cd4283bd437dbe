#include "coordinator/http/http_api.h"

#include <filesystem>

#include "absl/strings/numbers.h"
#include "common/bounded_file.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "fmt/format.h"

namespace ringserve::http {

absl::StatusOr<std::pair<std::string, int>> ParseListenAddress(const std::string& address,
                                                               const std::string& what) {
  size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    return absl::InvalidArgumentError(
        fmt::format("{}: '{}' is not HOST:PORT (e.g. 127.0.0.1:8000)", what, address));
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  int port = 0;
  if (!absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        fmt::format("{}: bad port in '{}' (0..65535)", what, address));
  }
  return std::make_pair(host, port);
}

absl::StatusOr<std::string> ReadApiKeyFile(const std::string& path) {
  RS_ASSIGN_OR_RETURN(std::string key, ReadBoundedFile(path, kMaxKeyFileBytes));
  const char* kSpace = " \t\r\n";
  key.erase(0, key.find_first_not_of(kSpace) == std::string::npos ? key.size()
                                                                  : key.find_first_not_of(kSpace));
  key.erase(key.find_last_not_of(kSpace) + 1);
  if (key.empty()) return absl::InvalidArgumentError(fmt::format("API key file {} is empty", path));
  if (key.find_first_of(kSpace) != std::string::npos) {
    return absl::InvalidArgumentError(
        fmt::format("API key file {}: the key must be one line without spaces", path));
  }
  return key;
}

ChatRenderFn MakeChatRenderer(chat::ChatTemplate chat_template) {
  return [chat_template = std::move(chat_template)](
             const nlohmann::ordered_json& messages, bool add_generation_prompt,
             const nlohmann::ordered_json& kwargs) -> absl::StatusOr<std::string> {
    chat::ChatRenderOptions options;
    options.add_generation_prompt = add_generation_prompt;
    options.extra_kwargs = kwargs;
    return chat_template.Render(messages, options);
  };
}

absl::StatusOr<std::unique_ptr<HttpServer>> StartHttpApi(Engine& engine,
                                                         const std::string& model_dir,
                                                         const HttpApiOptions& options) {
  RS_ASSIGN_OR_RETURN(auto address, ParseListenAddress(options.listen, "api.http"));
  std::string template_dir =
      options.chat_template_dir.empty() ? model_dir : options.chat_template_dir;
  ChatRenderFn render;
  absl::StatusOr<chat::ChatTemplate> chat_template =
      chat::ChatTemplate::FromTokenizerConfig(template_dir);
  if (chat_template.ok()) {
    render = MakeChatRenderer(std::move(*chat_template));
  } else if (absl::IsNotFound(chat_template.status())) {
    RS_LOG_WARN("HTTP: no chat template in {} ({}); /v1/chat/completions will answer 400",
                template_dir, std::string(chat_template.status().message()));
  } else {
    return chat_template.status();
  }
  auto server = std::make_unique<HttpServer>(
      engine, std::move(render),
      HttpServer::Options{.host = address.first,
                          .port = address.second,
                          .api_key = options.api_key,
                          .served_model_name = options.served_model_name,
                          .protect_metrics = options.protect_metrics,
                          .metrics = options.metrics});
  RS_RETURN_IF_ERROR(server->Start());
  return server;
}

}  // namespace ringserve::http
