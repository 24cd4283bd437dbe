#include "coordinator/tokenizer/normalizer.h"

#include <unicode/bytestream.h>
#include <unicode/casemap.h>
#include <unicode/normalizer2.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "coordinator/tokenizer/utf8.h"

namespace ringserve::tokenizer_internal {
namespace {

bool IsAscii(absl::string_view text) {
  for (unsigned char c : text) {
    if (c >= 0x80) return false;
  }
  return true;
}

// An ICU byte sink that appends to a string up to `limit_bytes` and notes an overflow instead
// of growing further (ICU's output size is known only once it is written).
class BoundedSink final : public icu::ByteSink {
 public:
  BoundedSink(std::string* out, size_t limit_bytes) : out_(out), limit_bytes_(limit_bytes) {}
  void Append(const char* bytes, int32_t n) override {
    if (overflowed_ || n <= 0) return;
    if (static_cast<size_t>(n) > limit_bytes_ - out_->size()) {
      overflowed_ = true;
      return;
    }
    out_->append(bytes, static_cast<size_t>(n));
  }
  bool overflowed() const { return overflowed_; }

 private:
  std::string* out_;
  size_t limit_bytes_;
  bool overflowed_ = false;
};

// Copies `text` to *out as the step's output.
absl::Status Copy(absl::string_view text, absl::string_view step, NormalizeBudget* budget,
                  std::string* out) {
  RS_RETURN_IF_ERROR(budget->Charge(text.size(), step));
  out->assign(text.data(), text.size());
  return absl::OkStatus();
}

// Charges what an ICU call wrote through `sink` (bounded by the budget's remaining bytes).
absl::Status ChargeSink(const BoundedSink& sink, absl::string_view step, NormalizeBudget* budget,
                        const std::string& out) {
  if (sink.overflowed()) return budget->Exceeded(step);
  return budget->Charge(out.size(), step);
}

class UnicodeNormalizer final : public Normalizer {
 public:
  UnicodeNormalizer(const icu::Normalizer2* impl, std::string name)
      : impl_(impl), name_(std::move(name)) {}
  absl::Status Normalize(absl::string_view text, NormalizeBudget* budget,
                         std::string* out) const override {
    out->clear();
    // ASCII is invariant under all four forms.
    if (IsAscii(text)) return Copy(text, name_, budget, out);
    UErrorCode status = U_ZERO_ERROR;
    out->reserve(std::min(text.size(), budget->remaining_bytes()));
    BoundedSink sink(out, budget->remaining_bytes());
    impl_->normalizeUTF8(0, icu::StringPiece(text.data(), static_cast<int32_t>(text.size())), sink,
                         nullptr, status);
    if (U_FAILURE(status)) return Copy(text, name_, budget, out);
    return ChargeSink(sink, name_, budget, *out);
  }

 private:
  const icu::Normalizer2* impl_;
  std::string name_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  explicit LowercaseNormalizer(std::string name) : name_(std::move(name)) {}
  absl::Status Normalize(absl::string_view text, NormalizeBudget* budget,
                         std::string* out) const override {
    out->clear();
    // Full Unicode lowercasing through ICU's root locale (Rust's str::to_lowercase).
    UErrorCode status = U_ZERO_ERROR;
    out->reserve(std::min(text.size(), budget->remaining_bytes()));
    BoundedSink sink(out, budget->remaining_bytes());
    icu::CaseMap::utf8ToLower("", 0,
                              icu::StringPiece(text.data(), static_cast<int32_t>(text.size())),
                              sink, nullptr, status);
    return ChargeSink(sink, name_, budget, *out);
  }

 private:
  std::string name_;
};

class PrependNormalizer final : public Normalizer {
 public:
  PrependNormalizer(std::string prepend, std::string name)
      : prepend_(std::move(prepend)), name_(std::move(name)) {}
  absl::Status Normalize(absl::string_view text, NormalizeBudget* budget,
                         std::string* out) const override {
    out->clear();
    const size_t size = text.empty() ? 0 : prepend_.size() + text.size();
    RS_RETURN_IF_ERROR(budget->Charge(size, name_));
    if (!text.empty()) out->append(prepend_);
    out->append(text.data(), text.size());
    return absl::OkStatus();
  }

