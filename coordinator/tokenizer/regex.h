// A compiled PCRE2 pattern (UTF + UCP, JIT) that lists its matches in a subject.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ringserve::tokenizer_internal {

class Regex {
 public:
  // Compiles `pattern` (Oniguruma syntax as used in tokenizer.json; the subset those files use
  // is PCRE2-compatible once \s and \S are spelled out as Unicode White_Space, as Oniguruma
  // has them). InvalidArgument with PCRE2's message and offset if rejected.
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(absl::string_view pattern);
  // A pattern matching `literal` verbatim.
  static absl::StatusOr<std::unique_ptr<Regex>> CompileLiteral(absl::string_view literal);
  ~Regex();

  // Appends the [begin, end) byte ranges of the successive non-overlapping matches in valid
  // UTF-8 `subject` as the onig crate's find_iter (Hugging Face's) reports them: empty matches
  // included, except one that starts where the previous match ended; after an empty match the
  // search resumes one character further on.
  // Thread-safe: per-thread match state.
  absl::Status FindAll(absl::string_view subject,
                       std::vector<std::pair<size_t, size_t>>* matches) const;

  const std::string& pattern() const { return pattern_; }

 private:
  Regex() = default;
  // Compiles `pattern` as PCRE2 syntax, without rewriting.
  static absl::StatusOr<std::unique_ptr<Regex>> CompileExact(absl::string_view pattern);
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

}  // namespace ringserve::tokenizer_internal
