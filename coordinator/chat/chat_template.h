// Chat templates: renders a Hugging Face `chat_template` (Jinja) exactly as transformers'
// `tokenizer.apply_chat_template(messages, tokenize=False, ...)` does, with our own small Jinja
// interpreter (coordinator/chat/jinja_*.h). Golden strings produced by transformers live in
// tests/fixtures/chat/ and are checked byte for byte by chat_template_test.
//
//   RS_ASSIGN_OR_RETURN(auto tmpl, ChatTemplate::FromTokenizerConfig(".deps/tokenizers/qwen3"));
//   RS_ASSIGN_OR_RETURN(std::string prompt,
//                       tmpl.Render(messages, {.add_generation_prompt = true,
//                                              .extra_kwargs = {{"enable_thinking", false}}}));
//
// JSON values use nlohmann::ordered_json: Python dicts keep insertion order and templates print
// them (`tool | tojson`), so key order is part of the output. Parse requests with
// nlohmann::ordered_json::parse to keep the client's key order (as transformers would).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace ringserve::chat {

namespace jinja {
class Template;
}  // namespace jinja

struct ChatRenderOptions {
  // Appends the assistant turn header (template variable `add_generation_prompt`).
  bool add_generation_prompt = false;
  // Template variable `tools`: null (the template sees None, as when transformers gets
  // tools=None) or an array of tool objects in OpenAI shape
  // ({"type": "function", "function": {"name", "description", "parameters"}}), passed as is.
  nlohmann::ordered_json tools = nullptr;
  // Extra template variables (a JSON object), e.g. {"enable_thinking": false} for Qwen3 or
  // {"date_string": "26 Jul 2024"} for Llama 3.1. They override the special tokens.
  nlohmann::ordered_json extra_kwargs = nlohmann::ordered_json::object();
  // Clock for the `strftime_now(format)` global, formatted in UTC (transformers uses the
  // host's local time); unset = now.
  std::optional<std::chrono::system_clock::time_point> now;
  // Render budget: statements, expression nodes, loop iterations and calls each cost a step
  // (so do the nodes that printing, dumping or comparing a value visits, and every 256 bytes
  // of string an operation reads); a render that needs more fails with InvalidArgument instead
  // of hanging.
  int64_t max_render_steps = 10'000'000;
  // Bytes of strings, lists and dicts a render may build in all, kept or not (jinja_budget.h);
  // a render that builds more fails with InvalidArgument instead of exhausting memory. The
  // rendered prompt itself is capped at 64 MiB.
  int64_t max_render_bytes = int64_t{512} << 20;
};

// An immutable, parsed chat template plus the tokenizer's special tokens (bos_token,
// eos_token, pad_token, unk_token, ... as strings; only those set in the config are defined
// in the template, like transformers' special_tokens_map).
// Cheap to copy (shares the parsed template). Render is const and thread-safe.
class ChatTemplate {
 public:
  // Reads `chat_template` and the special tokens from a tokenizer_config.json file, or from
  // `<dir>/tokenizer_config.json` when given a directory; there `<dir>/chat_template.jinja`
  // (where transformers 5 saves the template) takes precedence over the config's key, as in
  // transformers' loader. A `chat_template` that is a list of named templates ([{"name":
  // "default", "template": ...}, ...]) uses the one named "default". Files are read as regular
  // files of at most kMaxConfigJsonBytes (common/bounded_file.h). Errors: NotFound (no file / no
  // chat_template), InvalidArgument (bad JSON, a FIFO or device, a file too large, or a
  // template that does not parse: the message names the construct and the template line).
  static absl::StatusOr<ChatTemplate> FromTokenizerConfig(const std::string& path_or_dir);

  // From template source and a JSON object of special tokens ({"bos_token": "<s>", ...};
  // values may be strings, lists of strings, or AddedToken objects {"content": ...}).
  static absl::StatusOr<ChatTemplate> FromString(
      const std::string& source,
      const nlohmann::ordered_json& special_tokens = nlohmann::ordered_json::object());

  // Renders the conversation. `messages` is an array of OpenAI-shaped message objects
  // ({"role", "content", "tool_calls", "tool_call_id", "reasoning_content", ...}); they are
  // given to the template as is (no normalization, like transformers). Errors:
  // InvalidArgument when messages is not a non-empty array or the template fails at run time (type
  // errors, undefined values used as objects, `raise_exception(...)` from the template — its
  // message is included, unsupported filters/methods); the message names the template line.
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& messages,
                                     const ChatRenderOptions& options) const;

  const std::string& source() const;
  const nlohmann::ordered_json& special_tokens() const { return special_tokens_; }

 private:
  ChatTemplate(std::shared_ptr<const jinja::Template> tmpl, nlohmann::ordered_json special_tokens)
      : template_(std::move(tmpl)), special_tokens_(std::move(special_tokens)) {}

  std::shared_ptr<const jinja::Template> template_;
  nlohmann::ordered_json special_tokens_;  // name -> string or list of strings
};

}  // namespace ringserve::chat
