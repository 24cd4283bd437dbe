// tokenizer.json decoders: ByteLevel, ByteFallback, Fuse, Replace (String), Strip, Sequence.
#pragma once

#include <cstddef>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ringserve::tokenizer_internal {

class Decoder {
 public:
  enum class Kind { kByteLevel, kByteFallback, kFuse, kReplace, kStrip };

  // Decoded text grows at most this many times over the tokens' text: Replace steps whose
  // contents could multiply it further are refused at load time.
  static constexpr size_t kMaxDecoderGrowth = 64;

  // `spec` is the "decoder" object (must not be null). InvalidArgument for unsupported types
  // and for Replace steps that could grow text more than kMaxDecoderGrowth-fold in all, naming
  // the step ("decoder.decoders[2]").
  static absl::StatusOr<std::unique_ptr<Decoder>> Create(const nlohmann::json& spec);

  // Hugging Face's decode_chain followed by join(""): token strings in, text out. Thread-safe.
  std::string Decode(std::vector<std::string> tokens) const;

  // True when the decoder is exactly ByteLevel: text is the lossy UTF-8 reading of the
  // concatenated token bytes.
  bool byte_level_only() const { return steps_.size() == 1 && steps_[0].kind == Kind::kByteLevel; }

 private:
  struct Step {
    Kind kind = Kind::kByteLevel;
    std::string pattern = {};  // Replace
    std::string content = {};  // Replace; Strip (one character)
    size_t start = 0;          // Strip
    size_t stop = 0;           // Strip
  };
  // `path` names `spec` in errors; *growth is the product of the Replace steps' growth so far.
  absl::Status Add(const nlohmann::json& spec, const std::string& path, size_t* growth);
  std::vector<Step> steps_;
};

}  // namespace ringserve::tokenizer_internal
