#include "ring/generation_config.h"

#include <algorithm>

#include "absl/status/status.h"
#include "common/bounded_file.h"
#include "common/json_limits.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"

namespace ringserve {
namespace {

using Json = nlohmann::json;

absl::Status Invalid(const std::string& source, const std::string& what) {
  return absl::InvalidArgumentError(fmt::format("{}: {}", source, what));
}

absl::StatusOr<int32_t> EosId(const Json& id, const std::string& source) {
  if (!id.is_number_integer()) {
    return Invalid(source, fmt::format("eos_token_id must be an integer or a list of integers, "
                                       "got {}",
                                       id.dump()));
  }
  if (id.is_number_unsigned() ? id.get<uint64_t>() > INT32_MAX
                              : id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX) {
    return Invalid(source, fmt::format("eos_token_id {} is out of range", id.dump()));
  }
  return static_cast<int32_t>(id.get<int64_t>());
}

}  // namespace

absl::StatusOr<std::vector<int32_t>> ParseGenerationEosTokenIds(const std::string& json_text,
                                                                const std::string& source) {
  RS_RETURN_IF_ERROR(CheckJsonDepth(json_text, source));
  Json j;
  try {
    j = Json::parse(json_text);
  } catch (const Json::exception& e) {
    return Invalid(source, fmt::format("malformed JSON: {}", e.what()));
  }
  if (!j.is_object()) return Invalid(source, "top level must be a JSON object");
  std::vector<int32_t> ids;
  auto it = j.find("eos_token_id");
  if (it == j.end() || it->is_null()) return ids;
  if (!it->is_array()) {
    RS_ASSIGN_OR_RETURN(const int32_t id, EosId(*it, source));
    ids.push_back(id);
    return ids;
  }
  for (const Json& id : *it) {
    RS_ASSIGN_OR_RETURN(const int32_t value, EosId(id, source));
    ids.push_back(value);
  }
  return ids;
}

absl::StatusOr<std::vector<int32_t>> LoadGenerationEosTokenIds(const std::string& model_dir) {
  const std::string path = model_dir + "/generation_config.json";
  absl::StatusOr<std::string> text = ReadBoundedFile(path, kMaxConfigJsonBytes);
  if (absl::IsNotFound(text.status())) return std::vector<int32_t>();
  RS_RETURN_IF_ERROR(text.status());
  return ParseGenerationEosTokenIds(*text, path);
}

std::vector<int32_t> MergeEosTokenIds(std::vector<int32_t> first,
                                      const std::vector<int32_t>& second) {
  for (int32_t id : second) {
    if (std::find(first.begin(), first.end(), id) == first.end()) first.push_back(id);
  }
  return first;
}

absl::StatusOr<std::vector<int32_t>> LoadEosTokenIds(const std::string& model_dir,
                                                     const ModelConfig& config) {
  RS_ASSIGN_OR_RETURN(const std::vector<int32_t> generation, LoadGenerationEosTokenIds(model_dir));
  return MergeEosTokenIds(config.eos_token_ids, generation);
}

}  // namespace ringserve
