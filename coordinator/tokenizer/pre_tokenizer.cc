#include "coordinator/tokenizer/pre_tokenizer.h"

#include <nlohmann/json.hpp>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace ringserve::tokenizer_internal {
namespace {

// GPT-2's pattern, what ByteLevel uses when use_regex is true.
constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

absl::StatusOr<SplitBehavior> ParseBehavior(const nlohmann::json& spec) {
  auto it = spec.find("behavior");
  if (it == spec.end() || !it->is_string()) {
    return absl::InvalidArgumentError("pre_tokenizer Split: missing string 'behavior'");
  }
  const std::string name = it->get<std::string>();
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return absl::InvalidArgumentError(
      absl::StrCat("pre_tokenizer Split: unsupported behavior '", name, "'"));
}

struct Span {
  size_t begin;
  size_t end;
  bool is_match;
};

}  // namespace

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::Create(const nlohmann::json& spec) {
  std::unique_ptr<PreTokenizer> pre(new PreTokenizer());
  if (!spec.is_null()) RS_RETURN_IF_ERROR(pre->AddSpec(spec, /*last=*/true));
  return pre;
}

absl::Status PreTokenizer::AddSpec(const nlohmann::json& spec, bool last) {
  if (!spec.is_object() || !spec.contains("type") || !spec["type"].is_string()) {
    return absl::InvalidArgumentError("pre_tokenizer: expected an object with a string 'type'");
  }
  if (byte_level_) {
    return absl::InvalidArgumentError(
        "unsupported pre_tokenizer: ByteLevel must be the last pre-tokenizer");
  }
  const std::string type = spec["type"].get<std::string>();
  if (type == "Sequence") {
    auto list = spec.find("pretokenizers");
    if (list == spec.end() || !list->is_array()) {
      return absl::InvalidArgumentError("pre_tokenizer Sequence: missing array 'pretokenizers'");
    }
    for (size_t i = 0; i < list->size(); ++i) {
      RS_RETURN_IF_ERROR(AddSpec((*list)[i], last && i + 1 == list->size()));
    }
    return absl::OkStatus();
  }
  if (type == "Split") {
    auto pattern = spec.find("pattern");
    if (pattern == spec.end() || !pattern->is_object()) {
      return absl::InvalidArgumentError("pre_tokenizer Split: missing object 'pattern'");
    }
    Step step;
    if (pattern->contains("Regex") && (*pattern)["Regex"].is_string()) {
      auto regex = Regex::Compile((*pattern)["Regex"].get<std::string>());
      if (!regex.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("pre_tokenizer Split: ", regex.status().message()));
      }
      step.regex = std::move(regex).value();
    } else if (pattern->contains("String") && (*pattern)["String"].is_string()) {
      RS_ASSIGN_OR_RETURN(step.regex,
                          Regex::CompileLiteral((*pattern)["String"].get<std::string>()));
    } else {
      return absl::InvalidArgumentError(
          "pre_tokenizer Split: 'pattern' must be {\"Regex\": ...} or {\"String\": ...}");
    }
    RS_ASSIGN_OR_RETURN(step.behavior, ParseBehavior(spec));
    step.invert = spec.value("invert", false);
    steps_.push_back(std::move(step));
    return absl::OkStatus();
  }
  if (type == "Digits") {
    Step step;
    RS_ASSIGN_OR_RETURN(step.regex, Regex::Compile(R"(\p{N})"));
    // Each numeric character is one match; Contiguous glues runs of them together.
    step.behavior = spec.value("individual_digits", false) ? SplitBehavior::kIsolated
                                                           : SplitBehavior::kContiguous;
    steps_.push_back(std::move(step));
    return absl::OkStatus();
  }
  if (type == "ByteLevel") {
    if (!last) {
      return absl::InvalidArgumentError(
          "unsupported pre_tokenizer: ByteLevel must be the last pre-tokenizer");
    }
    add_prefix_space_ = spec.value("add_prefix_space", false);
    prefix_space_before_step_ = steps_.size();
    if (spec.value("use_regex", true)) {
      Step step;
      RS_ASSIGN_OR_RETURN(step.regex, Regex::Compile(kGpt2Pattern));
      step.behavior = SplitBehavior::kIsolated;
      steps_.push_back(std::move(step));
    }
    byte_level_ = true;
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("unsupported pre_tokenizer type '", type, "'"));
}

