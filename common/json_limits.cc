#include "common/json_limits.h"

#include "fmt/format.h"

namespace ringserve {

absl::Status CheckJsonDepth(std::string_view text, std::string_view what, int max_depth) {
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) {
        return absl::InvalidArgumentError(
            fmt::format("{}: JSON nested deeper than {} levels (at byte {})", what, max_depth, i));
      }
    } else if (c == ']' || c == '}') {
      if (depth > 0) --depth;
    }
  }
  return absl::OkStatus();
}

}  // namespace ringserve
