#include "ring/sliding_window_parse.h"

#include <algorithm>
#include <cstdint>
#include <optional>

#include "common/status_macros.h"
#include "fmt/format.h"
#include "ring/config_json.h"

namespace ringserve {
namespace {

using config_json::GetBool;
using config_json::GetInt;
using config_json::Invalid;
using Json = nlohmann::json;

// transformers' default max_window_layers of the Qwen families.
constexpr int64_t kQwenMaxWindowLayers = 28;

bool IsQwenFamily(Architecture a) {
  return a == Architecture::kQwen2 || a == Architecture::kQwen3 || a == Architecture::kQwen2Moe ||
         a == Architecture::kQwen3Moe;
}

// The config class's sliding_window when a file leaves the key out (an explicit null is no
// window): MistralConfig and the Qwen configs 4096, GptOssConfig 128.
std::optional<int64_t> DefaultWindow(Architecture a) {
  if (a == Architecture::kMistral || IsQwenFamily(a)) return 4096;
  if (a == Architecture::kGptOss) return 128;
  return std::nullopt;
}

// The family's rule for files without layer_types (see the header); Qwen files reach it only
// with use_sliding_window true.
absl::StatusOr<std::vector<bool>> FamilyRule(const Json& j, const ModelConfig& c,
                                             std::optional<int64_t> window,
                                             const std::string& source) {
  std::vector<bool> sliding(c.num_layers, false);
  const Architecture a = c.architecture;
  if ((a == Architecture::kMistral || a == Architecture::kMixtral) && window) {
    sliding.assign(c.num_layers, true);
  } else if (IsQwenFamily(a) && window) {
    RS_ASSIGN_OR_RETURN(std::optional<int64_t> bound,
                        GetInt(j, "max_window_layers", source, false));
    const int64_t max_window_layers = bound.value_or(kQwenMaxWindowLayers);
    for (int layer = 0; layer < c.num_layers; ++layer) {
      // Qwen2MoeConfig: every other layer below max_window_layers, starting with the first;
      // Qwen2Config and Qwen3Config: the layers from max_window_layers on.
      sliding[layer] = a == Architecture::kQwen2Moe ? layer % 2 == 0 && layer < max_window_layers
                                                    : layer >= max_window_layers;
    }
  } else if (a == Architecture::kGptOss) {
    for (int layer = 0; layer < c.num_layers; ++layer) sliding[layer] = layer % 2 == 0;
  }
  return sliding;
}

absl::StatusOr<std::vector<bool>> FromLayerTypes(const Json& types, const ModelConfig& c,
                                                 const std::string& source) {
  if (!types.is_array() || static_cast<int>(types.size()) != c.num_layers) {
    return Invalid(source,
                   fmt::format("layer_types must list one type per layer ({})", c.num_layers));
  }
  std::vector<bool> sliding(c.num_layers, false);
  for (int layer = 0; layer < c.num_layers; ++layer) {
    const Json& type = types[layer];
    const std::string name = type.is_string() ? type.get<std::string>() : type.dump();
    if (name == "sliding_attention") {
      sliding[layer] = true;
    } else if (name != "full_attention") {
      return Invalid(source, fmt::format("unsupported layer type \"{}\" in layer_types[{}] (only "
                                         "full_attention and sliding_attention)",
                                         name, layer));
    }
  }
  return sliding;
}

}  // namespace

absl::Status ParseSlidingWindow(const Json& j, ModelConfig& c, const std::string& source) {
  RS_ASSIGN_OR_RETURN(std::optional<int64_t> window, GetInt(j, "sliding_window", source, false));
  if (!j.contains("sliding_window")) window = DefaultWindow(c.architecture);
  c.sliding_window = 0;
  c.sliding_layers.clear();
  if (IsQwenFamily(c.architecture)) {
    // transformers' Qwen configs drop the window unless use_sliding_window is true, so every
    // layer attends to everything then, whatever layer_types says.
    RS_ASSIGN_OR_RETURN(const bool use, GetBool(j, "use_sliding_window", false, source));
    if (!use) return absl::OkStatus();
  }
  std::vector<bool> sliding;
  const auto types = j.find("layer_types");
  if (c.architecture == Architecture::kQwen3Moe) {
    // Qwen3MoeConfig has neither layer_types nor max_window_layers: its model masks every
    // layer with the window (as Mixtral) and ignores those keys in a file; a null window is
    // no window.
    sliding.assign(c.num_layers, window.has_value());
  } else if (c.architecture == Architecture::kMistral || c.architecture == Architecture::kMixtral) {
    // Their transformers attention takes config.sliding_window on every layer and never reads
    // layer_types (MistralConfig warns that such a file wants Ministral).
    RS_ASSIGN_OR_RETURN(sliding, FamilyRule(j, c, window, source));
  } else if (types != j.end() && !types->is_null()) {
    RS_ASSIGN_OR_RETURN(sliding, FromLayerTypes(*types, c, source));
  } else {
    RS_ASSIGN_OR_RETURN(sliding, FamilyRule(j, c, window, source));
  }
  if (std::none_of(sliding.begin(), sliding.end(), [](bool s) { return s; })) {
    return absl::OkStatus();
  }
  if (!window || *window <= 0) {
    return Invalid(source, "sliding_attention layers need a positive sliding_window");
  }
  // A window covering the whole context changes nothing (Qwen2's files say 32768 of 32768).
  if (c.max_position_embeddings > 0 && *window >= c.max_position_embeddings) {
    return absl::OkStatus();
  }
  if (c.mla) {
    return Invalid(source, "sliding_window: DeepSeek's latent attention has no sliding window");
  }
  c.sliding_window = static_cast<int>(std::min<int64_t>(*window, int64_t{1} << 30));
  c.sliding_layers = std::move(sliding);
  return absl::OkStatus();
}

}  // namespace ringserve
