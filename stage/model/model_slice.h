// The contract between a stage and the model: a contiguous slice of decoder layers, with its
// share of the KV cache, run one micro-batch at a time. One interface for every backend (the
// CPU reference slice, the CUDA slice); the step executor and the benchmarks drive it the same
// way:
//
//   Prepare(batch)              validate, size activations(), (CUDA) upload the batch metadata
//   [fill activations()]        not the first slice: the previous stage's hidden states
//   Run(batch)                  the layers; not last: the output is left in activations()
//   Sample(batch, rows)         last slice: one token per LAST_TOKEN row, on the host
//
// with BeginStepTiming() / EndStepTiming() around a step and TakeStepMicros() for its busy
// time. Forward() below wraps the sequence for tools and tests that want host vectors.
//
// The micro-batch layout is in ring/micro_batch.h.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ring/defaults.h"
#include "ring/kv_cache_dtype.h"
#include "ring/micro_batch.h"
#include "ring/model_config.h"
#include "ring/sampling_config.h"
#include "stage/model/activation_buffer.h"

namespace ringserve {

struct SliceOptions {
  std::string model_dir;                    // Hugging Face directory: config.json + *.safetensors
  LayerRange layers;                        // which decoder layers this slice runs
  int kv_block_size = kDefaultKvBlockSize;  // positions per KV block
  int kv_num_blocks = 256;  // blocks in this slice's pool (each holds K and V of every layer)
  // The pool's element type: auto = the backend's (fp32 CPU, bf16 CUDA), or e4m3 with per-layer
  // K and V scales (kv_cache_scales.h).
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kAuto;
};

// The last slice's result for one micro-batch: one entry per LAST_TOKEN chunk, in chunk order.
struct SampledRows {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;  // log_softmax(raw logits)[token], same order
};

// A token the next step takes from the last sampling on the device (ModelSlice::PrepareFed):
// the batch's token_ids[token_row] becomes row `sampled_row` (one per LAST_TOKEN chunk, in
// chunk order, as SampledRows) of the newest SampleAsync's output.
struct TokenFeed {
  int32_t token_row = 0;
  int32_t sampled_row = 0;
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

  // The buffer the slice reads its input hidden states from and leaves its output in
  // (activation_buffer.h); its memory() says whether it is host or device memory.
  virtual ActivationBuffer& activations() = 0;
  virtual const ActivationBuffer& activations() const = 0;

  // Validates `batch` and sizes activations() to its tokens (the CUDA slice also enqueues the
  // upload of the batch's metadata, so that Run only launches). InvalidArgument for a
  // malformed batch (sizes, positions, block ids out of range, more tokens than the buffer
  // holds); nothing is run then.
  virtual absl::Status Prepare(const MicroBatch& batch) = 0;
  // Runs `batch` (the object given to the preceding Prepare, unchanged; a slice may prepare it
  // again when it was not) and writes its tokens' K/V into the named blocks. Input: the hidden
  // states in activations(), [tokens, hidden] fp32; the first slice embeds batch.token_ids
  // instead. Output: not the last slice, the hidden states in activations(); the last slice,
  // the logits rows (in chunk order, as each chunk's LogitsMode asks) kept for Sample or
  // LogitsToHost. A device slice only enqueues the work on activations().stream().
  // InvalidArgument for a malformed batch; the KV cache is then unchanged.
  virtual absl::Status Run(const MicroBatch& batch) = 0;
  // The last slice, after Run(batch): samples one token per logits row (`rows`, one per
  // LAST_TOKEN chunk and num_tokens per ALL_TOKENS chunk, in chunk order: speculative
  // verification takes the argmax of every row; stage/sampling/sampler.h's contract, on the
  // device for the CUDA slice, whose rows must fit one lm_head pass: max_logit_rows) and returns
  // when the tokens are on the host. InvalidArgument when rows.size() differs from the batch's
  // logits rows or a row's parameters are invalid; FailedPrecondition on a slice that is not last
  // or without a preceding Run(batch).
  virtual absl::StatusOr<SampledRows> Sample(const MicroBatch& batch,
                                             std::span<const RowSampling> rows) = 0;
  // Sampling left in flight, for a slice that is both first and last (a one-stage ring with
  // plans sent ahead): SampleAsync enqueues what Sample does and returns at once; the next
  // step, prepared with PrepareFed, takes its placeholders' tokens from that sampling on the
  // device, so the device runs step after step while the host collects each step's tokens
  // (WaitSample, oldest first) and reports them. At most kMaxSamplesInFlight samplings wait
  // to be collected (a draft model's greedy rounds, each fed the last one's token, run up to
  // that many ahead of the host); Sample, LogitsToHost and every other use of the logits need
  // none in flight. A slice without this (the CPU slice, a CUDA slice sampling on the host)
  // answers false to can_sample_async() and Unimplemented to the calls.
  static constexpr int kMaxSamplesInFlight = 8;
  virtual bool can_sample_async() const { return false; }
  // After Run(batch), as Sample (same errors); FailedPrecondition when kMaxSamplesInFlight wait.
  virtual absl::Status SampleAsync(const MicroBatch& batch, std::span<const RowSampling> rows);
  // Whether the oldest sampling in flight has its tokens on the host (true when none waits).
  virtual bool SampleReady() { return true; }
  // The oldest sampling's tokens, once on the host. FailedPrecondition when none is in flight.
  virtual absl::StatusOr<SampledRows> WaitSample();
  // Prepare(batch), then each feed's token (TokenFeed) from the newest SampleAsync's device
  // output; batch.token_ids at the fed rows are ignored (they must still be valid ids).
  // InvalidArgument for a feed out of range; FailedPrecondition on a slice that is not first
  // and last, or when no SampleAsync output is held (none yet, or a Sample since overwrote it).
  virtual absl::Status PrepareFed(const MicroBatch& batch, std::span<const TokenFeed> feeds);

  // The last slice, after Run: the logits rows [rows, vocab] fp32, copied to the host.
  // FailedPrecondition on a slice that is not last or before a Run.
  virtual absl::StatusOr<std::vector<float>> LogitsToHost() = 0;

  // Busy time of steps. BeginStepTiming() before a step's work starts, EndStepTiming() after
  // its output was sent or sampled. TakeStepMicros() returns the busy time of the timed steps
  // that have finished since the previous call: CPU time on the host; on a GPU the GPU time
  // (the CPU only enqueues the work: a step still running is counted by a later call).
  virtual void BeginStepTiming() = 0;
  virtual void EndStepTiming() = 0;
  virtual int64_t TakeStepMicros() = 0;

  // Convenience for tools and tests (not the serving path, which keeps activations where they
  // live): Prepare, `hidden_in` into activations(), Run; returns, on a slice that is not last,
  // the hidden states [total_tokens, hidden] fp32, host; on the last slice, the logits
  // [rows, vocab] fp32, host, rows in chunk order as each chunk's LogitsMode asks.
  //   hidden_in: [total_tokens, hidden] fp32, host; ignored (may be empty) on the first slice.
  // InvalidArgument for a malformed batch or a hidden_in of the wrong size; the KV cache is
  // then unchanged.
  absl::StatusOr<std::vector<float>> Forward(const MicroBatch& batch,
                                             std::span<const float> hidden_in);
};

}  // namespace ringserve
