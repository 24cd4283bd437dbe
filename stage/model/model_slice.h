// The contract between a stage and the model: a contiguous slice of decoder layers, with its
// share of the KV cache, run one micro-batch at a time.
//
// The micro-batch layout is in ring/micro_batch.h.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ring/micro_batch.h"
#include "ring/model_config.h"
#include "ring/defaults.h"

namespace ringserve {

struct SliceOptions {
  std::string model_dir;    // Hugging Face directory: config.json + *.safetensors
  LayerRange layers;        // which decoder layers this slice runs
  int kv_block_size = kDefaultKvBlockSize;  // positions per KV block
  int kv_num_blocks = 256;  // blocks in this slice's pool (each holds K and V of every layer)
};

// A loaded slice. Not thread-safe: one caller runs micro-batches in order.
class ModelSlice {
 public:
  virtual ~ModelSlice() = default;

  // Loads the CPU reference slice: only the tensors of `options.layers` (plus embeddings when
  // the slice starts at layer 0, final norm and lm_head when it ends at the last layer).
  // Errors name the file and tensor.
  static absl::StatusOr<std::unique_ptr<ModelSlice>> LoadCpu(const SliceOptions& options);

  virtual const ModelConfig& config() const = 0;
  virtual const SliceOptions& options() const = 0;
  bool is_first() const { return options().layers.first == 0; }
  bool is_last() const { return options().layers.last == config().num_layers; }

  // Runs one micro-batch through the slice and writes its tokens' K/V into the named blocks.
  //   hidden_in: [total_tokens, hidden] fp32, host; ignored (may be empty) on the first slice,
  //              which embeds batch.token_ids instead.
  // Returns, on a slice that is not last, the hidden states [total_tokens, hidden] fp32;
  // on the last slice, the logits [rows, vocab] fp32, rows in chunk order as each chunk's
  // LogitsMode asks. InvalidArgument for a malformed batch (sizes, positions, block ids out of
  // range); the KV cache is then unchanged.
  virtual absl::StatusOr<std::vector<float>> Forward(const MicroBatch& batch,
                                                     std::span<const float> hidden_in) = 0;
};

}  // namespace ringserve
