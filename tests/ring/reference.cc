#include "tests/ring/reference.h"

#include <numeric>

#include "common/status_macros.h"

namespace ringserve::testing {

namespace {
constexpr int kBlockSize = 16;
constexpr int kBlocks = 64;
}  // namespace

absl::StatusOr<std::unique_ptr<Reference>> Reference::Load(const std::string& model_dir) {
  RS_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(model_dir));
  SliceOptions options;
  options.model_dir = model_dir;
  options.layers = LayerRange{0, config.num_layers};
  options.kv_block_size = kBlockSize;
  options.kv_num_blocks = kBlocks;
  auto reference = std::make_unique<Reference>();
  RS_ASSIGN_OR_RETURN(reference->slice_, ModelSlice::LoadCpu(options));
  return reference;
}

absl::StatusOr<std::vector<int32_t>> Reference::Generate(const std::vector<int32_t>& prompt,
                                                         int max_tokens,
                                                         const SamplingConfig& config) {
  const int total = static_cast<int>(prompt.size()) + max_tokens;
  std::vector<int32_t> blocks((total + kBlockSize - 1) / kBlockSize);
  if (static_cast<int>(blocks.size()) > kBlocks) {
    return absl::InvalidArgumentError("reference: sequence too long");
  }
  std::iota(blocks.begin(), blocks.end(), 0);
  const int vocab = slice_->config().vocab_size;
  std::vector<int32_t> out;
  std::vector<int32_t> feed = prompt;
  int position = 0;
  for (int i = 0; i < max_tokens; ++i) {
    MicroBatch batch;
    SequenceChunk chunk;
    chunk.seq_id = 1;
    chunk.start_position = position;
    chunk.num_tokens = static_cast<int32_t>(feed.size());
    chunk.block_table = blocks;
    chunk.logits = LogitsMode::kLastToken;
    batch.chunks.push_back(chunk);
    batch.token_ids = feed;
    RS_ASSIGN_OR_RETURN(std::vector<float> logits, slice_->Forward(batch, {}));
    if (static_cast<int>(logits.size()) != vocab) {
      return absl::InternalError("reference: unexpected logits size");
    }
    RowSampling row{.config = config, .token_index = static_cast<uint64_t>(i)};
    int32_t token = SampleRow(logits, row);
    out.push_back(token);
    position += static_cast<int>(feed.size());
    feed = {token};
  }
  return out;
}

}  // namespace ringserve::testing
