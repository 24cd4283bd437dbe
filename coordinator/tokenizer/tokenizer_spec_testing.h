// Pieces of hand-built tokenizer.json files for the tokenizer tests (test code only): the
// byte-level vocabulary they start from and a builder that fails the test when a spec is refused.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "coordinator/tokenizer/tokenizer.h"
#include "coordinator/tokenizer/utf8.h"

namespace ringserve::tokenizer_testing {

// A BPE vocab of the 256 byte-level characters (the GPT-2 byte-to-code-point map: "Ġ" for ' '),
// each with its byte as its id. Tokens added on top take ids from 256.
inline nlohmann::json ByteLevelVocab() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) {
    std::string token;
    tokenizer_internal::AppendCodePoint(tokenizer_internal::ByteToCodePoint(b), &token);
    vocab[token] = b;
  }
  return vocab;
}

// Tokenizer::FromJson(spec, config) with default options. A refused spec fails the calling test
// (non-fatally, naming the status) and gives nullptr.
inline std::unique_ptr<Tokenizer> BuildTokenizer(const nlohmann::json& spec,
                                                 const std::string& config = "") {
  auto tokenizer = Tokenizer::FromJson(spec.dump(), config, {});
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? std::move(tokenizer).value() : nullptr;
}

}  // namespace ringserve::tokenizer_testing
