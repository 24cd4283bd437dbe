// The element type of a stage's KV cache (`kv_cache_dtype` in hosts.yaml, on the coordinator's
// and the stage's command line, and in ConfigureRequest). One spelling for each value:
//   "auto"      the model's compute type: fp32 on a CPU stage, bf16 on a CUDA stage
//   "fp8_e4m3"  float8_e4m3fn with one fp32 scale per layer for K and one for V: a value x is
//               stored as e4m3(x / scale) (round to nearest even, saturated to +-448) and read
//               as e4m3 * scale. Scales come from the checkpoint (kv_cache_scales.h), else 1.0.
//               One byte per value: a CUDA stage's pool holds twice the tokens of bf16's, a CPU
//               stage's four times fp32's.
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace ringserve {

enum class KvCacheDtype { kAuto, kFp8E4m3 };

// "auto" or "fp8_e4m3".
std::string_view KvCacheDtypeName(KvCacheDtype dtype);

// Parses a spelling above; the empty string is "auto". InvalidArgument naming `field` (e.g.
// "stages[1].kv_cache_dtype", "--kv_cache_dtype") and the accepted values for anything else.
absl::StatusOr<KvCacheDtype> ParseKvCacheDtype(std::string_view text, std::string_view field);

// Bytes of one cached value: 1 for fp8_e4m3, else `auto_bytes` (the backend's compute type: 4 on
// a CPU stage, 2 on a CUDA stage).
int64_t KvCacheElementBytes(KvCacheDtype dtype, int64_t auto_bytes);

}  // namespace ringserve
