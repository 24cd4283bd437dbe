// The model a coordinator serves, as the engine needs it: config.json, the tokenizer (when the
// directory has one), EOS ids, and the scheduler options a RingConfig implies for it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/hosts/ring_config.h"
#include "coordinator/scheduler/scheduler.h"
#include "coordinator/tokenizer/tokenizer.h"
#include "ring/model_config.h"

namespace ringserve {

struct ServedModel {
  std::string model_id;  // the directory's name
  ModelConfig config;
  std::shared_ptr<const Tokenizer> tokenizer;  // null without tokenizer.json
  // config.json's and generation_config.json's, else the tokenizer's.
  std::vector<int32_t> eos_token_ids;
};

// Loads config.json (checking it has the layers `ring` was validated for), the EOS ids of
// generation_config.json and tokenizer.json.
absl::StatusOr<ServedModel> LoadServedModel(const RingConfig& ring);

// The scheduler policy for `ring` serving `model` (kv_num_blocks is set per formed ring).
SchedulerOptions SchedulerOptionsFor(const RingConfig& ring, const ServedModel& model,
                                     DecodePacking packing);

}  // namespace ringserve
