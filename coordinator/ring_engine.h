// RingEngine: the Engine (coordinator/engine.h) over a formed ring of stages.
//
// One engine thread owns the Scheduler: it admits requests, sends every micro-batch's plan to
// every stage through the RingLink (up to M in flight), feeds the last stage's sampled tokens
// back into the scheduler, detokenizes, matches stop strings and emits GenerateEvents.
// Statistics go to one RingTelemetry.
//
// Failure: when the link fails (a stage died, its stream broke, a keepalive went unanswered, a
// stage reported an error), the engine keeps its API up, drops the plans in flight and calls
// the RingFormer again (with a backoff) until the ring is back. The requests that were running
// then resume by recomputation: each is re-admitted with its prompt plus the tokens it has
// generated so far, and its sampling continues at the same token index, so the client's stream
// neither loses nor repeats a token and greedy (or seeded) output equals an undisturbed run.
// While the ring is down, a new request is refused at once with Unavailable ("the ring is down
// and re-forming ...; retry later": HTTP 503 with Retry-After, gRPC UNAVAILABLE) rather than
// queued: re-forming can take as long as a stage takes to restart and load, and a client is
// better served by a clear answer it can retry (elsewhere) than by a silent wait. Only the later
// choices of a request already running (GenerateRequest::later_choice) join it and wait. Once
// the ring has been down for `ring_down_timeout`, the requests it was running fail
// (Unavailable) while re-forming goes on. With `recover` false a failure fails every request and
// ends serving.
//
// Thread-safe (see Engine). Callbacks run on the engine thread.
//
// Lock order: a RingLink's lock, then mu_. A link calls its handlers under its own lock, from
// its stream readers and watchdog (GrpcRingLink::Deliver, Fail, WatchdogLoop), and the
// handlers queue the event under mu_. So nothing that takes a link's lock or waits for its
// threads runs under mu_: RingLink::Close and a link's destructor (which closes it) run with
// mu_ released: after RingDownLocked and Shutdown hand the link out, and in OpenAndInstall
// for a link that failed to install. Open and Send run outside mu_ as well; only num_stages
// (which takes no lock) is called under it. Clients' callbacks run with no lock held.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/time/time.h"
#include "coordinator/engine.h"
#include "coordinator/ring_link.h"
#include "coordinator/ring_telemetry.h"
#include "coordinator/scheduler/scheduler.h"
#include "coordinator/text_stream.h"
#include "coordinator/tokenizer/tokenizer.h"
#include "ring/defaults.h"
#include "ring/model_config.h"

namespace ringserve {

struct RingEngineOptions {
  std::string model_id{};  // shown by ModelInfo
  ModelConfig model{};
  std::shared_ptr<const Tokenizer> tokenizer{};  // null: token-id prompts only, no text
  // The scheduler's policy; kv_num_blocks is taken from each formed ring.
  SchedulerOptions scheduler{};
  RingFormer form_ring{};
  std::vector<StageLayout> stages{};  // for statistics
  bool recover = true;
  // Requests fail (Unavailable) once the ring has been down this long; re-forming goes on.
  absl::Duration ring_down_timeout = absl::Seconds(kDefaultRingDownTimeoutSeconds);
  absl::Duration reform_backoff = absl::Seconds(1);
};

class RingEngine final : public Engine {
 public:
  // Forms the ring (form_ring(0)) and starts the engine thread. The former's error otherwise.
  static absl::StatusOr<std::unique_ptr<RingEngine>> Start(RingEngineOptions options);
  ~RingEngine() override;

  // Fails every unfinished request (kError "shutting down"), closes the ring and, with
  // `stop_stages`, asks every stage process to exit. Idempotent.
  void Shutdown(bool stop_stages);

