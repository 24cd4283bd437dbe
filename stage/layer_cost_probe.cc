#include "stage/layer_cost_probe.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <random>
#include <vector>

#include "common/status_macros.h"
#include "fmt/format.h"
#include "proto/stage.pb.h"
#include "ring/model_config.h"
#include "stage/model/slice_weights.h"
#include "stage/stage_backend.h"

namespace ringserve {
namespace {

constexpr int kBlockSize = 16;

// One decode chunk per row, each its own sequence with its own blocks, at position context - 1.
MicroBatch DecodeBatch(int rows, int context, int vocab, std::mt19937* rng) {
  const int blocks = (context + kBlockSize - 1) / kBlockSize;
  MicroBatch batch;
  std::uniform_int_distribution<int32_t> token(0, vocab - 1);
  for (int r = 0; r < rows; ++r) {
    SequenceChunk chunk;
    chunk.seq_id = static_cast<uint64_t>(r + 1);
    chunk.start_position = context - 1;
    chunk.num_tokens = 1;
    for (int b = 0; b < blocks; ++b) chunk.block_table.push_back(r * blocks + b);
    batch.chunks.push_back(std::move(chunk));
    batch.token_ids.push_back(token(*rng));
  }
  return batch;
}

// Microseconds of one decode step through `slice`, until its output is on the host.
absl::StatusOr<double> TimeStep(ModelSlice& slice, const MicroBatch& batch,
                                const std::vector<float>& hidden,
                                const std::vector<RowSampling>& rows) {
  const auto start = std::chrono::steady_clock::now();
  if (slice.is_last()) {
    MicroBatch input = batch;
    if (!slice.is_first()) input.token_ids.clear();
    RS_RETURN_IF_ERROR(slice.Prepare(input));
    if (!slice.is_first()) {
      RS_RETURN_IF_ERROR(slice.activations().CopyFromHost(hidden));
    }
    RS_RETURN_IF_ERROR(slice.Run(input));
    RS_RETURN_IF_ERROR(slice.Sample(input, rows).status());
  } else {
    MicroBatch input = batch;
    if (!slice.is_first()) input.token_ids.clear();
    RS_RETURN_IF_ERROR(slice.Forward(input, hidden).status());
  }
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace

absl::StatusOr<LayerCostProfile> ProbeLayerCosts(const LayerProbeOptions& o) {
  if (o.rows < 1 || o.context < 1 || o.repeats < 1) {
    return absl::InvalidArgumentError(
        fmt::format("layer probe: rows {}, context {}, repeats {}: each must be >= 1", o.rows,
                    o.context, o.repeats));
  }
  RS_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(o.model_dir));
  if (config.max_position_embeddings > 0 && o.context > config.max_position_embeddings) {
    return absl::InvalidArgumentError(
        fmt::format("layer probe: context {} exceeds the model's max_position_embeddings {}",
                    o.context, config.max_position_embeddings));
  }
  LayerCostProfile profile;
  profile.device = o.device;
  profile.rows = o.rows;
  profile.context = o.context;
  const int value_bytes = StageValueBytes(o.device);
  RS_ASSIGN_OR_RETURN(profile.memory_bytes, StageDeviceMemoryBytes(o.device));
  profile.kv_bytes_per_token_and_layer = config.kv_values_per_token_layer() * value_bytes;

  std::mt19937 rng(17);
  const MicroBatch batch = DecodeBatch(o.rows, o.context, config.vocab_size, &rng);
  std::vector<float> hidden(static_cast<size_t>(o.rows) * config.hidden_size);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : hidden) x = normal(rng);
  const std::vector<RowSampling> rows(o.rows);  // greedy
  for (int layer = 0; layer < config.num_layers; ++layer) {
    v1::ConfigureRequest request;
    request.set_model_dir(o.model_dir);
    request.set_first_layer(layer);
    request.set_last_layer(layer + 1);
    request.set_device(o.device);
    request.set_kv_block_size(kBlockSize);
    request.set_kv_num_blocks(o.rows * ((o.context + kBlockSize - 1) / kBlockSize));
    request.set_max_batch_tokens(std::max(o.rows, 256));
    std::string summary;
    RS_ASSIGN_OR_RETURN(std::unique_ptr<ModelSlice> slice, LoadStageSlice(request, &summary));
    std::vector<double> us;
    for (int r = 0; r < o.repeats + 2; ++r) {  // the first two: graph capture, tuning, caches
      RS_ASSIGN_OR_RETURN(double t, TimeStep(*slice, batch, hidden, rows));
      if (r >= 2) us.push_back(t);
    }
    std::nth_element(us.begin(), us.begin() + us.size() / 2, us.end());
    LayerCost cost{.step_us = us[us.size() / 2],
                   .bytes = LayerWeightBytes(config, layer, value_bytes)};
    const int64_t table = int64_t{config.vocab_size} * config.hidden_size * value_bytes;
    if (layer == 0) cost.bytes += table;  // the embedding
    if (layer == config.num_layers - 1) {
      cost.bytes += table + int64_t{config.hidden_size} * value_bytes;  // lm_head, final norm
    }
    profile.layers.push_back(cost);
  }
  return profile;
}

}  // namespace ringserve
