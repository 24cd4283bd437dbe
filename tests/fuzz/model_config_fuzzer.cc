// Fuzzes config.json parsing (ring/model_config.h).
#include <cstdint>
#include <string>

#include "ring/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  (void)ringserve::ParseModelConfig(text, "fuzz/config.json");
  return 0;
}
