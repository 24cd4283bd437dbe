// Test harness for the ring end to end: real `stage` and `coordinator` processes on loopback
// (CPU backend, tcp channel), found through RINGSERVE_BINARY_DIR, driven through the real gRPC
// Generate API. Every child process is terminated when the harness goes away (and dies with
// the test process if that crashes: PR_SET_PDEATHSIG).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/testing/temp_dir.h"
#include "coordinator/subprocess.h"
#include "proto/generate.grpc.pb.h"

namespace ringserve::testing {

// $RINGSERVE_SOURCE_DIR (or "."), $RINGSERVE_BINARY_DIR (or "build").
std::string SourceDir();
std::string BinaryDir();
std::string FixtureModel(const std::string& arch);  // tests/fixtures/models/<arch>

struct RingOptions {
  std::string model_dir;
  std::vector<int> partition;  // layer counts, one per stage
  int micro_batches_in_flight = 0;
  int max_tokens_per_micro_batch = 0;           // 0 = default
  int kv_blocks = 0;                            // 0 = default
  std::string kv_budget = "";                   // hosts.yaml scheduler.kv_budget ("" = none)
  int stage_step_delay_ms = 0;                  // stage --debug_step_delay_ms (a slow ring)
  std::string device = "cpu";                   // every stage's device ("cpu", "cuda:0")
  std::string channel = "tcp";                  // hosts.yaml channel
  std::vector<std::string> coordinator_args{};  // extra coordinator flags
  // Extra flags of stage i (shorter than partition: none for the rest).
  std::vector<std::vector<std::string>> stage_args{};
};

struct Generation {
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<float> prompt_logprobs;                 // when the request asked for them
  std::vector<ringserve::v1::TokenLogprob> logprobs;  // when sampling.logprobs
  std::vector<std::vector<int32_t>> choices;          // tokens by choice index (request.n)
  int completion_tokens = 0;                          // summed over the choices' last messages
  ringserve::v1::FinishReason finish_reason = ringserve::v1::FINISH_REASON_UNSPECIFIED;
  int events = 0;
  grpc::Status status;
};

class Ring {
 public:
  // Starts one stage per partition entry, writes hosts.yaml, starts the coordinator on it and
  // waits (bounded) until it serves.
  static absl::StatusOr<std::unique_ptr<Ring>> Start(const RingOptions& options);
  ~Ring();

  ringserve::v1::Generate::Stub& stub() { return *stub_; }
  const std::string& address() const { return address_; }
  // Everything the coordinator wrote so far (stderr and its log on stdout).
  std::string CoordinatorLog() const;
  // Everything the stages wrote so far (one file for all of them).
  std::string StagesLog() const;
  Subprocess& stage_process(int i) { return stages_[i]; }
  int num_stages() const { return static_cast<int>(stages_.size()); }
  // Starts stage `i` again on its control port, as its supervisor (systemd) would after it
  // died, and waits (bounded) until it listens. The process must have exited.
  absl::Status RestartStage(int i);

  // Runs one Generate call to the end.
  Generation Generate(const ringserve::v1::GenerateRequest& request);
  absl::StatusOr<ringserve::v1::StatsResponse> Stats();
  // Statistics once every stage has reported its last result. A request finishes when the
  // last stage's result arrives; earlier stages report on their own streams and may still be
  // in transit, so a stage's micro_batches_in_flight reaches 0 a moment later. Polls Stats()
  // until that happens or `timeout` passes (then returns the last statistics).
  absl::StatusOr<ringserve::v1::StatsResponse> SettledStats(
      absl::Duration timeout = absl::Seconds(10));

 private:
  Ring() = default;
  TempDir dir_;
  std::vector<Subprocess> stages_;
  std::vector<SubprocessOptions> stage_spawns_;  // how each stage was started
  std::vector<std::string> stage_endpoints_;
  std::unique_ptr<Subprocess> coordinator_;
  std::string address_;
  std::unique_ptr<ringserve::v1::Generate::Stub> stub_;
};

// Runs `coordinator` with `args` (stderr captured) and waits up to `timeout` for it to exit.
struct ExitResult {
  int exit_code = -1;
  std::string stderr_text;
  double seconds = 0;
};
absl::StatusOr<ExitResult> RunCoordinatorToExit(const std::vector<std::string>& args,
                                                absl::Duration timeout);

// Reads a whole file ("" if missing).
std::string ReadFile(const std::string& path);

ringserve::v1::GenerateRequest IdsRequest(const std::vector<int32_t>& prompt, int max_tokens);

// `text` with special tokens added, decoded greedily (temperature 0) for exactly `max_tokens`
// tokens (eos ignored).
ringserve::v1::GenerateRequest GreedyTextRequest(const std::string& text, int max_tokens);

// Runs every request through `ring` at once (one thread each), so several are in flight
// together; returns when all have finished, the generations in the order of `requests`.
std::vector<Generation> GenerateConcurrently(
    Ring& ring, const std::vector<ringserve::v1::GenerateRequest>& requests);

}  // namespace ringserve::testing