  absl::Status Submit(GenerateRequest request, EventCallback on_event) override;
  void Cancel(const std::string& request_id) override;
  absl::StatusOr<std::vector<int32_t>> Tokenize(const std::string& text,
                                                bool add_special_tokens) override;
  std::string Detokenize(const std::vector<int32_t>& ids) override;
  ModelInfo Info() override;
  RingStats Stats() override;

  // True while the ring is formed and serving; `health_message` says why not.
  bool healthy();
  std::string health_message();
  // True once the engine can never serve again (Shutdown, or a failure with recover off).
  bool stopped();
  int kv_num_blocks();

 private:
  struct Request;
  using Delivery = std::pair<EventCallback, GenerateEvent>;
  // A queued link event, tagged with the ring generation that produced it.
  struct LinkEvent {
    uint64_t generation = 0;
    std::optional<v1::StepResult> result{};
    absl::Status failure{};
  };

  explicit RingEngine(RingEngineOptions options);
  void EngineLoop();
  // Engine thread, mu_ not held: forms the ring again; on failure waits the backoff.
  void TryReform();
  // Opens the formed ring's link (mu_ not held) and installs it; a link that does not install
  // is closed here, after mu_ is released.
  absl::Status OpenAndInstall(FormedRing formed);
  // Installs a formed ring: a fresh scheduler sized for it, every unfinished request
  // re-admitted with the tokens it has generated. mu_ held. Takes formed.link only on success
  // (leaving the previous link, if any, in its place); the caller closes and destroys what is
  // left in formed.link after releasing mu_, never under it (the lock order above).
  absl::Status InstallRingLocked(FormedRing& formed, uint64_t generation,
                                 std::vector<Delivery>* out);
  absl::Status AdmitLocked(Request& request);
  // The ring failed: returns its link for closing outside mu_.
  std::unique_ptr<RingLink> RingDownLocked(const absl::Status& status, std::vector<Delivery>* out);
  // An error means the ring cannot go on (a stage error, a result the scheduler refuses).
  absl::Status HandleResult(const v1::StepResult& result, std::vector<Delivery>* out);
  // `sampled`: the last stage's report of update's token (its log-probabilities), or null.
  void HandleToken(const TokenUpdate& update, const v1::SampledToken* sampled,
                   std::vector<Delivery>* out);
  // Files one ALL_TOKENS chunk's scores under its request (prompt log-probabilities).
  void StorePromptLogprobs(const v1::PromptLogprobs& scores);
  void FinishRequest(Request& request, FinishReason reason, absl::Status error,
                     std::vector<Delivery>* out, GenerateEvent event);
  void FailAll(const absl::Status& status, std::vector<Delivery>* out);
  std::vector<std::pair<int, v1::StepPlan>> PlanLocked();
  int64_t NowUs() const;

  const RingEngineOptions options_;
  const absl::Time start_time_ = absl::Now();

  std::mutex mu_;
  std::condition_variable cv_;
  bool wake_ = false;
  bool stop_ = false;
  bool shut_down_ = false;
  bool stopped_ = false;  // Shutdown, or a failure without recovery
  bool ring_up_ = false;
  int reform_attempt_ = 0;
  absl::Time down_since_;
  std::string down_reason_;  // why the ring went down (in the error of requests that give up)
  std::string health_ = "starting";
  uint64_t generation_ = 0;  // of the installed ring; 0 while down
  uint64_t next_generation_ = 0;
  std::unique_ptr<RingLink> link_;
  int kv_num_blocks_ = 0;
  std::unique_ptr<Scheduler> scheduler_;
  uint64_t next_seq_id_ = 1;
  std::mt19937_64 seed_rng_;
  std::unordered_map<uint64_t, std::unique_ptr<Request>> requests_;  // by seq id
  std::unordered_map<std::string, uint64_t> seq_by_request_id_;
  std::deque<std::string> cancels_;
  std::deque<LinkEvent> link_events_;
  RingTelemetry telemetry_;

  std::thread engine_thread_;
};

}  // namespace ringserve
