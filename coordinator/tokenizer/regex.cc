#include "coordinator/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <optional>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ringserve::tokenizer_internal {
namespace {

std::string Pcre2Message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return std::string(reinterpret_cast<const char*>(buffer));
}

// Per-thread match state shared by every pattern: ovector of one pair is all FindAll reads.
struct ThreadMatchState {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  ThreadMatchState() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    // Long whitespace runs backtrack through `\s+(?!\S)`: give JIT more than the default 32 KiB.
    jit_stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
    pcre2_jit_stack_assign(context, nullptr, jit_stack);
  }
  ~ThreadMatchState() {
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

ThreadMatchState& State() {
  thread_local ThreadMatchState state;
  return state;
}

// Unicode White_Space, what Oniguruma's \s matches. PCRE2's UCP \s differs (it adds U+180E,
// from \h), so \s and \S are spelled out.
constexpr char kWhiteSpace[] =
    "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

std::string RewriteWhiteSpaceEscapes(absl::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() * 2);
  bool in_class = false;
  size_t class_body_start = 0;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char d = pattern[i + 1];
      if (d == 's') {
        out += in_class ? kWhiteSpace : absl::StrCat("[", kWhiteSpace, "]");
      } else if (d == 'S' && !in_class) {
        out += absl::StrCat("[^", kWhiteSpace, "]");
      } else {
        out += c;
        out += d;
      }
      ++i;
      continue;
    }
    if (in_class) {
      if (c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
        const size_t end = pattern.find(":]", i + 2);
        if (end != absl::string_view::npos) {
          out.append(pattern.data() + i, end + 2 - i);
          i = end + 1;
          continue;
        }
      }
      if (c == ']' && out.size() > class_body_start) in_class = false;
    } else if (c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') {
        out += '^';
        ++i;
      }
      class_body_start = out.size();  // a ']' right here is a literal
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Regex>> Regex::Compile(absl::string_view pattern) {
  // Errors are reported against the pattern as written.
  RS_RETURN_IF_ERROR(CompileExact(pattern).status());
  return CompileExact(RewriteWhiteSpaceEscapes(pattern));
}

absl::StatusOr<std::unique_ptr<Regex>> Regex::CompileExact(absl::string_view pattern) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &error, &offset, nullptr);
  if (code == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("regex rejected by PCRE2 at offset ", offset,
                                                   ": ", Pcre2Message(error),
                                                   " (pattern: ", pattern, ")"));
  }
  // JIT is an optimization: interpretation gives the same matches if it is unavailable.
  const bool jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  std::unique_ptr<Regex> regex(new Regex());
  regex->jit_ = jit;
  regex->pattern_ = std::string(pattern);
  regex->code_ = code;
  return regex;
}

absl::StatusOr<std::unique_ptr<Regex>> Regex::CompileLiteral(absl::string_view literal) {
  std::string quoted = "\\Q";
  // \E cannot appear inside \Q...\E; split it out.
  for (size_t i = 0; i < literal.size(); ++i) {
    if (literal[i] == '\\' && i + 1 < literal.size() && literal[i + 1] == 'E') {
      quoted += "\\E\\\\\\Q";
      continue;
    }
    quoted += literal[i];
  }
  quoted += "\\E";
  return CompileExact(quoted);
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

absl::Status Regex::FindAll(absl::string_view subject,
                            std::vector<std::pair<size_t, size_t>>* matches) const {
  ThreadMatchState& state = State();
  auto* code = static_cast<pcre2_code*>(code_);
  const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  const size_t n = subject.size();
  size_t start = 0;
  uint32_t options = PCRE2_NO_UTF_CHECK;
  std::optional<size_t> last_match_end;
  auto next_char = [&](size_t pos) {
    ++pos;
    while (pos < n && (static_cast<unsigned char>(subject[pos]) & 0xC0) == 0x80) ++pos;
    return pos;
  };
  while (start <= n) {
    const int rc = jit_ ? pcre2_jit_match(code, s, n, start, options, state.data, state.context)
                        : pcre2_match(code, s, n, start, options, state.data, state.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      return absl::InternalError(absl::StrCat("regex match failed: ", Pcre2Message(rc)));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.data);
    const size_t begin = ovector[0];
    const size_t end = ovector[1];
    if (begin == end && last_match_end == end) {
      // The onig crate refuses an empty match where the previous match ended and searches on
      // from the next character.
      if (end >= n) break;
      start = next_char(end);
      continue;
    }
    matches->emplace_back(begin, end);
    last_match_end = end;
    if (end > begin) {
      start = end;
    } else {
      if (end >= n) break;
      start = next_char(end);
    }
  }
  return absl::OkStatus();
}

}  // namespace ringserve::tokenizer_internal