 private:
  std::string prepend_;
  std::string name_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(std::string pattern, std::string content, std::string name)
      : pattern_(std::move(pattern)),
        content_(std::move(content)),
        name_(std::move(name)),
        border_(Borders(pattern_)) {}
  // Every non-overlapping occurrence, left to right (absl::StrReplaceAll with one pattern).
  // The output size is known before anything is written, so nothing past the budget is built.
  absl::Status Normalize(absl::string_view text, NormalizeBudget* budget,
                         std::string* out) const override {
    const std::vector<size_t> matches = Occurrences(text);
    // No overflow: matches <= the text's size, content <= kMaxNormalizerLiteralBytes.
    const size_t size =
        text.size() - matches.size() * pattern_.size() + matches.size() * content_.size();
    RS_RETURN_IF_ERROR(budget->Charge(size, name_));
    out->clear();
    out->reserve(size);
    size_t start = 0;
    for (size_t pos : matches) {
      out->append(text.data() + start, pos - start);
      out->append(content_);
      start = pos + pattern_.size();
    }
    out->append(text.data() + start, text.size() - start);
    return absl::OkStatus();
  }

 private:
  // border[i]: the length of the longest proper prefix of pattern[0, i] that is also its suffix
  // (Knuth-Morris-Pratt), so a search reads each byte of the text once: a naive search compares
  // up to both lengths' product (a 64 KiB pattern in a long prompt: hours).
  static std::vector<size_t> Borders(const std::string& pattern) {
    std::vector<size_t> border(pattern.size(), 0);
    for (size_t i = 1, k = 0; i < pattern.size(); ++i) {
      while (k > 0 && pattern[i] != pattern[k]) k = border[k - 1];
      if (pattern[i] == pattern[k]) ++k;
      border[i] = k;
    }
    return border;
  }
  // Start offsets of the non-overlapping occurrences of the (non-empty) pattern, left to right.
  std::vector<size_t> Occurrences(absl::string_view text) const {
    std::vector<size_t> found;
    const size_t m = pattern_.size();
    for (size_t i = 0, k = 0; i < text.size(); ++i) {
      while (k > 0 && text[i] != pattern_[k]) k = border_[k - 1];
      if (text[i] == pattern_[k]) ++k;
      if (k == m) {
        found.push_back(i + 1 - m);
        k = 0;  // non-overlapping: the next occurrence starts after this one
      }
    }
    return found;
  }

  std::string pattern_;
  std::string content_;
  std::string name_;
  std::vector<size_t> border_;
};

bool IsWhitespace(char32_t c) {
  return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right, std::string name)
      : left_(left), right_(right), name_(std::move(name)) {}
  absl::Status Normalize(absl::string_view text, NormalizeBudget* budget,
                         std::string* out) const override {
    size_t begin = 0, end = text.size();
    if (left_) {
      while (begin < end) {
        size_t next = begin;
        if (!IsWhitespace(NextCodePoint(text, &next))) break;
        begin = next;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
        size_t next = start;
        if (!IsWhitespace(NextCodePoint(text, &next))) break;
        end = start;
      }
    }
    return Copy(text.substr(begin, end - begin), name_, budget, out);
  }

 private:
  bool left_, right_;
  std::string name_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts)
      : parts_(std::move(parts)) {}
  absl::Status Normalize(absl::string_view text, NormalizeBudget* budget,
                         std::string* out) const override {
    out->assign(text.data(), text.size());
    std::string scratch;
    for (const auto& part : parts_) {
      RS_RETURN_IF_ERROR(part->Normalize(*out, budget, &scratch));
      out->swap(scratch);
    }
    return absl::OkStatus();
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

absl::StatusOr<std::string> StringField(const nlohmann::json& spec, const char* field,
                                        absl::string_view where) {
  auto it = spec.find(field);
  if (it == spec.end() || !it->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": missing string field '", field, "'"));
  }
  std::string value = it->get<std::string>();
  if (value.size() > kMaxNormalizerLiteralBytes) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": '", field, "' is ", value.size(),
                                                   " bytes, above the limit of ",
                                                   kMaxNormalizerLiteralBytes, " bytes"));
  }
  return value;
}

