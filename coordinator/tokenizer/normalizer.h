// tokenizer.json normalizers: NFC/NFD/NFKC/NFKD (ICU), Lowercase, Prepend, Replace (String),
// Strip, Sequence.
//
// Normalizers can multiply text (Replace of one character by a long string, repeated in a
// Sequence), so every step writes against a NormalizeBudget and an Encode whose normalizers
// would write more fails with InvalidArgument instead of exhausting the coordinator's memory.
#pragma once

#include <cstddef>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ringserve::tokenizer_internal {

// Bytes the normalizers may write for an input of n bytes, every step and every piece of the
// text together: max(kNormalizeGrowthFactor * n, kMinNormalizeBytes), at most
// kMaxNormalizeBytes. Real chains (NFC, Prepend "▁", Replace " " by "▁") write a few times
// the input.
inline constexpr size_t kNormalizeGrowthFactor = 64;
inline constexpr size_t kMinNormalizeBytes = size_t{1} << 20;
inline constexpr size_t kMaxNormalizeBytes = size_t{256} << 20;
// Longest Prepend, Replace pattern or Replace content accepted at load time (real ones are a
// few bytes).
inline constexpr size_t kMaxNormalizerLiteralBytes = size_t{64} << 10;

// What the normalizers of one Encode (or of one added token at load time) may still write.
// Not thread-safe: one per call.
class NormalizeBudget {
 public:
  static NormalizeBudget ForInput(size_t input_bytes);

  // Whether `bytes` more may be written.
  bool Allows(size_t bytes) const { return bytes <= remaining_bytes_; }
  // Takes `bytes` from the budget; Exceeded(step) when fewer remain (nothing taken then).
  absl::Status Charge(size_t bytes, absl::string_view step);
  // InvalidArgument naming `step` (e.g. "normalizer.normalizers[2] (Replace)"), the limit and
  // the input size.
  absl::Status Exceeded(absl::string_view step) const;

  size_t remaining_bytes() const { return remaining_bytes_; }
  size_t limit_bytes() const { return limit_bytes_; }

 private:
  NormalizeBudget(size_t input_bytes, size_t limit_bytes)
      : input_bytes_(input_bytes), limit_bytes_(limit_bytes), remaining_bytes_(limit_bytes) {}
  size_t input_bytes_;
  size_t limit_bytes_;
  size_t remaining_bytes_;
};

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  // Writes the normalized form of valid UTF-8 `text` to *out (replacing its contents) and
  // charges what it wrote to *budget. InvalidArgument (budget.Exceeded) when the output would
  // not fit the budget; *out is then unspecified. Thread-safe.
  virtual absl::Status Normalize(absl::string_view text, NormalizeBudget* budget,
                                 std::string* out) const = 0;
};

// Builds the normalizer described by `spec` (the "normalizer" object); nullptr for JSON null.
// InvalidArgument naming the unsupported type, bad field or literal longer than
// kMaxNormalizerLiteralBytes, with its place in the file ("normalizer.normalizers[2]").
absl::StatusOr<std::unique_ptr<Normalizer>> MakeNormalizer(const nlohmann::json& spec);

}  // namespace ringserve::tokenizer_internal
