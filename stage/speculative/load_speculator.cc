#include "stage/speculative/load_speculator.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "common/status_macros.h"
#include "fmt/format.h"
#include "ring/model_config.h"
#include "stage/model/cpu_model_slice.h"
#include "stage/speculative/draft_model.h"
#include "stage/speculative/mtp_drafter.h"
#include "stage/stage_backend.h"
#ifdef RINGSERVE_HAVE_CUDA
#include "stage/cuda/cuda_model_slice.h"
#include "stage/speculative/cuda_mtp_drafter.h"
#endif

namespace ringserve {

absl::StatusOr<std::unique_ptr<Speculator>> LoadSpeculator(const v1::ConfigureRequest& request,
                                                           ModelSlice& target) {
  const bool wanted = !request.speculative_model_dir().empty() || request.speculative_mtp();
  if (!wanted || !target.is_last()) return std::unique_ptr<Speculator>();
  const int k = request.num_speculative_tokens();
  if (k < 1 || k > 16) {
    return absl::InvalidArgumentError(
        fmt::format("num_speculative_tokens = {}: must be in [1, 16] with speculation", k));
  }
  if (request.speculative_mtp()) {
#ifdef RINGSERVE_HAVE_CUDA
    if (auto* gpu = dynamic_cast<cuda::CudaModelSlice*>(&target); gpu != nullptr) {
      if (gpu->mtp() == nullptr) {
        return absl::InvalidArgumentError(
            fmt::format("speculative_mtp: {} has no MTP layer (model.layers.{}.*) to draft with",
                        request.model_dir(), target.config().num_layers));
      }
      return std::make_unique<Speculator>(NewCudaMtpDrafter(gpu), k);
    }
#endif
    auto* cpu = dynamic_cast<CpuModelSlice*>(&target);
    if (cpu == nullptr) {
      return absl::UnimplementedError(
          "speculative_mtp: drafting with the MTP layer needs a CPU or CUDA last stage");
    }
    if (cpu->mtp() == nullptr) {
      return absl::InvalidArgumentError(fmt::format(
          "speculative_mtp: {} has no (dense) MTP layer to draft with", request.model_dir()));
    }
    return std::make_unique<Speculator>(std::make_unique<MtpDrafter>(cpu), k);
  }
  RS_ASSIGN_OR_RETURN(ModelConfig draft_config, LoadModelConfig(request.speculative_model_dir()));
  if (draft_config.vocab_size != target.config().vocab_size) {
    return absl::InvalidArgumentError(fmt::format(
        "speculative_model_dir {}: vocabulary of {} tokens, the model has {}",
        request.speculative_model_dir(), draft_config.vocab_size, target.config().vocab_size));
  }
  v1::ConfigureRequest draft = request;
  draft.set_model_dir(request.speculative_model_dir());
  draft.set_first_layer(0);
  draft.set_last_layer(draft_config.num_layers);
  draft.set_stage_index(0);
  draft.set_num_stages(1);
  // The draft needs the target's positions plus k per sequence; its blocks are small.
  draft.set_kv_num_blocks(std::min(target.options().kv_num_blocks + 64, 16384));
  if (draft.memory_fraction() > 0) draft.set_memory_fraction(0.02);
  std::string summary;
  RS_ASSIGN_OR_RETURN(std::unique_ptr<ModelSlice> slice, LoadStageSlice(draft, &summary));
  const int max_batch_tokens =
      request.max_batch_tokens() > 0 ? request.max_batch_tokens() : kDefaultMaxTokensPerMicroBatch;
  const char* fed = std::getenv("RINGSERVE_DRAFT_FED_ROUNDS");  // "0": A/B runs
  const bool fed_rounds = fed == nullptr || std::string(fed) != "0";
  return std::make_unique<Speculator>(
      std::make_unique<DraftModel>(std::move(slice), max_batch_tokens, fed_rounds), k);
}

}  // namespace ringserve
