#include "coordinator/served_model.h"

#include <filesystem>

#include "common/status_macros.h"
#include "fmt/format.h"
#include "ring/generation_config.h"

namespace ringserve {

absl::StatusOr<ServedModel> LoadServedModel(const RingConfig& ring) {
  ServedModel model;
  model.model_id = std::filesystem::path(ring.model_dir).filename().string();
  if (model.model_id.empty()) model.model_id = ring.model_dir;
  RS_ASSIGN_OR_RETURN(model.config, LoadModelConfig(ring.model_dir));
  if (model.config.num_layers != ring.num_layers) {
    return absl::InvalidArgumentError(fmt::format("{}: validated for {} layers, but {} has {}",
                                                  ring.source, ring.num_layers, ring.model_dir,
                                                  model.config.num_layers));
  }
  if (std::filesystem::exists(std::filesystem::path(ring.model_dir) / "tokenizer.json")) {
    RS_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer,
                        Tokenizer::FromDirectory(ring.model_dir));
    model.tokenizer = std::move(tokenizer);
  }
  // generate() stops on generation_config.json's ids, which chat models extend (gpt-oss's
  // <|call|>); stop on those of both files.
  RS_ASSIGN_OR_RETURN(model.eos_token_ids, LoadEosTokenIds(ring.model_dir, model.config));
  if (model.eos_token_ids.empty() && model.tokenizer && model.tokenizer->eos_token_id()) {
    model.eos_token_ids.push_back(*model.tokenizer->eos_token_id());
  }
  return model;
}

SchedulerOptions SchedulerOptionsFor(const RingConfig& ring, const ServedModel& model,
                                     DecodePacking packing) {
  SchedulerOptions options;
  options.num_stages = ring.num_stages();
  options.max_micro_batches_in_flight = ring.effective_micro_batches_in_flight();
  options.max_tokens_per_micro_batch = ring.scheduler.max_tokens_per_micro_batch;
  options.kv_block_size = ring.scheduler.kv_block_size;
  options.max_context = model.config.max_position_embeddings;
  options.eos_token_ids = model.eos_token_ids;
  options.decode_packing = packing;
  return options;
}

}  // namespace ringserve