// `path` is where `spec` sits in tokenizer.json ("normalizer", "normalizer.normalizers[2]").
absl::StatusOr<std::unique_ptr<Normalizer>> MakeNormalizerAt(const nlohmann::json& spec,
                                                             const std::string& path) {
  if (spec.is_null()) return nullptr;
  if (!spec.is_object() || !spec.contains("type") || !spec["type"].is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": expected an object with a string 'type'"));
  }
  const std::string type = spec["type"].get<std::string>();
  // Names the step in errors: "normalizer.normalizers[2] (Replace)".
  const std::string name = absl::StrCat(path, " (", type, ")");
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* icu_impl = nullptr;
  if (type == "NFC") icu_impl = icu::Normalizer2::getNFCInstance(status);
  if (type == "NFD") icu_impl = icu::Normalizer2::getNFDInstance(status);
  if (type == "NFKC") icu_impl = icu::Normalizer2::getNFKCInstance(status);
  if (type == "NFKD") icu_impl = icu::Normalizer2::getNFKDInstance(status);
  if (U_FAILURE(status)) {
    return absl::InternalError(absl::StrCat("ICU ", type, " normalizer: ", u_errorName(status)));
  }
  if (icu_impl != nullptr) return std::make_unique<UnicodeNormalizer>(icu_impl, name);
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>(name);
  if (type == "Prepend") {
    RS_ASSIGN_OR_RETURN(std::string prepend, StringField(spec, "prepend", name));
    return std::make_unique<PrependNormalizer>(std::move(prepend), name);
  }
  if (type == "Replace") {
    auto pattern = spec.find("pattern");
    if (pattern == spec.end() || !pattern->is_object() || !pattern->contains("String")) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": only {\"String\": ...} patterns are supported"));
    }
    RS_ASSIGN_OR_RETURN(std::string content, StringField(spec, "content", name));
    RS_ASSIGN_OR_RETURN(std::string literal,
                        StringField(*pattern, "String", absl::StrCat(name, ".pattern")));
    if (literal.empty()) return absl::InvalidArgumentError(absl::StrCat(name, ": empty pattern"));
    return std::make_unique<ReplaceNormalizer>(std::move(literal), std::move(content), name);
  }
  if (type == "Strip") {
    return std::make_unique<StripNormalizer>(spec.value("strip_left", true),
                                             spec.value("strip_right", true), name);
  }
  if (type == "Sequence") {
    auto list = spec.find("normalizers");
    if (list == spec.end() || !list->is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": missing array 'normalizers'"));
    }
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (size_t i = 0; i < list->size(); ++i) {
      RS_ASSIGN_OR_RETURN(
          std::unique_ptr<Normalizer> part,
          MakeNormalizerAt((*list)[i], absl::StrCat(path, ".normalizers[", i, "]")));
      if (part != nullptr) parts.push_back(std::move(part));
    }
    if (parts.empty()) return nullptr;  // The identity (DeepSeek V3 ships an empty Sequence).
    return std::make_unique<SequenceNormalizer>(std::move(parts));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported normalizer type '", type, "' at ", path));
}

}  // namespace

NormalizeBudget NormalizeBudget::ForInput(size_t input_bytes) {
  const size_t grown = input_bytes > kMaxNormalizeBytes / kNormalizeGrowthFactor
                           ? kMaxNormalizeBytes
                           : input_bytes * kNormalizeGrowthFactor;
  return NormalizeBudget(input_bytes,
                         std::min(kMaxNormalizeBytes, std::max(kMinNormalizeBytes, grown)));
}

absl::Status NormalizeBudget::Charge(size_t bytes, absl::string_view step) {
  if (!Allows(bytes)) return Exceeded(step);
  remaining_bytes_ -= bytes;
  return absl::OkStatus();
}

absl::Status NormalizeBudget::Exceeded(absl::string_view step) const {
  return absl::InvalidArgumentError(
      absl::StrCat("the tokenizer's ", step, " grows the text past ", limit_bytes_,
                   " bytes, the most its normalizers may write for ", input_bytes_,
                   " bytes of text (", kNormalizeGrowthFactor, " times the text, at least ",
                   kMinNormalizeBytes >> 20, " MiB, at most ", kMaxNormalizeBytes >> 20, " MiB)"));
}

absl::StatusOr<std::unique_ptr<Normalizer>> MakeNormalizer(const nlohmann::json& spec) {
  return MakeNormalizerAt(spec, "normalizer");
}

}  // namespace ringserve::tokenizer_internal
