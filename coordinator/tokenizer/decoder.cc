#include "coordinator/tokenizer/decoder.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/status_macros.h"
#include "coordinator/tokenizer/utf8.h"

namespace ringserve::tokenizer_internal {
namespace {

// "<0x41>" -> 0x41, or -1.
int ByteFallbackValue(const std::string& token) {
  if (token.size() != 6 || token[0] != '<' || token[1] != '0' || token[2] != 'x' ||
      token[5] != '>') {
    return -1;
  }
  int value = 0;
  for (int i = 3; i < 5; ++i) {
    const char c = token[i];
    int digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'A' && c <= 'F') {
      digit = c - 'A' + 10;
    } else {
      return -1;
    }
    value = value * 16 + digit;
  }
  return value;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Decoder>> Decoder::Create(const nlohmann::json& spec) {
  std::unique_ptr<Decoder> decoder(new Decoder());
  size_t growth = 1;
  RS_RETURN_IF_ERROR(decoder->Add(spec, "decoder", &growth));
  return decoder;
}

absl::Status Decoder::Add(const nlohmann::json& spec, const std::string& path, size_t* growth) {
  if (!spec.is_object() || !spec.contains("type") || !spec["type"].is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": expected an object with a string 'type'"));
  }
  const std::string type = spec["type"].get<std::string>();
  if (type == "Sequence") {
    auto list = spec.find("decoders");
    if (list == spec.end() || !list->is_array()) {
      return absl::InvalidArgumentError("decoder Sequence: missing array 'decoders'");
    }
    for (size_t i = 0; i < list->size(); ++i) {
      RS_RETURN_IF_ERROR(Add((*list)[i], absl::StrCat(path, ".decoders[", i, "]"), growth));
    }
    return absl::OkStatus();
  }
  if (type == "ByteLevel") {
    steps_.push_back({.kind = Kind::kByteLevel});
    return absl::OkStatus();
  }
  if (type == "ByteFallback") {
    steps_.push_back({.kind = Kind::kByteFallback});
    return absl::OkStatus();
  }
  if (type == "Fuse") {
    steps_.push_back({.kind = Kind::kFuse});
    return absl::OkStatus();
  }
  if (type == "Replace") {
    auto pattern = spec.find("pattern");
    if (pattern == spec.end() || !pattern->is_object() || !pattern->contains("String") ||
        !(*pattern)["String"].is_string() || !spec.contains("content") ||
        !spec["content"].is_string()) {
      return absl::InvalidArgumentError(
          "decoder Replace: only {\"String\": ...} patterns with a string content are supported");
    }
    Step step{.kind = Kind::kReplace};
    step.pattern = (*pattern)["String"].get<std::string>();
    step.content = spec["content"].get<std::string>();
    if (step.pattern.empty()) return absl::InvalidArgumentError("decoder Replace: empty pattern");
    // Decode has no error path, so a chain of Replace steps that could multiply the text (one
    // character by a long string, repeated) is refused here rather than run out of memory.
    const size_t factor = (step.content.size() + step.pattern.size() - 1) / step.pattern.size();
    if (factor > 1) {
      if (factor > kMaxDecoderGrowth / *growth) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, " (Replace): replacing ", step.pattern.size(), " bytes by ", step.content.size(),
            " lets the decoder's Replace steps grow text more than ", kMaxDecoderGrowth, "-fold"));
      }
      *growth *= factor;
    }
    steps_.push_back(std::move(step));
    return absl::OkStatus();
  }
  if (type == "Strip") {
    Step step{.kind = Kind::kStrip};
    step.content = spec.value("content", std::string(" "));
    step.start = spec.value("start", size_t{0});
    step.stop = spec.value("stop", size_t{0});
    steps_.push_back(std::move(step));
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("unsupported decoder type '", type, "'"));
}

std::string Decoder::Decode(std::vector<std::string> tokens) const {
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Kind::kByteLevel: {
        std::string bytes;
        for (const std::string& token : tokens) {
          std::optional<std::string> raw = ByteLevelToBytes(token);
          bytes += raw.has_value() ? *raw : token;
        }
        std::string text;
        AppendUtf8Lossy(bytes, &text);
        tokens.assign(1, std::move(text));
        break;
      }
      case Kind::kByteFallback: {
        std::vector<std::string> out;
        std::string pending;
        auto flush = [&] {
          if (pending.empty()) return;
          if (FindInvalidUtf8(pending).has_value()) {
            for (size_t i = 0; i < pending.size(); ++i) out.push_back("\xEF\xBF\xBD");
          } else {
            out.push_back(pending);
          }
          pending.clear();
        };
        for (std::string& token : tokens) {
          const int value = ByteFallbackValue(token);
          if (value >= 0) {
            pending.push_back(static_cast<char>(value));
          } else {
            flush();
            out.push_back(std::move(token));
          }
        }
        flush();
        tokens = std::move(out);
        break;
      }
      case Kind::kFuse: {
        std::string all;
        for (const std::string& token : tokens) all += token;
        tokens.assign(1, std::move(all));
        break;
      }
      case Kind::kReplace:
        for (std::string& token : tokens) {
          token = absl::StrReplaceAll(token, {{step.pattern, step.content}});
        }
        break;
      case Kind::kStrip:
        for (std::string& token : tokens) {
          size_t begin = 0, end = token.size();
          for (size_t k = 0;
               k < step.start && token.compare(begin, step.content.size(), step.content) == 0;
               ++k) {
            begin += step.content.size();
          }
          for (size_t k = 0;
               k < step.stop && end >= begin + step.content.size() &&
               token.compare(end - step.content.size(), step.content.size(), step.content) == 0;
               ++k) {
            end -= step.content.size();
          }
          token = token.substr(begin, end - begin);
        }
        break;
    }
  }
  std::string text;
  for (const std::string& token : tokens) text += token;
  return text;
}

}  // namespace ringserve::tokenizer_internal
