#include "ring/kv_cache_dtype.h"

#include "fmt/format.h"

namespace ringserve {

std::string_view KvCacheDtypeName(KvCacheDtype dtype) {
  switch (dtype) {
    case KvCacheDtype::kAuto:
      return "auto";
    case KvCacheDtype::kFp8E4m3:
      return "fp8_e4m3";
  }
  return "?";
}

absl::StatusOr<KvCacheDtype> ParseKvCacheDtype(std::string_view text, std::string_view field) {
  if (text.empty() || text == "auto") return KvCacheDtype::kAuto;
  if (text == "fp8_e4m3") return KvCacheDtype::kFp8E4m3;
  return absl::InvalidArgumentError(
      fmt::format("{}: '{}' is not a KV cache dtype (auto or fp8_e4m3)", field, text));
}

int64_t KvCacheElementBytes(KvCacheDtype dtype, int64_t auto_bytes) {
  return dtype == KvCacheDtype::kFp8E4m3 ? 1 : auto_bytes;
}

}  // namespace ringserve
