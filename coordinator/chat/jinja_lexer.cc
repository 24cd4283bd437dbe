// Splits a template into text and tags the way Jinja's lexer does with transformers'
// settings: trim_blocks (drop the first newline after a block or comment tag), lstrip_blocks
// (drop spaces before a block or comment tag that starts its line), `-` / `+` whitespace
// control, and no trailing newline.
#include <cctype>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "coordinator/chat/jinja_ast.h"

namespace ringserve::chat::jinja {
namespace {

absl::Status LexError(int line, const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat("chat template syntax error at line ", line, ": ", what));
}

// Python str.rstrip(): strips trailing Unicode whitespace.
std::string RStripSpace(const std::string& s) {
  std::vector<char32_t> cps = DecodeUtf8(s);
  while (!cps.empty() && IsPySpace(cps.back())) cps.pop_back();
  return EncodeUtf8(cps);
}

bool AllSpace(const std::string& s) {
  if (s.empty()) return false;
  for (char32_t cp : DecodeUtf8(s)) {
    if (!IsPySpace(cp)) return false;
  }
  return true;
}

// Python's `\s*` after a `-%}`: skips Unicode whitespace from pos.
size_t SkipSpace(const std::string& s, size_t pos) {
  while (pos < s.size()) {
    unsigned char c = s[pos];
    if (c < 0x80) {
      if (!IsPySpace(c)) break;
      ++pos;
      continue;
    }
    size_t len = (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
    std::vector<char32_t> cp = DecodeUtf8(s.substr(pos, len));
    if (cp.size() != 1 || !IsPySpace(cp[0])) break;
    pos += len;
  }
  return pos;
}

int CountNewlines(const std::string& s, size_t begin, size_t end) {
  int n = 0;
  for (size_t i = begin; i < end && i < s.size(); ++i) n += s[i] == '\n';
  return n;
}

// Decodes a string literal body like Python's "unicode-escape" codec (what Jinja uses).
absl::StatusOr<std::string> Unescape(const std::string& body, int line) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    char c = body[i];
    if (c != '\\' || i + 1 >= body.size()) {
      out.push_back(c);
      continue;
    }
    char n = body[++i];
    auto hex = [&](int digits) -> absl::StatusOr<char32_t> {
      if (i + digits >= body.size()) return LexError(line, "truncated \\x/\\u escape");
      char32_t v = 0;
      for (int k = 1; k <= digits; ++k) {
        char h = body[i + k];
        if (!std::isxdigit(static_cast<unsigned char>(h))) {
          return LexError(line, "truncated \\x/\\u escape in string literal");
        }
        v = v * 16 +
            (std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
      }
      i += digits;
      return v;
    };
    switch (n) {
      case '\n':
        break;
      case '\\':
        out.push_back('\\');
        break;
      case '\'':
        out.push_back('\'');
        break;
      case '"':
        out.push_back('"');
        break;
      case 'a':
        out.push_back('\a');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'v':
        out.push_back('\v');
        break;
      case 'x':
      case 'u':
      case 'U': {
        auto v = hex(n == 'x' ? 2 : n == 'u' ? 4 : 8);
        if (!v.ok()) return v.status();
        if (*v > 0x10FFFF) return LexError(line, "illegal Unicode character in string literal");
        AppendUtf8(*v, &out);
        break;
      }
      case 'N':
        return LexError(line, "\\N{...} escapes are not supported");
      default:
        if (n >= '0' && n <= '7') {
          char32_t v = n - '0';
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7';
               ++k) {
            v = v * 8 + (body[++i] - '0');
          }
          AppendUtf8(v, &out);
        } else {
          out.push_back('\\');
          out.push_back(n);
        }
    }
  }
  return out;
}

const char* const kOps[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "[",
                            "]",  "(",  ")",  "{",  "}",  "=",  ".", ":", "|", ",", ";", "<", ">"};

