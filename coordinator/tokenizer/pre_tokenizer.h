// tokenizer.json pre-tokenizers: Split, Digits, ByteLevel, Sequence.
#pragma once

#include <deque>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "coordinator/tokenizer/regex.h"

namespace ringserve::tokenizer_internal {

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

// The pre-tokenizer flattened into a list of splitting steps, optionally followed by the
// byte-level step (which must come last: the model then works on raw bytes).
class PreTokenizer {
 public:
  // `spec` is the "pre_tokenizer" object (null allowed). InvalidArgument naming what is wrong.
  static absl::StatusOr<std::unique_ptr<PreTokenizer>> Create(const nlohmann::json& spec);

  // Splits valid UTF-8 `text` into pre-tokens and appends them to *out. Pieces are views into
  // `text` or into *storage (ByteLevel's add_prefix_space); both must outlive their use.
  // Thread-safe.
  absl::Status Split(absl::string_view text, std::deque<std::string>* storage,
                     std::vector<absl::string_view>* out) const;

  // True when the last step is ByteLevel: pre-tokens are raw bytes standing for their
  // byte-level characters.
  bool byte_level() const { return byte_level_; }

 private:
  struct Step {
    std::unique_ptr<Regex> regex;
    SplitBehavior behavior = SplitBehavior::kIsolated;
    bool invert = false;
  };
  absl::Status AddSpec(const nlohmann::json& spec, bool last);
  absl::Status ApplyStep(const Step& step, absl::string_view piece,
                         std::vector<absl::string_view>* out) const;

  std::vector<Step> steps_;
  bool byte_level_ = false;
  // ByteLevel's add_prefix_space, applied before its own regex step (if any).
  bool add_prefix_space_ = false;
  size_t prefix_space_before_step_ = 0;
};

}  // namespace ringserve::tokenizer_internal
