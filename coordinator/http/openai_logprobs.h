// The OpenAI `logprobs` objects of a choice, from the engine's per-token log-probabilities
// (GenerateEvent::logprobs: raw-logit log_softmax, ringserve's and vLLM's convention).
// Pure functions; thread-safe when `token_text` is.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "coordinator/engine.h"
#include "nlohmann/json.hpp"

namespace ringserve::http {

// The text of one token id (the engine's Detokenize of that id alone).
using TokenTextFn = std::function<std::string(int32_t)>;

// Completions: {"tokens": [text], "token_logprobs": [f], "top_logprobs": [{text: f}] (null
// entries when no alternatives were asked), "text_offset": [int]}. text_offset counts bytes of
// the choice's text from `*text_offset`, which is advanced past these tokens (streaming keeps
// it between chunks). Alternatives whose texts coincide keep the most likely.
nlohmann::json CompletionLogprobsJson(const std::vector<TokenLogprobs>& tokens,
                                      const TokenTextFn& token_text, int64_t* text_offset);

// Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
// "bytes"}]}], "refusal": null}.
nlohmann::json ChatLogprobsJson(const std::vector<TokenLogprobs>& tokens,
                                const TokenTextFn& token_text);

}  // namespace ringserve::http
