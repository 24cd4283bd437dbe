// RingEngine: the Engine (coordinator/engine.h) over a ring of stage processes.
//
// Start() connects to every stage named in the RingConfig (bounded wait), configures them
// (model slice, KV pool, activation channel; load progress goes to `on_progress`), connects
// the stages into a ring and opens one Steps stream per stage. One engine thread then owns the
// Scheduler: it admits requests, sends every micro-batch's plan to every stage in order (up to
// M in flight), feeds the last stage's sampled tokens back into the scheduler, detokenizes,
// matches stop strings, and emits GenerateEvents. A stage failure fails every running request
// with kError and the engine stops serving (healthy() == false).
//
// Thread-safe (see Engine). Callbacks run on the engine thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/time/time.h"
#include "coordinator/engine.h"
#include "coordinator/hosts/ring_config.h"
#include "coordinator/scheduler/scheduler.h"
#include "coordinator/stage_client.h"
#include "coordinator/text_stream.h"
#include "coordinator/tokenizer/tokenizer.h"
#include "stage/model/model_config.h"

namespace ringserve {

struct RingEngineOptions {
  RingConfig ring;  // validated (hosts.yaml or the embedded default)
  // Bounded wait for each stage's control endpoint to accept a connection.
  absl::Duration connect_timeout = absl::Seconds(10);
  // Bound on configuring (loading) one stage.
  absl::Duration configure_timeout = absl::Minutes(30);
  // Bound on a stage waiting for its neighbour's activations during a step.
  absl::Duration step_timeout = absl::Seconds(120);
  // Per-stage KV pool of CPU stages when the RingConfig sets neither kv_blocks nor kv_budget
  // (CUDA stages then size theirs from memory).
  int default_kv_blocks = 512;
  // Share of each GPU's memory the CUDA stages on it may take together (split evenly).
  double gpu_memory_utilization = 0.9;
  DecodePacking decode_packing = DecodePacking::kSpread;
  // Start-up progress, e.g. "stage 1 (127.0.0.1:7001): loading layers [2, 4) ...".
  std::function<void(const std::string& line)> on_progress;
};

class RingEngine final : public Engine {
 public:
  static absl::StatusOr<std::unique_ptr<RingEngine>> Start(RingEngineOptions options);
  ~RingEngine() override;

  // Fails every unfinished request (kError "shutting down"), closes the stage streams and,
  // with `stop_stages`, asks every stage process to exit. Idempotent.
  void Shutdown(bool stop_stages);

  absl::Status Submit(GenerateRequest request, EventCallback on_event) override;
  void Cancel(const std::string& request_id) override;
  absl::StatusOr<std::vector<int32_t>> Tokenize(const std::string& text,
                                                bool add_special_tokens) override;
  std::string Detokenize(const std::vector<int32_t>& ids) override;
  ModelInfo Info() override;
  RingStats Stats() override;

  // False once a stage failed or after Shutdown; `health_message` says why.
  bool healthy();
  std::string health_message();
  const RingConfig& ring() const { return options_.ring; }
  int kv_num_blocks() const { return kv_num_blocks_; }

 private:
  struct Request;
  struct StageTrack;
  using Delivery = std::pair<EventCallback, GenerateEvent>;

  explicit RingEngine(RingEngineOptions options);
  absl::Status Connect();
  void EngineLoop();
  // The helpers below run on the engine thread with mu_ held; events are collected in `out`
  // and delivered after mu_ is released.
  void HandleResult(const v1::StepResult& result, std::vector<Delivery>* out);
  void HandleToken(const TokenUpdate& update, std::vector<Delivery>* out);
  // Files one ALL_TOKENS chunk's scores under its request (prompt log-probabilities).
  void StorePromptLogprobs(const v1::PromptLogprobs& scores);
  void FinishRequest(Request& request, FinishReason reason, absl::Status error,
                     std::vector<Delivery>* out, GenerateEvent event);
  void FailAll(const absl::Status& status, std::vector<Delivery>* out);
  std::vector<std::pair<int, v1::StepPlan>> PlanLocked();
  int64_t NowUs() const;

  RingEngineOptions options_;
  ModelConfig model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::vector<std::unique_ptr<StageClient>> stages_;
  int kv_num_blocks_ = 0;
  const absl::Time start_time_ = absl::Now();

  std::mutex mu_;
  std::condition_variable cv_;
  bool wake_ = false;
  bool stop_ = false;
  bool failed_ = false;
  bool shut_down_ = false;
  std::string health_ = "starting";
  std::unique_ptr<Scheduler> scheduler_;
  uint64_t next_seq_id_ = 1;
  std::mt19937_64 seed_rng_;
  std::unordered_map<uint64_t, std::unique_ptr<Request>> requests_;  // by seq id
  std::unordered_map<std::string, uint64_t> seq_by_request_id_;
  std::deque<std::string> cancels_;
  std::deque<v1::StepResult> results_;
  std::deque<absl::Status> stage_errors_;
  std::vector<std::unique_ptr<StageTrack>> tracks_;
  std::map<uint64_t, int64_t> plan_sent_us_;  // micro-batch id -> coordinator clock

  // Request statistics.
  RequestStats counters_;
  std::deque<RequestTiming> recent_requests_;
  std::deque<std::pair<int64_t, int>> recent_tokens_;  // (us, tokens) for tokens/s
  double sum_queue_ms_ = 0, sum_ttft_ms_ = 0, sum_inter_token_ms_ = 0;
  int64_t timed_requests_ = 0, inter_token_samples_ = 0;

  std::thread engine_thread_;
};

}  // namespace ringserve