// Tokenizes a tag body starting at pos until its end marker (at bracket depth 0).
// `block` selects %} (else }}). On return pos is just past the end marker; *strip_after is
// '-' or '+' when the marker carried one.
absl::Status LexTag(const std::string& src, bool block, size_t& pos, int& line,
                    std::vector<Token>* tokens, char* strip_after) {
  int depth = 0;
  const char end_char = block ? '%' : '}';
  while (true) {
    while (pos < src.size() && std::isspace(static_cast<unsigned char>(src[pos]))) {
      line += src[pos] == '\n';
      ++pos;
    }
    if (pos >= src.size()) {
      return LexError(line, block ? "unexpected end of template, expected '%}'"
                                  : "unexpected end of template, expected '}}'");
    }
    if (depth == 0) {
      for (char sign : {'-', '+', '\0'}) {
        if (sign == '+' && !block) continue;
        size_t p = pos;
        if (sign != '\0') {
          if (src[p] != sign) continue;
          ++p;
        }
        if (src.compare(p, 2, std::string{end_char, '}'}) == 0) {
          pos = p + 2;
          *strip_after = sign;
          Token end;
          end.kind = Token::Kind::kEnd;
          end.line = line;
          tokens->push_back(std::move(end));
          return absl::OkStatus();
        }
      }
    }
    char c = src[pos];
    Token tok;
    tok.line = line;
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t b = pos;
      while (pos < src.size() &&
             (std::isalnum(static_cast<unsigned char>(src[pos])) || src[pos] == '_')) {
        ++pos;
      }
      tok.kind = Token::Kind::kName;
      tok.text = src.substr(b, pos - b);
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t b = pos;
      auto digits = [&]() {
        while (pos < src.size() && (std::isdigit(static_cast<unsigned char>(src[pos])) ||
                                    (src[pos] == '_' && pos + 1 < src.size() &&
                                     std::isdigit(static_cast<unsigned char>(src[pos + 1]))))) {
          ++pos;
        }
      };
      digits();
      bool is_float = false;
      if (pos + 1 < src.size() && src[pos] == '.' &&
          std::isdigit(static_cast<unsigned char>(src[pos + 1]))) {
        ++pos;
        digits();
        is_float = true;
      }
      if (pos < src.size() && (src[pos] == 'e' || src[pos] == 'E')) {
        size_t p = pos + 1;
        if (p < src.size() && (src[p] == '+' || src[p] == '-')) ++p;
        if (p < src.size() && std::isdigit(static_cast<unsigned char>(src[p]))) {
          pos = p;
          digits();
          is_float = true;
        }
      }
      std::string text;
      for (size_t k = b; k < pos; ++k) {
        if (src[k] != '_') text.push_back(src[k]);
      }
      if (is_float) {
        tok.kind = Token::Kind::kFloat;
        tok.float_value = std::strtod(text.c_str(), nullptr);
      } else {
        tok.kind = Token::Kind::kInt;
        Int v = 0;
        for (char d : text) {
          if (v > (Int(1) << 120)) return LexError(line, "integer literal too large");
          v = v * 10 + (d - '0');
        }
        tok.int_value = v;
      }
      tok.text = text;
    } else if (c == '\'' || c == '"') {
      size_t b = ++pos;
      while (pos < src.size() && src[pos] != c) {
        if (src[pos] == '\\') ++pos;
        ++pos;
      }
      if (pos >= src.size()) return LexError(line, "unterminated string literal");
      std::string body = src.substr(b, pos - b);
      ++pos;
      auto decoded = Unescape(body, line);
      if (!decoded.ok()) return decoded.status();
      tok.kind = Token::Kind::kString;
      tok.text = *std::move(decoded);
      line += CountNewlines(body, 0, body.size());
    } else {
      bool matched = false;
      for (const char* op : kOps) {
        size_t n = std::strlen(op);
        if (src.compare(pos, n, op) == 0) {
          tok.kind = Token::Kind::kOp;
          tok.text = op;
          pos += n;
          matched = true;
          break;
        }
      }
      if (!matched) {
        return LexError(line, absl::StrCat("unexpected character '", std::string(1, c), "'"));
      }
      if (tok.text == "(" || tok.text == "[" || tok.text == "{") ++depth;
      if (tok.text == ")" || tok.text == "]" || tok.text == "}") {
        if (depth == 0) return LexError(line, absl::StrCat("unexpected '", tok.text, "'"));
        --depth;
      }
    }
    tokens->push_back(std::move(tok));
  }
}

}  // namespace

