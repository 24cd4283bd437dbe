// Builds the last stage's Speculator from its ConfigureRequest: the draft model
// (speculative_model_dir) loaded whole on the stage's own device, with a KV pool as large as the
// target slice's; or (speculative_mtp) the target's own MTP layer (mtp_drafter.h; a CPU last
// stage of a DeepSeek checkpoint with one). Null when the request asks for no speculation (or
// the stage is not last).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "proto/stage.pb.h"
#include "stage/model/model_slice.h"
#include "stage/speculative/speculator.h"

namespace ringserve {

// InvalidArgument naming the field for a bad combination (num_speculative_tokens out of
// [1, 16], a draft with another vocabulary, speculative_mtp without an MTP layer);
// Unimplemented for speculative_mtp on a CUDA stage; loader errors name the draft's files.
absl::StatusOr<std::unique_ptr<Speculator>> LoadSpeculator(const v1::ConfigureRequest& request,
                                                           ModelSlice& target);

}  // namespace ringserve
