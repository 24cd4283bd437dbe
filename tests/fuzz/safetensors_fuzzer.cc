// Fuzzes the safetensors header parser (stage/model/safetensors.h): the input is a whole
// .safetensors file (u64 header size, JSON header, tensor bytes).
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <string>

#include "stage/model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const int fd = memfd_create("safetensors_fuzz", 0);
  if (fd < 0) return 0;
  if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) return 0;
  auto file = ringserve::SafetensorsFile::Open("/proc/self/fd/" + std::to_string(fd));
  if (file.ok()) {
    for (const auto& [name, info] : (*file)->tensors()) (void)name, (void)info;
  }
  return 0;
}