absl::StatusOr<std::vector<Chunk>> Lex(const std::string& raw_source) {
  // Jinja normalizes newlines and drops one trailing newline (keep_trailing_newline=False).
  std::string src;
  src.reserve(raw_source.size());
  for (size_t i = 0; i < raw_source.size(); ++i) {
    if (raw_source[i] == '\r') {
      src.push_back('\n');
      if (i + 1 < raw_source.size() && raw_source[i + 1] == '\n') ++i;
    } else {
      src.push_back(raw_source[i]);
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();

  std::vector<Chunk> chunks;
  size_t pos = 0;
  int line = 1;
  bool line_starting = true;
  auto emit_data = [&](std::string text, int at_line) {
    if (text.empty()) return;
    Chunk c;
    c.text = std::move(text);
    c.line = at_line;
    chunks.push_back(std::move(c));
  };
  // Whitespace control for the text in front of a tag.
  auto strip_before = [&](std::string text, char sign, bool lstrip) {
    if (sign == '-') return RStripSpace(text);
    if (sign != '+' && lstrip) {
      size_t l_pos = text.rfind('\n');
      l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
      if ((l_pos > 0 || line_starting) && AllSpace(text.substr(l_pos))) text.resize(l_pos);
    }
    return text;
  };
  while (pos < src.size()) {
    size_t start = src.find('{', pos);
    while (start != std::string::npos && start + 1 < src.size() && src[start + 1] != '{' &&
           src[start + 1] != '%' && src[start + 1] != '#') {
      start = src.find('{', start + 1);
    }
    if (start == std::string::npos || start + 1 >= src.size()) {
      emit_data(src.substr(pos), line);
      break;
    }
    std::string text = src.substr(pos, start - pos);
    int text_line = line;
    line += CountNewlines(text, 0, text.size());
    char type = src[start + 1];
    char sign = start + 2 < src.size() ? src[start + 2] : '\0';
    if (sign != '-' && sign != '+') sign = '\0';
    size_t body = start + 2 + (sign != '\0' ? 1 : 0);
    int tag_line = line;

    if (type == '#') {
      size_t end = src.find("#}", body);
      if (end == std::string::npos) return LexError(tag_line, "unterminated comment");
      emit_data(strip_before(text, sign, true), text_line);
      line += CountNewlines(src, start, end);
      char end_sign =
          (end > body && (src[end - 1] == '-' || src[end - 1] == '+')) ? src[end - 1] : '\0';
      pos = end + 2;
      if (end_sign == '-') {
        size_t p = SkipSpace(src, pos);
        line += CountNewlines(src, pos, p);
        pos = p;
      } else if (end_sign != '+' && pos < src.size() && src[pos] == '\n') {
        ++pos;
        ++line;
      }
      line_starting = pos > 0 && src[pos - 1] == '\n';
      continue;
    }

    if (type == '%') {
      // {% raw %} ... {% endraw %}
      size_t p = body;
      while (p < src.size() && std::isspace(static_cast<unsigned char>(src[p]))) ++p;
      if (src.compare(p, 3, "raw") == 0 &&
          (p + 3 < src.size() && !std::isalnum(static_cast<unsigned char>(src[p + 3])) &&
           src[p + 3] != '_')) {
        size_t q = p + 3;
        while (q < src.size() && std::isspace(static_cast<unsigned char>(src[q]))) ++q;
        char raw_end_sign = '\0';
        if (q < src.size() && src[q] == '-') {
          raw_end_sign = '-';
          ++q;
        }
        if (src.compare(q, 2, "%}") == 0) {
          emit_data(strip_before(text, sign, true), text_line);
          pos = q + 2;
          if (raw_end_sign == '-') pos = SkipSpace(src, pos);
          // Find {%[-+]? endraw [-+]?%}
          size_t search = pos;
          while (true) {
            size_t e = src.find("{%", search);
            if (e == std::string::npos) return LexError(tag_line, "missing {% endraw %}");
            size_t r = e + 2;
            char s1 = (r < src.size() && (src[r] == '-' || src[r] == '+')) ? src[r] : '\0';
            if (s1 != '\0') ++r;
            while (r < src.size() && std::isspace(static_cast<unsigned char>(src[r]))) ++r;
            if (src.compare(r, 6, "endraw") != 0) {
              search = e + 2;
              continue;
            }
            r += 6;
            while (r < src.size() && std::isspace(static_cast<unsigned char>(src[r]))) ++r;
            char s2 = (r < src.size() && (src[r] == '-' || src[r] == '+')) ? src[r] : '\0';
            if (s2 != '\0') ++r;
            if (src.compare(r, 2, "%}") != 0) {
              search = e + 2;
              continue;
            }
            line_starting = pos > 0 && src[pos - 1] == '\n';
            std::string content = src.substr(pos, e - pos);
            line += CountNewlines(src, start, r + 2);
            emit_data(strip_before(content, s1, true), tag_line);
            pos = r + 2;
            if (s2 == '-') {
              size_t after = SkipSpace(src, pos);
              line += CountNewlines(src, pos, after);
              pos = after;
            } else if (s2 != '+' && pos < src.size() && src[pos] == '\n') {
              ++pos;
              ++line;
            }
            line_starting = pos > 0 && src[pos - 1] == '\n';
            break;
          }
          continue;
        }
      }
    }

    const bool block = type == '%';
    emit_data(strip_before(text, sign, block), text_line);
    Chunk chunk;
    chunk.kind = block ? Chunk::Kind::kBlock : Chunk::Kind::kPrint;
    chunk.line = tag_line;
    pos = body;
    char end_sign = '\0';
    if (auto s = LexTag(src, block, pos, line, &chunk.tokens, &end_sign); !s.ok()) return s;
    chunks.push_back(std::move(chunk));
    if (end_sign == '-') {
      size_t after = SkipSpace(src, pos);
      line += CountNewlines(src, pos, after);
      pos = after;
    } else if (block && end_sign != '+' && pos < src.size() && src[pos] == '\n') {
      ++pos;
      ++line;
    }
    line_starting = pos > 0 && src[pos - 1] == '\n';
  }
  return chunks;
}

}  // namespace ringserve::chat::jinja
