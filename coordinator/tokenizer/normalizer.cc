#include "coordinator/tokenizer/normalizer.h"

#include <unicode/bytestream.h>
#include <unicode/casemap.h>
#include <unicode/normalizer2.h>

#include <nlohmann/json.hpp>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
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

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(const icu::Normalizer2* impl) : impl_(impl) {}
  void Normalize(absl::string_view text, std::string* out) const override {
    out->clear();
    // ASCII is invariant under all four forms.
    if (IsAscii(text)) {
      out->assign(text.data(), text.size());
      return;
    }
    UErrorCode status = U_ZERO_ERROR;
    icu::StringByteSink<std::string> sink(out, static_cast<int32_t>(text.size()));
    impl_->normalizeUTF8(0, icu::StringPiece(text.data(), static_cast<int32_t>(text.size())), sink,
                         nullptr, status);
    if (U_FAILURE(status)) out->assign(text.data(), text.size());
  }

 private:
  const icu::Normalizer2* impl_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  void Normalize(absl::string_view text, std::string* out) const override {
    out->clear();
    // Full Unicode lowercasing through ICU's root locale (Rust's str::to_lowercase).
    UErrorCode status = U_ZERO_ERROR;
    icu::StringByteSink<std::string> sink(out, static_cast<int32_t>(text.size()));
    icu::CaseMap::utf8ToLower("", 0,
                              icu::StringPiece(text.data(), static_cast<int32_t>(text.size())),
                              sink, nullptr, status);
  }
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prepend) : prepend_(std::move(prepend)) {}
  void Normalize(absl::string_view text, std::string* out) const override {
    out->clear();
    if (!text.empty()) out->append(prepend_);
    out->append(text.data(), text.size());
  }

 private:
  std::string prepend_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(std::string pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void Normalize(absl::string_view text, std::string* out) const override {
    *out = absl::StrReplaceAll(text, {{pattern_, content_}});
  }

 private:
  std::string pattern_;
  std::string content_;
};

bool IsWhitespace(char32_t c) {
  return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void Normalize(absl::string_view text, std::string* out) const override {
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
    out->assign(text.data() + begin, end - begin);
  }

 private:
  bool left_, right_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts)
      : parts_(std::move(parts)) {}
  void Normalize(absl::string_view text, std::string* out) const override {
    out->assign(text.data(), text.size());
    std::string scratch;
    for (const auto& part : parts_) {
      part->Normalize(*out, &scratch);
      out->swap(scratch);
    }
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

absl::StatusOr<std::string> StringField(const nlohmann::json& spec, const char* field,
                                        absl::string_view type) {
  auto it = spec.find(field);
  if (it == spec.end() || !it->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat("normalizer ", type, ": missing string field '", field, "'"));
  }
  return it->get<std::string>();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Normalizer>> MakeNormalizer(const nlohmann::json& spec) {
  if (spec.is_null()) return nullptr;
  if (!spec.is_object() || !spec.contains("type") || !spec["type"].is_string()) {
    return absl::InvalidArgumentError("normalizer: expected an object with a string 'type'");
  }
  const std::string type = spec["type"].get<std::string>();
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* icu_impl = nullptr;
  if (type == "NFC") icu_impl = icu::Normalizer2::getNFCInstance(status);
  if (type == "NFD") icu_impl = icu::Normalizer2::getNFDInstance(status);
  if (type == "NFKC") icu_impl = icu::Normalizer2::getNFKCInstance(status);
  if (type == "NFKD") icu_impl = icu::Normalizer2::getNFKDInstance(status);
  if (U_FAILURE(status)) {
    return absl::InternalError(absl::StrCat("ICU ", type, " normalizer: ", u_errorName(status)));
  }
  if (icu_impl != nullptr) return std::make_unique<UnicodeNormalizer>(icu_impl);
  if (type == "Lowercase") return std::make_unique<LowercaseNormalizer>();
  if (type == "Prepend") {
    RS_ASSIGN_OR_RETURN(std::string prepend, StringField(spec, "prepend", type));
    return std::make_unique<PrependNormalizer>(std::move(prepend));
  }
  if (type == "Replace") {
    auto pattern = spec.find("pattern");
    if (pattern == spec.end() || !pattern->is_object() || !pattern->contains("String")) {
      return absl::InvalidArgumentError(
          "normalizer Replace: only {\"String\": ...} patterns are supported");
    }
    RS_ASSIGN_OR_RETURN(std::string content, StringField(spec, "content", type));
    RS_ASSIGN_OR_RETURN(std::string literal, StringField(*pattern, "String", type));
    if (literal.empty()) return absl::InvalidArgumentError("normalizer Replace: empty pattern");
    return std::make_unique<ReplaceNormalizer>(std::move(literal), std::move(content));
  }
  if (type == "Strip") {
    return std::make_unique<StripNormalizer>(spec.value("strip_left", true),
                                             spec.value("strip_right", true));
  }
  if (type == "Sequence") {
    auto list = spec.find("normalizers");
    if (list == spec.end() || !list->is_array()) {
      return absl::InvalidArgumentError("normalizer Sequence: missing array 'normalizers'");
    }
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (const auto& item : *list) {
      RS_ASSIGN_OR_RETURN(std::unique_ptr<Normalizer> part, MakeNormalizer(item));
      if (part != nullptr) parts.push_back(std::move(part));
    }
    if (parts.empty()) return nullptr;  // The identity (DeepSeek V3 ships an empty Sequence).
    return std::make_unique<SequenceNormalizer>(std::move(parts));
  }
  return absl::InvalidArgumentError(absl::StrCat("unsupported normalizer type '", type, "'"));
}

}  // namespace ringserve::tokenizer_internal
