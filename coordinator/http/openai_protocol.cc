#include "coordinator/http/openai_protocol.h"

#include <cmath>
#include <limits>

#include "absl/strings/cord.h"
#include "common/json_limits.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "ring/sampling_config.h"

namespace ringserve::http {
namespace {

using Json = nlohmann::ordered_json;

constexpr char kParamPayload[] = "type.ringserve.dev/openai-param";
constexpr size_t kMaxStopStrings = 16;

bool IsNullish(const Json* value) { return value == nullptr || value->is_null(); }

const Json* Field(const Json& body, const char* name) {
  auto it = body.find(name);
  return it == body.end() ? nullptr : &*it;
}

absl::StatusOr<Json> ParseBody(std::string_view body) {
  if (absl::Status depth = CheckJsonDepth(body, "The request body"); !depth.ok()) {
    return InvalidParam("", std::string(depth.message()));
  }
  Json parsed = Json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) {
    return InvalidParam("", "The request body is not valid JSON.");
  }
  if (!parsed.is_object()) return InvalidParam("", "The request body must be a JSON object.");
  return parsed;
}

absl::Status ParseNumber(const Json& body, const char* name, double min, double max, float* out) {
  const Json* value = Field(body, name);
  if (IsNullish(value)) return absl::OkStatus();
  if (!value->is_number()) return InvalidParam(name, fmt::format("'{}' must be a number.", name));
  double number = value->get<double>();
  if (!std::isfinite(number) || number < min || number > max) {
    return InvalidParam(
        name, fmt::format("'{}' must be between {} and {}, got {}.", name, min, max, number));
  }
  *out = static_cast<float>(number);
  return absl::OkStatus();
}

absl::StatusOr<std::optional<int64_t>> ParseInteger(const Json& body, const char* name) {
  const Json* value = Field(body, name);
  if (IsNullish(value)) return std::optional<int64_t>();
  if (value->is_number_integer()) return std::optional<int64_t>(value->get<int64_t>());
  if (value->is_number_float()) {
    double number = value->get<double>();
    if (std::isfinite(number) && std::floor(number) == number && std::fabs(number) < 1e15) {
      return std::optional<int64_t>(static_cast<int64_t>(number));
    }
  }
  return InvalidParam(name, fmt::format("'{}' must be an integer.", name));
}

absl::StatusOr<bool> ParseBool(const Json& body, const char* name, bool fallback) {
  const Json* value = Field(body, name);
  if (IsNullish(value)) return fallback;
  if (!value->is_boolean()) return InvalidParam(name, fmt::format("'{}' must be a boolean.", name));
  return value->get<bool>();
}

absl::StatusOr<std::vector<int32_t>> ParseTokenArray(const Json& array, const char* name) {
  std::vector<int32_t> ids;
  ids.reserve(array.size());
  for (const Json& item : array) {
    if (!item.is_number_integer() || item.get<int64_t>() < 0 ||
        item.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      return InvalidParam(name, fmt::format("'{}' token ids must be non-negative integers.", name));
    }
    ids.push_back(static_cast<int32_t>(item.get<int64_t>()));
  }
  return ids;
}

// Fields that change what a response contains in ways we do not implement: refusing them is
// better than silently answering something else.
absl::Status RefuseUnsupported(const Json& body, ApiKind kind) {
  absl::StatusOr<std::optional<int64_t>> best_of = ParseInteger(body, "best_of");
  if (!best_of.ok()) return best_of.status();
  if (best_of->has_value() && **best_of != 1) {
    return InvalidParam("best_of", "Only best_of=1 is supported.");
  }
  absl::StatusOr<bool> echo = ParseBool(body, "echo", false);
  if (!echo.ok()) return echo.status();
  if (*echo) return InvalidParam("echo", "echo is not supported by this server.");
  if (const Json* suffix = Field(body, "suffix");
      !IsNullish(suffix) && !(suffix->is_string() && suffix->get<std::string>().empty())) {
    return InvalidParam("suffix", "suffix is not supported by this server.");
  }
  if (const Json* bias = Field(body, "logit_bias"); !IsNullish(bias) && !bias->empty()) {
    return InvalidParam("logit_bias", "logit_bias is not supported by this server.");
  }
  for (const char* penalty : {"presence_penalty", "frequency_penalty"}) {
    if (const Json* value = Field(body, penalty);
        !IsNullish(value) && !(value->is_number() && value->get<double>() == 0)) {
      return InvalidParam(penalty, fmt::format("{} is not supported by this server.", penalty));
    }
  }
  if (kind == ApiKind::kChat) {
    if (const Json* tools = Field(body, "tools"); !IsNullish(tools) && !tools->empty()) {
      return InvalidParam("tools", "tools are not supported by this server.");
    }
    if (const Json* format = Field(body, "response_format"); !IsNullish(format)) {
      const Json* type = format->is_object() ? Field(*format, "type") : nullptr;
      if (type == nullptr || !type->is_string() || type->get<std::string>() != "text") {
        return InvalidParam("response_format",
                            "Only response_format {\"type\": \"text\"} is "
                            "supported by this server.");
      }
    }
  }
  return absl::OkStatus();
}

// Integer field in [min, max] (absent: unchanged).
absl::Status ParseBoundedInt(const Json& body, const char* name, int64_t min, int64_t max,
                             int* out) {
  RS_ASSIGN_OR_RETURN(std::optional<int64_t> value, ParseInteger(body, name));
  if (!value.has_value()) return absl::OkStatus();
  if (*value < min || *value > max) {
    return InvalidParam(
        name, fmt::format("'{}' must be between {} and {}, got {}.", name, min, max, *value));
  }
  *out = static_cast<int>(*value);
  return absl::OkStatus();
}

// n, logprobs / top_logprobs (completions: logprobs is the number of alternatives; chat: a
// boolean with top_logprobs beside it) and vLLM's min_tokens.
absl::Status ParseChoiceOptions(const Json& body, ApiKind kind, OpenAiRequest* request) {
  SamplingParams& sampling = request->sampling;
  RS_RETURN_IF_ERROR(ParseBoundedInt(body, "n", 1, kMaxChoices, &request->n));
  if (kind == ApiKind::kCompletion) {
    const Json* logprobs = Field(body, "logprobs");
    if (!IsNullish(logprobs)) {
      if (logprobs->is_boolean()) {
        return InvalidParam("logprobs", fmt::format("'logprobs' must be an integer between 0 and "
                                                    "{} for completions.",
                                                    kMaxTopLogprobs));
      }
      RS_RETURN_IF_ERROR(
          ParseBoundedInt(body, "logprobs", 0, kMaxTopLogprobs, &sampling.top_logprobs));
      sampling.logprobs = true;
    }
  } else {
    RS_ASSIGN_OR_RETURN(sampling.logprobs, ParseBool(body, "logprobs", false));
    RS_RETURN_IF_ERROR(
        ParseBoundedInt(body, "top_logprobs", 0, kMaxTopLogprobs, &sampling.top_logprobs));
    if (sampling.top_logprobs > 0 && !sampling.logprobs) {
      return InvalidParam("top_logprobs", "'top_logprobs' needs 'logprobs' set to true.");
    }
  }
  RS_RETURN_IF_ERROR(ParseBoundedInt(body, "min_tokens", 0, std::numeric_limits<int32_t>::max(),
                                     &sampling.min_tokens));
  return absl::OkStatus();
}

absl::Status ParseCommon(const Json& body, ApiKind kind, OpenAiRequest* request) {
  request->kind = kind;
  const Json* model = Field(body, "model");
  if (IsNullish(model)) return InvalidParam("model", "'model' is required.");
  if (!model->is_string()) return InvalidParam("model", "'model' must be a string.");
  request->model = model->get<std::string>();

  RS_RETURN_IF_ERROR(RefuseUnsupported(body, kind));

  SamplingParams& sampling = request->sampling;
  sampling.temperature = 1.0f;  // OpenAI's default; 0 means greedy
  RS_RETURN_IF_ERROR(ParseNumber(body, "temperature", 0, 2, &sampling.temperature));
  RS_RETURN_IF_ERROR(ParseNumber(body, "top_p", 0, 1, &sampling.top_p));
  if (sampling.top_p == 0) {
    return InvalidParam("top_p", "'top_p' must be greater than 0.");
  }
  RS_ASSIGN_OR_RETURN(std::optional<int64_t> top_k, ParseInteger(body, "top_k"));
  if (top_k.has_value()) {
    if (*top_k < -1 || *top_k > std::numeric_limits<int32_t>::max()) {
      return InvalidParam("top_k", "'top_k' must be -1 or 0 (off) or a positive integer.");
    }
    sampling.top_k = *top_k < 0 ? 0 : static_cast<int>(*top_k);
  }
  RS_ASSIGN_OR_RETURN(std::optional<int64_t> seed, ParseInteger(body, "seed"));
  if (seed.has_value()) sampling.seed = static_cast<uint64_t>(*seed);

  for (const char* name : {"max_completion_tokens", "max_tokens"}) {
    RS_ASSIGN_OR_RETURN(std::optional<int64_t> max_tokens, ParseInteger(body, name));
    if (!max_tokens.has_value()) continue;
    if (*max_tokens < 1 || *max_tokens > std::numeric_limits<int32_t>::max()) {
      return InvalidParam(name, fmt::format("'{}' must be at least 1, got {}.", name, *max_tokens));
    }
    request->max_tokens = static_cast<int>(*max_tokens);
    break;
  }

  if (const Json* stop = Field(body, "stop"); !IsNullish(stop)) {
    if (stop->is_string()) {
      sampling.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      if (stop->size() > kMaxStopStrings) {
        return InvalidParam("stop", fmt::format("At most {} stop strings.", kMaxStopStrings));
      }
      for (const Json& item : *stop) {
        if (!item.is_string()) return InvalidParam("stop", "'stop' must be strings.");
        sampling.stop.push_back(item.get<std::string>());
      }
    } else {
      return InvalidParam("stop", "'stop' must be a string or a list of strings.");
    }
    for (const std::string& text : sampling.stop) {
      if (text.empty()) return InvalidParam("stop", "Stop strings must not be empty.");
    }
  }
  if (const Json* ids = Field(body, "stop_token_ids"); !IsNullish(ids)) {
    if (!ids->is_array()) return InvalidParam("stop_token_ids", "must be a list of token ids.");
    RS_ASSIGN_OR_RETURN(sampling.stop_token_ids, ParseTokenArray(*ids, "stop_token_ids"));
  }
  RS_ASSIGN_OR_RETURN(sampling.ignore_eos, ParseBool(body, "ignore_eos", false));
  RS_RETURN_IF_ERROR(ParseChoiceOptions(body, kind, request));

  RS_ASSIGN_OR_RETURN(request->stream, ParseBool(body, "stream", false));
  if (const Json* options = Field(body, "stream_options"); !IsNullish(options)) {
    if (!options->is_object()) {
      return InvalidParam("stream_options", "'stream_options' must be an object.");
    }
    if (!request->stream) {
      return InvalidParam("stream_options", "'stream_options' is only allowed with stream=true.");
    }
    absl::StatusOr<bool> include = ParseBool(*options, "include_usage", false);
    if (!include.ok()) {
      return InvalidParam("stream_options.include_usage", "'include_usage' must be a boolean.");
    }
    request->include_usage = *include;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status InvalidParam(std::string_view param, std::string_view message) {
  absl::Status status =
      absl::InvalidArgumentError(absl::string_view(message.data(), message.size()));
  if (!param.empty())
    status.SetPayload(kParamPayload, absl::Cord(absl::string_view(param.data(), param.size())));
  return status;
}

std::string ErrorParam(const absl::Status& status) {
  absl::optional<absl::Cord> payload = status.GetPayload(kParamPayload);
  return payload.has_value() ? std::string(*payload) : std::string();
}

absl::StatusOr<OpenAiRequest> ParseCompletionRequest(std::string_view body) {
  RS_ASSIGN_OR_RETURN(Json json, ParseBody(body));
  OpenAiRequest request;
  RS_RETURN_IF_ERROR(ParseCommon(json, ApiKind::kCompletion, &request));
  const Json* prompt = Field(json, "prompt");
  if (IsNullish(prompt)) return InvalidParam("prompt", "'prompt' is required.");
  const char* kShape =
      "'prompt' must be a string, a list of token ids, or a list with one of those.";
  const Json* single = prompt;
  if (prompt->is_array() && !prompt->empty() && !(*prompt)[0].is_number()) {
    if (prompt->size() != 1) {
      return InvalidParam("prompt", "Only one prompt per request is supported.");
    }
    single = &(*prompt)[0];
  }
  if (single->is_string()) {
    request.prompt_text = single->get<std::string>();
    if (request.prompt_text->empty()) return InvalidParam("prompt", "'prompt' must not be empty.");
  } else if (single->is_array()) {
    RS_ASSIGN_OR_RETURN(request.prompt_ids, ParseTokenArray(*single, "prompt"));
    if (request.prompt_ids->empty()) return InvalidParam("prompt", "'prompt' must not be empty.");
  } else {
    return InvalidParam("prompt", kShape);
  }
  return request;
}

absl::StatusOr<OpenAiRequest> ParseChatRequest(std::string_view body) {
  RS_ASSIGN_OR_RETURN(Json json, ParseBody(body));
  OpenAiRequest request;
  RS_RETURN_IF_ERROR(ParseCommon(json, ApiKind::kChat, &request));
  const Json* messages = Field(json, "messages");
  if (IsNullish(messages)) return InvalidParam("messages", "'messages' is required.");
  if (!messages->is_array() || messages->empty()) {
    return InvalidParam("messages", "'messages' must be a non-empty list.");
  }
  for (size_t i = 0; i < messages->size(); ++i) {
    const Json& message = (*messages)[i];
    std::string where = fmt::format("messages[{}]", i);
    if (!message.is_object()) return InvalidParam(where, "Each message must be an object.");
    const Json* role = Field(message, "role");
    if (IsNullish(role) || !role->is_string()) {
      return InvalidParam(where + ".role", "Each message needs a string 'role'.");
    }
    const Json* content = Field(message, "content");
    if (content != nullptr && !content->is_null() && !content->is_string() &&
        !content->is_array()) {
      return InvalidParam(where + ".content", "'content' must be a string or a list of parts.");
    }
    if (content != nullptr && content->is_array()) {
      // The served models read text only: an image, audio or file part would be dropped.
      for (size_t p = 0; p < content->size(); ++p) {
        const Json& part = (*content)[p];
        const std::string at = fmt::format("{}.content[{}]", where, p);
        const Json* type = part.is_object() ? Field(part, "type") : nullptr;
        if (type == nullptr || !type->is_string()) {
          return InvalidParam(at, "Each content part must be an object with a string 'type'.");
        }
        if (type->get<std::string>() != "text") {
          return InvalidParam(at, fmt::format("Content part type '{}' is not supported: this "
                                              "server's models take text parts only.",
                                              type->get<std::string>()));
        }
        const Json* text = Field(part, "text");
        if (text == nullptr || !text->is_string()) {
          return InvalidParam(at, "A text content part needs a string 'text'.");
        }
      }
    }
  }
  request.messages = *messages;
  if (const Json* kwargs = Field(json, "chat_template_kwargs"); !IsNullish(kwargs)) {
    if (!kwargs->is_object()) {
      return InvalidParam("chat_template_kwargs", "'chat_template_kwargs' must be an object.");
    }
    request.chat_template_kwargs = *kwargs;
  }
  RS_ASSIGN_OR_RETURN(request.add_generation_prompt,
                      ParseBool(json, "add_generation_prompt", true));
  return request;
}

ApiError ApiErrorFromStatus(const absl::Status& status) {
  ApiError error;
  error.message = std::string(status.message());
  error.param = ErrorParam(status);
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
      error.http_status = 400;
      error.type = "invalid_request_error";
      break;
    case absl::StatusCode::kUnauthenticated:
      error.http_status = 401;
      error.type = "invalid_request_error";
      error.code = "invalid_api_key";
      break;
    case absl::StatusCode::kPermissionDenied:
      error.http_status = 403;
      error.type = "invalid_request_error";
      break;
    case absl::StatusCode::kNotFound:
      error.http_status = 404;
      error.type = "invalid_request_error";
      break;
    case absl::StatusCode::kResourceExhausted:
      error.http_status = 429;
      error.type = "rate_limit_exceeded";
      error.code = "rate_limit_exceeded";
      break;
    case absl::StatusCode::kUnavailable:
      error.http_status = 503;
      error.type = "server_error";
      error.code = "service_unavailable";
      break;
    case absl::StatusCode::kCancelled:
      error.http_status = 499;
      error.type = "invalid_request_error";
      break;
    default:
      error.http_status = 500;
      error.type = "server_error";
      break;
  }
  return error;
}

nlohmann::json ApiErrorJson(const ApiError& error) {
  nlohmann::json body;
  body["error"]["message"] = error.message;
  body["error"]["type"] = error.type;
  body["error"]["param"] = error.param.empty() ? nlohmann::json() : nlohmann::json(error.param);
  body["error"]["code"] = error.code.empty() ? nlohmann::json() : nlohmann::json(error.code);
  return body;
}

nlohmann::json FinishReasonJson(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    default:
      return nullptr;
  }
}

nlohmann::json UsageJson(const Usage& usage) {
  return {{"prompt_tokens", usage.prompt_tokens},
          {"completion_tokens", usage.completion_tokens},
          {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
}

namespace {

nlohmann::json Envelope(const ResponseHeader& header, const char* object) {
  return {{"id", header.id},
          {"object", object},
          {"created", header.created},
          {"model", header.model},
          {"system_fingerprint", nullptr}};
}

}  // namespace

nlohmann::json CompletionResponse(const ResponseHeader& header,
                                  const std::vector<ChoiceOutput>& choices, const Usage& usage) {
  nlohmann::json body = Envelope(header, "text_completion");
  body["choices"] = nlohmann::json::array();
  for (const ChoiceOutput& c : choices) {
    body["choices"].push_back({{"index", c.index},
                               {"text", c.text},
                               {"logprobs", c.logprobs},
                               {"finish_reason", FinishReasonJson(c.reason)}});
  }
  body["usage"] = UsageJson(usage);
  return body;
}

nlohmann::json ChatResponse(const ResponseHeader& header, const std::vector<ChoiceOutput>& choices,
                            const Usage& usage) {
  nlohmann::json body = Envelope(header, "chat.completion");
  body["choices"] = nlohmann::json::array();
  for (const ChoiceOutput& c : choices) {
    body["choices"].push_back(
        {{"index", c.index},
         {"message", {{"role", "assistant"}, {"content", c.text}, {"refusal", nullptr}}},
         {"logprobs", c.logprobs},
         {"finish_reason", FinishReasonJson(c.reason)}});
  }
  body["usage"] = UsageJson(usage);
  return body;
}

nlohmann::json CompletionResponse(const ResponseHeader& header, const std::string& text,
                                  FinishReason reason, const Usage& usage) {
  return CompletionResponse(header, {{.text = text, .reason = reason}}, usage);
}

nlohmann::json ChatResponse(const ResponseHeader& header, const std::string& text,
                            FinishReason reason, const Usage& usage) {
  return ChatResponse(header, {{.text = text, .reason = reason}}, usage);
}

nlohmann::json CompletionChunk(const ResponseHeader& header, const std::string& text,
                               FinishReason reason, int index, nlohmann::json logprobs) {
  nlohmann::json body = Envelope(header, "text_completion");
  body["choices"] = nlohmann::json::array({{{"index", index},
                                            {"text", text},
                                            {"logprobs", std::move(logprobs)},
                                            {"finish_reason", FinishReasonJson(reason)}}});
  return body;
}

nlohmann::json ChatChunk(const ResponseHeader& header, const std::string& text, bool first,
                         FinishReason reason, int index, nlohmann::json logprobs) {
  nlohmann::json body = Envelope(header, "chat.completion.chunk");
  nlohmann::json delta = nlohmann::json::object();
  if (first) delta["role"] = "assistant";
  if (!text.empty() || (first && reason == FinishReason::kNone)) delta["content"] = text;
  body["choices"] = nlohmann::json::array({{{"index", index},
                                            {"delta", delta},
                                            {"logprobs", std::move(logprobs)},
                                            {"finish_reason", FinishReasonJson(reason)}}});
  return body;
}

nlohmann::json UsageChunk(ApiKind kind, const ResponseHeader& header, const Usage& usage) {
  nlohmann::json body =
      Envelope(header, kind == ApiKind::kChat ? "chat.completion.chunk" : "text_completion");
  body["choices"] = nlohmann::json::array();
  body["usage"] = UsageJson(usage);
  return body;
}

std::string SseEvent(const nlohmann::json& payload) {
  // dump() with replace: engine text is valid UTF-8, but never let a stray byte throw.
  return "data: " + payload.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n\n";
}

}  // namespace ringserve::http
