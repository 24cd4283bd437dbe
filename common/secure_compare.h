// Comparison of secrets (API keys, MACs) in time that depends only on the lengths, so that a
// client cannot learn a key byte by byte from response times.
#pragma once

#include <cstddef>
#include <string_view>

namespace ringserve {

// True when `a == b`. The time taken depends on the sizes only, not on where they differ.
inline bool SecureEquals(std::string_view a, std::string_view b) {
  volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = a.size() < b.size() ? a.size() : b.size();
  for (size_t i = 0; i < n; ++i) {
    diff = diff | static_cast<unsigned char>(a[i] ^ b[i]);
  }
  return diff == 0;
}

}  // namespace ringserve
