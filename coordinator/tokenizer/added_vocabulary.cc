#include "coordinator/tokenizer/added_vocabulary.h"

#include <unicode/uchar.h>

#include <cstring>

#include "coordinator/tokenizer/utf8.h"

namespace ringserve::tokenizer_internal {
namespace {

bool IsWhitespace(char32_t c) { return u_hasBinaryProperty(c, UCHAR_WHITE_SPACE); }

// Rust regex's Unicode \w, which Hugging Face's single_word check uses (UTS #18): Alphabetic,
// marks, decimal digits, connector punctuation ('_' among them) and Join_Control.
bool IsWordCharacter(char32_t c) {
  return u_hasBinaryProperty(c, UCHAR_ALPHABETIC) || u_hasBinaryProperty(c, UCHAR_JOIN_CONTROL) ||
         (U_GET_GC_MASK(c) & (U_GC_M_MASK | U_GC_ND_MASK | U_GC_PC_MASK)) != 0;
}

size_t PreviousCharStart(absl::string_view text, size_t end) {
  size_t start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  return start;
}

}  // namespace

void AddedTokenMatcher::Build(const std::vector<const AddedToken*>& tokens,
                              const std::vector<std::string>& patterns) {
  tokens_ = tokens;
  nodes_.assign(1, Node());
  root_next_.fill(0);
  for (size_t t = 0; t < tokens.size(); ++t) {
    const std::string& pattern = patterns[t];
    if (pattern.empty()) continue;
    int32_t node = 0;
    for (unsigned char c : pattern) {
      auto it = nodes_[node].next.find(c);
      if (it == nodes_[node].next.end()) {
        nodes_.emplace_back();
        const int32_t child = static_cast<int32_t>(nodes_.size() - 1);
        nodes_[node].next[c] = child;
        if (node == 0) root_next_[c] = child;
        node = child;
      } else {
        node = it->second;
      }
    }
    // The first token added under a spelling wins, as in Hugging Face's pattern order.
    if (nodes_[node].token < 0) nodes_[node].token = static_cast<int32_t>(t);
  }
  single_first_byte_ = -1;
  for (int c = 0; c < 256; ++c) {
    if (root_next_[c] == 0) continue;
    single_first_byte_ = single_first_byte_ == -1 ? c : -2;
  }
  if (single_first_byte_ == -2) single_first_byte_ = -1;
}

void AddedTokenMatcher::Split(absl::string_view text, std::vector<TextPiece>* out) const {
  size_t emitted = 0;  // end of the last piece appended
  size_t pos = 0;
  const size_t n = text.size();
  while (pos < n) {
    if (single_first_byte_ >= 0) {
      const void* hit = std::memchr(text.data() + pos, single_first_byte_, n - pos);
      if (hit == nullptr) break;
      pos = static_cast<const char*>(hit) - text.data();
    }
    int32_t node = root_next_[static_cast<unsigned char>(text[pos])];
    if (node == 0) {
      ++pos;
      continue;
    }
    // Longest token starting at pos.
    int32_t found = -1;
    size_t found_end = 0;
    size_t i = pos + 1;
    while (true) {
      if (nodes_[node].token >= 0) {
        found = nodes_[node].token;
        found_end = i;
      }
      if (i >= n) break;
      auto it = nodes_[node].next.find(static_cast<unsigned char>(text[i]));
      if (it == nodes_[node].next.end()) break;
      node = it->second;
      ++i;
    }
    if (found < 0) {
      ++pos;
      continue;
    }
    const AddedToken& token = *tokens_[found];
    size_t start = pos;
    size_t stop = found_end;
    if (token.single_word) {
      bool word_before = false, word_after = false;
      if (start > 0) {
        size_t p = PreviousCharStart(text, start);
        word_before = IsWordCharacter(NextCodePoint(text, &p));
      }
      if (stop < n) {
        size_t p = stop;
        word_after = IsWordCharacter(NextCodePoint(text, &p));
      }
      if (word_before || word_after) {
        pos = found_end;
        continue;
      }
    }
    if (token.lstrip) {
      while (start > emitted) {
        const size_t prev = PreviousCharStart(text, start);
        size_t p = prev;
        if (!IsWhitespace(NextCodePoint(text, &p))) break;
        start = prev;
      }
    }
    if (token.rstrip) {
      while (stop < n) {
        size_t p = stop;
        if (!IsWhitespace(NextCodePoint(text, &p))) break;
        stop = p;
      }
    }
    if (start > emitted) out->push_back({text.substr(emitted, start - emitted), -1});
    out->push_back({text.substr(start, stop - start), token.id});
    emitted = stop;
    pos = stop;
  }
  if (n > emitted) out->push_back({text.substr(emitted), -1});
}

}  // namespace ringserve::tokenizer_internal
