// Added tokens of tokenizer.json ("added_tokens"): finding them in text before the model runs.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"

namespace ringserve::tokenizer_internal {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;
};

// A piece of text after added-token extraction: either an added token (id >= 0) or plain text
// (id == -1) still to be pre-tokenized.
struct TextPiece {
  absl::string_view text;
  int32_t id;
};

// Leftmost-longest matcher over a set of added-token spellings (a byte trie), with Hugging
// Face's single_word / lstrip / rstrip rules: a single_word match is dropped when a word
// character (Rust regex's Unicode \w: Alphabetic, marks, decimal digits, connector punctuation,
// Join_Control) touches it on either side; lstrip / rstrip take Unicode White_Space. Immutable
// after Build; thread-safe.
class AddedTokenMatcher {
 public:
  // `patterns[i]` is how tokens[i] is spelled in the text it will be matched against.
  void Build(const std::vector<const AddedToken*>& tokens,
             const std::vector<std::string>& patterns);
  bool empty() const { return tokens_.empty(); }
  // Splits `text` into pieces, appending them to *out (empty plain pieces are dropped).
  void Split(absl::string_view text, std::vector<TextPiece>* out) const;

 private:
  struct Node {
    absl::flat_hash_map<unsigned char, int32_t> next;
    int32_t token = -1;  // index into tokens_ of the token spelled up to here
  };
  std::vector<const AddedToken*> tokens_;
  std::vector<Node> nodes_;               // nodes_[0] is the root
  std::array<int32_t, 256> root_next_{};  // root transitions, 0 for none
  int single_first_byte_ = -1;            // the only byte tokens start with, or -1
};

}  // namespace ringserve::tokenizer_internal
