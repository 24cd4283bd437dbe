#include "ring/config_json.h"

#include "common/status_macros.h"
#include "fmt/format.h"

namespace ringserve::config_json {

absl::Status Invalid(const std::string& source, const std::string& what) {
  return absl::InvalidArgumentError(fmt::format("{}: {}", source, what));
}

absl::StatusOr<std::optional<int64_t>> GetInt(const Json& j, const std::string& key,
                                              const std::string& source, bool required) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) return Invalid(source, fmt::format("missing required field \"{}\"", key));
    return std::optional<int64_t>();
  }
  if (!it->is_number_integer()) {
    return Invalid(source, fmt::format("field \"{}\" must be an integer, got {}", key, it->dump()));
  }
  return std::optional<int64_t>(it->get<int64_t>());
}

absl::StatusOr<std::optional<double>> GetNumber(const Json& j, const std::string& key,
                                                const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::optional<double>();
  if (!it->is_number()) {
    return Invalid(source, fmt::format("field \"{}\" must be a number, got {}", key, it->dump()));
  }
  return std::optional<double>(it->get<double>());
}

absl::StatusOr<bool> GetBool(const Json& j, const std::string& key, bool fallback,
                             const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) {
    return Invalid(source,
                   fmt::format("field \"{}\" must be true or false, got {}", key, it->dump()));
  }
  return it->get<bool>();
}

absl::StatusOr<int> GetPositive(const Json& j, const std::string& key, const std::string& source) {
  RS_ASSIGN_OR_RETURN(std::optional<int64_t> value, GetInt(j, key, source, /*required=*/true));
  if (*value <= 0 || *value > (int64_t{1} << 30)) {
    return Invalid(source,
                   fmt::format("field \"{}\" must be a positive integer, got {}", key, *value));
  }
  return static_cast<int>(*value);
}

absl::StatusOr<std::vector<int64_t>> GetIntList(const Json& j, const std::string& key,
                                                const std::string& source) {
  std::vector<int64_t> out;
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return out;
  if (!it->is_array()) {
    return Invalid(source, fmt::format("field \"{}\" must be a list of integers", key));
  }
  for (const Json& v : *it) {
    if (!v.is_number_integer()) {
      return Invalid(source, fmt::format("field \"{}\" must be a list of integers", key));
    }
    out.push_back(v.get<int64_t>());
  }
  return out;
}

absl::StatusOr<std::optional<std::string>> GetString(const Json& j, const std::string& key,
                                                     const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::optional<std::string>();
  if (!it->is_string()) {
    return Invalid(source, fmt::format("field \"{}\" must be a string, got {}", key, it->dump()));
  }
  return std::optional<std::string>(it->get<std::string>());
}

}  // namespace ringserve::config_json