absl::Status PreTokenizer::ApplyStep(const Step& step, absl::string_view piece,
                                     std::vector<absl::string_view>* out) const {
  thread_local std::vector<std::pair<size_t, size_t>> matches;
  thread_local std::vector<Span> spans;
  matches.clear();
  spans.clear();
  RS_RETURN_IF_ERROR(step.regex->FindAll(piece, &matches));
  size_t prev = 0;
  for (const auto& [begin, end] : matches) {
    if (prev != begin) spans.push_back({prev, begin, step.invert});
    spans.push_back({begin, end, !step.invert});
    prev = end;
  }
  if (prev != piece.size()) spans.push_back({prev, piece.size(), step.invert});

  auto emit = [&](size_t begin, size_t end) {
    if (end > begin) out->push_back(piece.substr(begin, end - begin));
  };
  switch (step.behavior) {
    case SplitBehavior::kIsolated:
      for (const Span& s : spans) emit(s.begin, s.end);
      break;
    case SplitBehavior::kRemoved:
      for (const Span& s : spans) {
        if (!s.is_match) emit(s.begin, s.end);
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
    case SplitBehavior::kContiguous: {
      // Fold left: a span joins the previous one when it is a match following a non-match
      // (MergedWithPrevious) or has the same kind as the previous span (Contiguous).
      thread_local std::vector<std::pair<size_t, size_t>> merged;
      merged.clear();
      bool previous_match = false;
      for (const Span& s : spans) {
        const bool join = step.behavior == SplitBehavior::kContiguous
                              ? s.is_match == previous_match
                              : s.is_match && !previous_match;
        if (join && !merged.empty()) {
          merged.back().second = s.end;
        } else {
          merged.emplace_back(s.begin, s.end);
        }
        previous_match = s.is_match;
      }
      for (const auto& [begin, end] : merged) emit(begin, end);
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      thread_local std::vector<std::pair<size_t, size_t>> merged;
      merged.clear();
      bool previous_match = false;
      for (size_t i = spans.size(); i-- > 0;) {
        const Span& s = spans[i];
        if (s.is_match && !previous_match && !merged.empty()) {
          merged.back().first = s.begin;
        } else {
          merged.emplace_back(s.begin, s.end);
        }
        previous_match = s.is_match;
      }
      for (size_t i = merged.size(); i-- > 0;) emit(merged[i].first, merged[i].second);
      break;
    }
  }
  return absl::OkStatus();
}

absl::Status PreTokenizer::Split(absl::string_view text, std::deque<std::string>* storage,
                                 std::vector<absl::string_view>* out) const {
  if (text.empty()) return absl::OkStatus();
  const size_t first = out->size();
  out->push_back(text);
  thread_local std::vector<absl::string_view> next;
  for (size_t i = 0; i <= steps_.size(); ++i) {
    if (add_prefix_space_ && i == prefix_space_before_step_) {
      // Hugging Face prepends the space to every piece that does not already start with one.
      for (size_t k = first; k < out->size(); ++k) {
        if ((*out)[k].empty() || (*out)[k][0] != ' ') {
          storage->push_back(absl::StrCat(" ", (*out)[k]));
        }
      }
      size_t used = storage->size();
      for (size_t k = out->size(); k-- > first;) {
        if ((*out)[k].empty() || (*out)[k][0] != ' ') (*out)[k] = (*storage)[--used];
      }
    }
    if (i == steps_.size()) break;
    next.clear();
    for (size_t k = first; k < out->size(); ++k) {
      RS_RETURN_IF_ERROR(ApplyStep(steps_[i], (*out)[k], &next));
    }
    out->resize(first);
    out->insert(out->end(), next.begin(), next.end());
  }
  return absl::OkStatus();
}

}  // namespace ringserve::tokenizer_internal
