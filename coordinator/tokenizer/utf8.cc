#include "coordinator/tokenizer/utf8.h"

#include <array>

namespace ringserve::tokenizer_internal {
namespace {

// Length of the valid UTF-8 sequence starting at s[i], 0 if ill-formed there; *subpart gets the
// length of the maximal ill-formed subpart (>= 1) when it is ill-formed, and *truncated whether
// the input ended inside an otherwise valid prefix.
size_t SequenceAt(const unsigned char* s, size_t n, size_t i, size_t* subpart, bool* truncated) {
  *truncated = false;
  const unsigned char b = s[i];
  if (b < 0x80) return 1;
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) {
    need = 2;
  } else if (b >= 0xE0 && b <= 0xEF) {
    need = 3;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    need = 4;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    *subpart = 1;
    return 0;
  }
  size_t k = 1;
  for (; k < need; ++k) {
    if (i + k >= n) {
      *truncated = true;
      *subpart = k;
      return 0;
    }
    const unsigned char c = s[i + k];
    const unsigned char l = k == 1 ? lo : 0x80;
    const unsigned char h = k == 1 ? hi : 0xBF;
    if (c < l || c > h) {
      *subpart = k;
      return 0;
    }
  }
  return need;
}

struct ByteLevelTables {
  std::array<char32_t, 256> byte_to_cp;
  std::array<int, 324> cp_to_byte;
  ByteLevelTables() {
    cp_to_byte.fill(-1);
    int next = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      byte_to_cp[b] = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + next++);
      cp_to_byte[byte_to_cp[b]] = b;
    }
  }
};

const ByteLevelTables& Tables() {
  static const ByteLevelTables* tables = new ByteLevelTables();
  return *tables;
}

}  // namespace

std::optional<size_t> FindInvalidUtf8(absl::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    // Eight ASCII bytes at a time.
    while (i + 8 <= n) {
      uint64_t word;
      __builtin_memcpy(&word, s + i, 8);
      if (word & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= n) break;
    if (s[i] < 0x80) {
      ++i;
      continue;
    }
    size_t subpart;
    bool truncated;
    const size_t len = SequenceAt(s, n, i, &subpart, &truncated);
    if (len == 0) return i;
    i += len;
  }
  return std::nullopt;
}

void AppendUtf8Lossy(absl::string_view bytes, std::string* out) {
  const auto* s = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  size_t i = 0;
  size_t run_start = 0;
  while (i < n) {
    if (s[i] < 0x80) {
      ++i;
      continue;
    }
    size_t subpart;
    bool truncated;
    const size_t len = SequenceAt(s, n, i, &subpart, &truncated);
    if (len != 0) {
      i += len;
      continue;
    }
    out->append(bytes.data() + run_start, i - run_start);
    out->append("\xEF\xBF\xBD");
    i += subpart;
    run_start = i;
  }
  out->append(bytes.data() + run_start, n - run_start);
}

size_t CompleteUtf8PrefixLength(absl::string_view bytes) {
  const auto* s = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  // A sequence that may still complete starts with a lead byte at most 3 bytes from the end.
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const size_t i = n - back;
    if (s[i] >= 0xC2 && s[i] <= 0xF4) {
      size_t subpart;
      bool truncated;
      SequenceAt(s, n, i, &subpart, &truncated);
      return truncated ? i : n;
    }
    if (s[i] < 0x80 || s[i] > 0xBF) return n;
  }
  return n;
}

char32_t ByteToCodePoint(uint8_t byte) { return Tables().byte_to_cp[byte]; }

int CodePointToByte(char32_t cp) {
  return cp < Tables().cp_to_byte.size() ? Tables().cp_to_byte[cp] : -1;
}

std::optional<std::string> ByteLevelToBytes(absl::string_view token) {
  if (FindInvalidUtf8(token).has_value()) return std::nullopt;
  std::string out;
  out.reserve(token.size());
  size_t pos = 0;
  while (pos < token.size()) {
    const int b = CodePointToByte(NextCodePoint(token, &pos));
    if (b < 0) return std::nullopt;
    out.push_back(static_cast<char>(b));
  }
  return out;
}

std::string BytesToByteLevel(absl::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) AppendCodePoint(ByteToCodePoint(b), &out);
  return out;
}

}  // namespace ringserve::tokenizer_internal
