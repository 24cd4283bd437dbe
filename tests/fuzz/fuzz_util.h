// Helpers shared by the libFuzzer targets in tests/fuzz (built with -DRINGSERVE_FUZZ=ON).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

namespace ringserve::fuzz {

inline std::string_view AsText(const uint8_t* data, size_t size) {
  return std::string_view(reinterpret_cast<const char*>(data), size);
}

// Splits the input at the first "\n---\n" (a seed's two parts, e.g. template and messages);
// the second part is empty when there is no separator.
inline std::pair<std::string_view, std::string_view> SplitTwo(std::string_view text) {
  constexpr std::string_view kSeparator = "\n---\n";
  size_t at = text.find(kSeparator);
  if (at == std::string_view::npos) return {text, std::string_view()};
  return {text.substr(0, at), text.substr(at + kSeparator.size())};
}

}  // namespace ringserve::fuzz
