// The coordinator's engine as the client-facing APIs see it (gRPC Generate, OpenAI HTTP,
// metrics, dashboard). The ring implementation lives behind it; the APIs never see stages.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ringserve {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy
  int top_k = 0;             // 0 = off
  float top_p = 1.0f;        // 1 = off
  std::optional<uint64_t> seed;
  int max_tokens = 16;
  std::vector<std::string> stop;        // stop strings, matched on detokenized text
  std::vector<int32_t> stop_token_ids;  // in addition to the model's EOS ids
  bool ignore_eos = false;
  // EOS and stop_token_ids are never sampled before this many tokens were generated (the last
  // stage masks them; <= max_tokens). Stop strings still apply.
  int min_tokens = 0;
  // Report each generated token's log-probability (GenerateEvent::logprobs) and this many most
  // likely alternatives (0..kMaxTopLogprobs), from the raw logits' log_softmax (before
  // temperature, top-k and top-p, as vLLM and OpenAI report them).
  bool logprobs = false;
  int top_logprobs = 0;
};

// The most choices one API request may ask for (OpenAI's n; each is its own engine request).
inline constexpr int kMaxChoices = 16;

// One generated token's log-probabilities (SamplingParams::logprobs).
struct TokenLogprobs {
  int32_t token_id = 0;
  float logprob = 0.0f;
  std::vector<std::pair<int32_t, float>> top{};  // most likely first
};

struct GenerateRequest {
  std::string request_id;  // unique per running request; names it in logs and errors
  std::vector<int32_t> prompt_ids;
  SamplingParams sampling;
  // Report log p(prompt[i + 1] | prompt[0..i]) for every prompt token after the first
  // (GenerateEvent::prompt_logprobs). Costs a logits row per prompt token on the last stage.
  bool prompt_logprobs = false;
  // Choice i > 0 of an API request whose choice 0 already runs (GenerateRequest per choice, see
  // kMaxChoices): while the ring is down it waits with the running choice instead of being
  // refused as a new request is.
  bool later_choice = false;
};

enum class FinishReason { kNone, kStop, kLength, kCancelled, kError };

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
};

// One streamed update. Deltas concatenate to the full output; the last event has finished set.
struct GenerateEvent {
  std::vector<int32_t> token_ids;  // new tokens since the last event
  std::string text_delta;          // new text, never a broken UTF-8 sequence, stop strings cut
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  Usage usage;
  absl::Status error;  // set when finish_reason == kError
  // When the request asked for them: on the first event that carries a token, entry i =
  // log p(prompt[i + 1] | prompt[0..i]) from the raw logits; prompt length - 1 entries.
  std::vector<float> prompt_logprobs;
  // With SamplingParams::logprobs: one entry per token of token_ids, same order.
  std::vector<TokenLogprobs> logprobs;
};

struct StageStats {
  int index = 0;
  std::string endpoint;
  int first_layer = 0;
  int last_layer = 0;
  double busy_fraction = 0;  // busy time / wall time over the recent window
  double mean_step_ms = 0;   // mean busy time per micro-batch
  int micro_batches_in_flight = 0;
  int64_t kv_blocks_used = 0;
  int64_t kv_blocks_total = 0;
  int64_t bytes_sent = 0;   // activation bytes to the next stage, cumulative
  std::string load_status;  // start-up progress ("loading 3/12 tensors", "ready")
  int64_t steps = 0;        // micro-batches this stage has finished, cumulative
  double mean_wait_ms = 0;  // mean wait for the previous stage's activations, recent window
};

// One micro-batch's trip through one stage, for the dashboard's timeline.
struct StageSpan {
  uint64_t micro_batch_id = 0;
  int stage_index = 0;
  int64_t start_us = 0;  // coordinator clock, microseconds since engine start
  int64_t end_us = 0;
  int num_tokens = 0;
};

struct RequestStats {
  int64_t requests_finished = 0;
  int64_t requests_failed = 0;
  int64_t requests_cancelled = 0;
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  int queue_depth = 0;  // waiting, not yet admitted
  int running = 0;
  double tokens_per_second = 0;  // generated, recent window
  // Means over every finished request so far (0 until one finished).
  double mean_queue_ms = 0;          // submitted -> first scheduled
  double mean_ttft_ms = 0;           // submitted -> first generated token
  double mean_inter_token_ms = 0;    // between consecutive generated tokens
  int micro_batches_in_flight = 0;   // plans sent and not yet returned by the last stage
  int64_t preemptions = 0;           // cumulative
  int64_t ring_restarts = 0;         // the ring re-formed after a stage failure, cumulative
  int64_t resumed_requests = 0;      // requests resumed by recomputation after a re-form
  int64_t rejected = 0;              // new requests refused by the engine: its ring was down
  int64_t prefix_lookup_tokens = 0;  // prompt tokens of admitted requests, cumulative
  int64_t prefix_hit_tokens = 0;     // of those, found in the prefix cache (prefill skipped)
  int64_t ahead_decodes = 0;         // decodes planned ahead (coordinator/plan_ahead.h)
  int64_t ahead_discarded = 0;       // of those, tokens discarded (the sequence had finished)
  // Speculative decoding, cumulative (coordinator/scheduler/speculation.h).
  int64_t speculative_verifications = 0;        // verification chunks
  int64_t speculative_drafts_verified = 0;      // drafts they carried
  int64_t speculative_drafts_accepted = 0;      // of those, accepted
  int64_t speculative_verification_tokens = 0;  // tokens they emitted (accepted + 1 each)
};

// One finished request's timings (recent ones, for the dashboard and /metrics).
struct RequestTiming {
  std::string request_id;
  double queue_ms = 0;  // submitted -> first scheduled
  double ttft_ms = 0;   // submitted -> first generated token (0 if none)
  double mean_inter_token_ms = 0;
  double max_inter_token_ms = 0;
  int prompt_tokens = 0;
  int completion_tokens = 0;
  FinishReason finish_reason = FinishReason::kNone;
};

struct RingStats {
  std::vector<StageStats> stages;
  RequestStats requests;
  std::vector<StageSpan> recent_spans;         // last few seconds, oldest first
  std::vector<RequestTiming> recent_requests;  // last finished requests, oldest first
};

struct ModelInfo {
  std::string model_id;  // directory name or configured name
  std::string architecture;
  int num_layers = 0;
  int vocab_size = 0;
  int max_context = 0;
  std::vector<int32_t> eos_token_ids;
};

// Thread-safe. Callbacks run on engine threads: they must return quickly and must not call
// back into the engine synchronously.
class Engine {
 public:
  using EventCallback = std::function<void(const GenerateEvent&)>;
  virtual ~Engine() = default;

  // Queues a request; `on_event` receives every update and exactly one event with finished.
  // InvalidArgument (empty prompt, prompt longer than the context, bad sampling values,
  // duplicate request id) is returned synchronously and no callback follows; so is
  // Unavailable when the engine cannot take new requests now (its ring is down: retry later).
  virtual absl::Status Submit(GenerateRequest request, EventCallback on_event) = 0;
  // Stops a request (client went away); frees its KV blocks; its callback gets a finished
  // event with kCancelled. Unknown ids are ignored.
  virtual void Cancel(const std::string& request_id) = 0;

  virtual absl::StatusOr<std::vector<int32_t>> Tokenize(const std::string& text,
                                                        bool add_special_tokens) = 0;
  virtual std::string Detokenize(const std::vector<int32_t>& ids) = 0;
  virtual ModelInfo Info() = 0;
  virtual RingStats Stats() = 0;
};

}  // namespace ringserve
