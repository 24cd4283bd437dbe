// tokenizer.json normalizers: NFC/NFD/NFKC/NFKD (ICU), Lowercase, Prepend, Replace (String),
// Strip, Sequence.
#pragma once

#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ringserve::tokenizer_internal {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Writes the normalized form of valid UTF-8 `text` to *out (replacing its contents).
  // Thread-safe.
  virtual void Normalize(absl::string_view text, std::string* out) const = 0;
};

// Builds the normalizer described by `spec` (the "normalizer" object); nullptr for JSON null.
// InvalidArgument naming the unsupported type or bad field.
absl::StatusOr<std::unique_ptr<Normalizer>> MakeNormalizer(const nlohmann::json& spec);

}  // namespace ringserve::tokenizer_internal
