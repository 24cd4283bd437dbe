// A scriptable in-process Engine for testing the HTTP layer without a ring. Tokens are bytes:
// Tokenize maps each byte of the text to its value (plus `kOffset`, so that id 0..kOffset-1 are
// "special"), Detokenize maps back. Every request generates the bytes of `Script::reply`
// (repeated), one token per `Script::step`, on the fake's worker thread; it finishes with
// kLength at max_tokens, or kStop when a stop string appears (the string is cut) or when the
// reply has been emitted `Script::eos_after_replies` times. Test-only.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "coordinator/engine.h"

namespace ringserve::http {

class FakeEngine : public Engine {
 public:
  static constexpr int32_t kOffset = 3;

  struct Script {
    std::string reply = "Hello from the fake ring. ";
    std::chrono::milliseconds step{2};
    int eos_after_replies = 0;  // 0 = never EOS
    // Fails each request with this error after `error_after_tokens` tokens (when not ok).
    absl::Status error{};
    int error_after_tokens = 0;
    // Returned by Submit synchronously when not ok.
    absl::Status submit_error{};
    int max_context = 4096;
    // A request produces nothing for this long after Submit (as if queued behind others).
    std::chrono::milliseconds first_event_delay{0};
    int num_stages = 3;
  };

  explicit FakeEngine(Script script);
  ~FakeEngine() override;

  absl::Status Submit(GenerateRequest request, EventCallback on_event) override;
  void Cancel(const std::string& request_id) override;
  absl::StatusOr<std::vector<int32_t>> Tokenize(const std::string& text,
                                                bool add_special_tokens) override;
  std::string Detokenize(const std::vector<int32_t>& ids) override;
  ModelInfo Info() override;
  RingStats Stats() override;

  void set_script(Script script);
  // The last request Submit accepted (for checking parameter mapping).
  GenerateRequest last_request();
  // Waits up to `timeout` until `request_id` has been cancelled. True if it was.
  bool WaitForCancel(const std::string& request_id, std::chrono::milliseconds timeout);
  // Ids cancelled so far.
  std::set<std::string> cancelled();
  // Requests still generating.
  int running();

 private:
  struct Running {
    GenerateRequest request{};
    EventCallback on_event{};
    std::string text{};  // emitted so far
    size_t emitted = 0;  // bytes of `text` already sent as deltas
    int generated = 0;
    bool cancel = false;
    std::chrono::steady_clock::time_point ready_at{};
  };
  void Loop();
  void Step(Running& r, std::vector<GenerateEvent>* out, bool* done);

  std::mutex mu_;
  std::condition_variable cv_;
  Script script_;
  bool stop_ = false;
  std::map<std::string, Running> running_;
  std::set<std::string> cancelled_;
  GenerateRequest last_request_;
  int64_t finished_ = 0, failed_ = 0, cancelled_count_ = 0, prompt_tokens_ = 0, generated_ = 0;
  uint64_t micro_batch_ = 0;
  std::vector<StageSpan> spans_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::thread worker_;
};

}  // namespace ringserve::http
