// Which layers attend through a sliding window, from config.json, for every architecture.
//
// transformers 5 writes `layer_types` ("full_attention" / "sliding_attention", one per layer);
// when a file has it, it decides, except for Mistral and Mixtral, whose models never read it.
// Older files decide by each family's own rule, as transformers derives layer_types from them:
//   - Mistral, Mixtral: every layer slides when `sliding_window` is set (Mistral-7B-v0.1: 4096),
//     layer_types or not;
//   - Qwen2 and Qwen3: layers >= `max_window_layers` slide when `use_sliding_window` is true
//     (when it is false no layer slides, layer_types or not: their transformers configs drop the
//     window then); Qwen2-MoE likewise but its even layers < `max_window_layers` slide
//     (Qwen2MoeConfig's rule);
//   - Qwen3-MoE: every layer slides when `use_sliding_window` is true and `sliding_window` is not
//     null, whatever layer_types or max_window_layers say (its config class has neither; its
//     model masks every layer);
//   - gpt-oss: even layers slide, odd layers attend to everything;
//   - Llama, GLM-4.5, DeepSeek: no layer slides.
// A file without the `sliding_window` key takes its config class's default (Mistral and the Qwen
// families 4096, gpt-oss 128); an explicit null is no window.
// A window at least max_position_embeddings never drops a key inside the model's context, so
// such layers are left full (the faster attention kernels run them). A sliding layer needs a
// positive `sliding_window`; DeepSeek's latent attention has no windowed kernel and refuses one.
// Sets config.sliding_window and config.sliding_layers (empty when no layer slides); needs
// architecture, num_layers and max_position_embeddings parsed. InvalidArgument naming the key.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"
#include "ring/model_config.h"

namespace ringserve {

absl::Status ParseSlidingWindow(const nlohmann::json& j, ModelConfig& config,
                                const std::string& source);

}  // namespace ringserve
