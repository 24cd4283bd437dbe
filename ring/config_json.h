// Typed field readers over a parsed config.json (nlohmann::json), shared by the config parsers.
// Every error is InvalidArgument "<source>: <what>" naming the field.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace ringserve::config_json {

using Json = nlohmann::json;

absl::Status Invalid(const std::string& source, const std::string& what);

// An integer field; `required` fields must be present and non-null.
absl::StatusOr<std::optional<int64_t>> GetInt(const Json& j, const std::string& key,
                                              const std::string& source, bool required);
// A number field, absent or null -> nullopt.
absl::StatusOr<std::optional<double>> GetNumber(const Json& j, const std::string& key,
                                                const std::string& source);
// A boolean field, absent or null -> fallback.
absl::StatusOr<bool> GetBool(const Json& j, const std::string& key, bool fallback,
                             const std::string& source);
// A required integer in [1, 2^30].
absl::StatusOr<int> GetPositive(const Json& j, const std::string& key, const std::string& source);
// A list of integers, absent or null -> empty.
absl::StatusOr<std::vector<int64_t>> GetIntList(const Json& j, const std::string& key,
                                                const std::string& source);
// A string field, absent or null -> nullopt.
absl::StatusOr<std::optional<std::string>> GetString(const Json& j, const std::string& key,
                                                     const std::string& source);

}  // namespace ringserve::config_json
