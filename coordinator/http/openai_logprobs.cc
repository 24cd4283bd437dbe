#include "coordinator/http/openai_logprobs.h"

namespace ringserve::http {
namespace {

nlohmann::json Bytes(const std::string& text) {
  nlohmann::json out = nlohmann::json::array();
  for (unsigned char c : text) out.push_back(static_cast<int>(c));
  return out;
}

// nlohmann::json refuses to serialize invalid UTF-8 by default; a token may be part of a
// multi-byte character. Callers dump with error_handler_t::replace, so keep the text as is.
nlohmann::json Entry(const std::string& text, float logprob) {
  return {{"token", text}, {"logprob", logprob}, {"bytes", Bytes(text)}};
}

}  // namespace

nlohmann::json CompletionLogprobsJson(const std::vector<TokenLogprobs>& tokens,
                                      const TokenTextFn& token_text, int64_t* text_offset) {
  nlohmann::json texts = nlohmann::json::array(), logprobs = nlohmann::json::array(),
                 tops = nlohmann::json::array(), offsets = nlohmann::json::array();
  for (const TokenLogprobs& t : tokens) {
    const std::string text = token_text(t.token_id);
    texts.push_back(text);
    logprobs.push_back(t.logprob);
    offsets.push_back(*text_offset);
    *text_offset += static_cast<int64_t>(text.size());
    if (t.top.empty()) {
      tops.push_back(nullptr);
      continue;
    }
    nlohmann::json top = nlohmann::json::object();
    for (const auto& [id, logprob] : t.top) {
      const std::string alt = token_text(id);
      if (!top.contains(alt)) top[alt] = logprob;  // most likely first
    }
    tops.push_back(std::move(top));
  }
  return {{"tokens", std::move(texts)},
          {"token_logprobs", std::move(logprobs)},
          {"top_logprobs", std::move(tops)},
          {"text_offset", std::move(offsets)}};
}

nlohmann::json ChatLogprobsJson(const std::vector<TokenLogprobs>& tokens,
                                const TokenTextFn& token_text) {
  nlohmann::json content = nlohmann::json::array();
  for (const TokenLogprobs& t : tokens) {
    nlohmann::json entry = Entry(token_text(t.token_id), t.logprob);
    nlohmann::json top = nlohmann::json::array();
    for (const auto& [id, logprob] : t.top) top.push_back(Entry(token_text(id), logprob));
    entry["top_logprobs"] = std::move(top);
    content.push_back(std::move(entry));
  }
  return {{"content", std::move(content)}, {"refusal", nullptr}};
}

}  // namespace ringserve::http
