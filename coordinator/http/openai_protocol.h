// The OpenAI wire format, separated from HTTP: parses /v1/completions and /v1/chat/completions
// request bodies into engine terms, and builds the response, stream-chunk and error JSON.
// Pure functions; thread-safe.
//
// Supported request fields: model, prompt (string, [string], token ids, [[token ids]]; one
// prompt only), messages, max_tokens / max_completion_tokens, temperature, top_p, top_k and
// seed, stop (string or list), stream, stream_options.include_usage, n (1..kMaxChoices),
// logprobs (completions: an integer 0..20, the alternatives per token; chat: a boolean, with
// top_logprobs 0..20), and the vLLM extensions ignore_eos, stop_token_ids, min_tokens,
// chat_template_kwargs, add_generation_prompt.
// Refused with 400 naming the field: echo, best_of > 1, suffix, logit_bias, non-zero
// presence/frequency penalties, tools, response_format other than text, and out-of-range values
// (n, logprobs, top_logprobs, top_logprobs without logprobs, min_tokens < 0).
// Other unknown fields are ignored, as most OpenAI-compatible servers do.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/engine.h"
#include "nlohmann/json.hpp"

namespace ringserve::http {

enum class ApiKind { kCompletion, kChat };

struct OpenAiRequest {
  ApiKind kind = ApiKind::kCompletion;
  std::string model;
  // Completions: exactly one of these is set.
  std::optional<std::string> prompt_text;
  std::optional<std::vector<int32_t>> prompt_ids;
  // Chat: the messages array as the client sent it (key order kept for the template).
  nlohmann::ordered_json messages;
  nlohmann::ordered_json chat_template_kwargs = nlohmann::ordered_json::object();
  bool add_generation_prompt = true;
  // max_tokens (or max_completion_tokens) when the client gave one.
  std::optional<int> max_tokens;
  SamplingParams sampling;  // everything but max_tokens, which the server resolves
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  int n = 1;                   // choices for the prompt
};

// Parse errors are InvalidArgument; the offending field is attached (ErrorParam reads it).
absl::StatusOr<OpenAiRequest> ParseCompletionRequest(std::string_view body);
absl::StatusOr<OpenAiRequest> ParseChatRequest(std::string_view body);

// An error as OpenAI reports it: HTTP status plus {"error": {message, type, param, code}}.
struct ApiError {
  int http_status = 500;
  std::string message{};
  std::string type = "server_error";
  std::string param{};  // empty = null
  std::string code{};   // empty = null
};

// InvalidArgument naming the request field `param`.
absl::Status InvalidParam(std::string_view param, std::string_view message);
// The field attached by InvalidParam, or "" when none.
std::string ErrorParam(const absl::Status& status);

// Maps a status to an OpenAI error: InvalidArgument/OutOfRange/FailedPrecondition 400,
// Unauthenticated 401, PermissionDenied 403, NotFound 404, ResourceExhausted 429,
// Unavailable 503, Cancelled 499, anything else 500.
ApiError ApiErrorFromStatus(const absl::Status& status);
nlohmann::json ApiErrorJson(const ApiError& error);

// "stop", "length", or null (not finished / cancelled / error).
nlohmann::json FinishReasonJson(FinishReason reason);
nlohmann::json UsageJson(const Usage& usage);

// Identity of one response: "cmpl-..." or "chatcmpl-...", unix seconds, served model name.
struct ResponseHeader {
  std::string id{};
  int64_t created = 0;
  std::string model{};
};

// One choice of a non-streaming body. `logprobs`: null, or openai_logprobs.h's object.
struct ChoiceOutput {
  int index = 0;
  std::string text{};
  FinishReason reason = FinishReason::kNone;
  nlohmann::json logprobs{};
};

// Non-streaming bodies.
nlohmann::json CompletionResponse(const ResponseHeader& header,
                                  const std::vector<ChoiceOutput>& choices, const Usage& usage);
nlohmann::json ChatResponse(const ResponseHeader& header, const std::vector<ChoiceOutput>& choices,
                            const Usage& usage);
// One choice (index 0, no logprobs).
nlohmann::json CompletionResponse(const ResponseHeader& header, const std::string& text,
                                  FinishReason reason, const Usage& usage);
nlohmann::json ChatResponse(const ResponseHeader& header, const std::string& text,
                            FinishReason reason, const Usage& usage);

// Streaming chunks. `reason` kNone means "not finished" (finish_reason null).
nlohmann::json CompletionChunk(const ResponseHeader& header, const std::string& text,
                               FinishReason reason, int index = 0,
                               nlohmann::json logprobs = nullptr);
// `first` adds role "assistant" to the delta; a finishing chunk has an empty delta when
// `text` is empty.
nlohmann::json ChatChunk(const ResponseHeader& header, const std::string& text, bool first,
                         FinishReason reason, int index = 0, nlohmann::json logprobs = nullptr);
// The final usage-only chunk of stream_options.include_usage (choices is empty).
nlohmann::json UsageChunk(ApiKind kind, const ResponseHeader& header, const Usage& usage);

// One server-sent event: "data: <json>\n\n".
std::string SseEvent(const nlohmann::json& payload);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

}  // namespace ringserve::http
