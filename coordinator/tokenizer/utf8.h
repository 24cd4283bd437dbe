// UTF-8 helpers and the GPT-2 byte-level alphabet, shared by the tokenizer parts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "common/utf8.h"

namespace ringserve::tokenizer_internal {

// Offset of the first byte that does not belong to a well-formed UTF-8 sequence (overlongs,
// surrogates, code points above U+10FFFF and truncated sequences included), or nullopt.
std::optional<size_t> FindInvalidUtf8(absl::string_view text);

// Appends `bytes` to `out`, replacing each maximal ill-formed subpart with U+FFFD (the rule of
// Rust's String::from_utf8_lossy, which Hugging Face's decoders use).
void AppendUtf8Lossy(absl::string_view bytes, std::string* out);

// Length of the longest prefix of `bytes` that does not end inside a UTF-8 sequence that could
// still be completed by more bytes. Lossy-converting the prefix and the rest separately gives the
// same result as converting the whole.
size_t CompleteUtf8PrefixLength(absl::string_view bytes);

// Decodes the code point at `s[*pos]` of valid UTF-8 and advances *pos.
inline char32_t NextCodePoint(absl::string_view s, size_t* pos) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + *pos;
  if (p[0] < 0x80) {
    *pos += 1;
    return p[0];
  }
  if (p[0] < 0xE0) {
    *pos += 2;
    return ((p[0] & 0x1Fu) << 6) | (p[1] & 0x3Fu);
  }
  if (p[0] < 0xF0) {
    *pos += 3;
    return ((p[0] & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
  }
  *pos += 4;
  return ((p[0] & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3Fu);
}

// UTF-8 encoding of one code point (common/utf8.h).
inline void AppendCodePoint(char32_t cp, std::string* out) { AppendUtf8(cp, out); }

// GPT-2's reversible byte <-> printable character mapping ("Ġ" for a space).
char32_t ByteToCodePoint(uint8_t byte);
// The byte a byte-level character stands for, or -1 if `cp` is not in the alphabet.
int CodePointToByte(char32_t cp);
// Converts a byte-level string ("Ġhello") to raw bytes (" hello"); nullopt if some character is
// not in the byte-level alphabet.
std::optional<std::string> ByteLevelToBytes(absl::string_view token);
// Converts raw bytes to their byte-level string.
std::string BytesToByteLevel(absl::string_view bytes);

}  // namespace ringserve::tokenizer_internal
