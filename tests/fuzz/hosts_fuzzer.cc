// Fuzzes hosts.yaml parsing and validation (coordinator/hosts/ring_config.h).
#include <cstdint>

#include "coordinator/hosts/ring_config.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)ringserve::ParseRingConfig(ringserve::fuzz::AsText(data, size), "fuzz/hosts.yaml",
                                   /*num_layers=*/32);
  return 0;
}
