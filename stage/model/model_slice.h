// The contract between a stage and the model: a contiguous slice of decoder layers, with its
// share of the KV cache, run one micro-batch at a time.
//
// Layout of a micro-batch: the tokens of all chunks laid out chunk after chunk, so a tensor of
// [total_tokens, hidden] holds chunk 0's tokens first. KV blocks are allocated by the
// coordinator (it has the global view, capacity = min over stages) and named in each chunk's
// block table; a slice only reads and writes the blocks it is told about.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "stage/model/model_config.h"

namespace ringserve {

// Decoder layers [first, last) of a model with `num_layers` layers.
struct LayerRange {
  int first = 0;
  int last = 0;
  int size() const { return last - first; }
};

// Which logits the last slice returns for a chunk.
enum class LogitsMode {
  kNone,       // no logits (e.g. a prefill chunk that does not end the prompt)
  kLastToken,  // one row: the chunk's final token (decode, or the prompt's last chunk)
  kAllTokens,  // one row per token of the chunk (tests, prompt logprobs)
};

// One sequence's part of a micro-batch.
struct SequenceChunk {
  uint64_t seq_id = 0;
  // Tokens of this sequence whose K/V are already cached; this chunk's tokens take positions
  // [start_position, start_position + num_tokens).
  int32_t start_position = 0;
  int32_t num_tokens = 0;
  // KV block ids; entry i holds positions [i * block_size, (i + 1) * block_size). Must cover
  // start_position + num_tokens positions. The same ids are valid on every stage.
  std::vector<int32_t> block_table;
  LogitsMode logits = LogitsMode::kLastToken;
};

struct MicroBatch {
  std::vector<SequenceChunk> chunks;
  // First slice only: [total_tokens] token ids, chunk after chunk. Empty on other slices.
  std::vector<int32_t> token_ids;

  int64_t TotalTokens() const {
    int64_t total = 0;
    for (const auto& chunk : chunks) total += chunk.num_tokens;
    return total;
  }
};

struct SliceOptions {
  std::string model_dir;    // Hugging Face directory: config.json + *.safetensors
  LayerRange layers;        // which decoder layers this slice runs
  int kv_block_size = 16;   // positions per KV block
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
