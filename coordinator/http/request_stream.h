// One generation request in flight between the engine's callback thread and the HTTP worker
// that writes its response. Internal to coordinator/http.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "coordinator/engine.h"
#include "coordinator/http/metrics.h"

namespace ringserve::http {

// Thread-safe. The engine callbacks push (OnEvent); one HTTP worker pops (Next).
//
// A request with n > 1 choices is n engine requests (ChoiceRequestId) whose events share this
// stream, each tagged with its choice index; the stream is finished when every choice is.
// Metrics (latency, outcome) follow choice 0.
class RequestStream {
 public:
  using Clock = std::chrono::steady_clock;

  RequestStream(std::string request_id, ServingMetrics* metrics, int choices = 1)
      : request_id_(std::move(request_id)), choices_(choices), recorder_(metrics, "http") {}

  const std::string& request_id() const { return request_id_; }
  int choices() const { return choices_; }
  // The engine request id of choice `index`: request_id() for 0, "<request_id>#<index>" else
  // (request_ids.h: an id no client can hold).
  std::string ChoiceRequestId(int index) const;

  // The engine callback of choice `index`: queues the event and records latency and outcome
  // metrics (choice 0).
  void OnEvent(const GenerateEvent& event) { OnEvent(0, event); }
  void OnEvent(int index, const GenerateEvent& event);

  enum class Wait { kEvent, kTimeout, kClosed };
  // Waits up to `timeout` for an event; kClosed when Close() was called. `index` (optional)
  // receives the event's choice.
  Wait Next(std::chrono::milliseconds timeout, GenerateEvent* event, int* index = nullptr);
  // Waits up to `timeout` until an event is queued (not taking it): kEvent, kTimeout or kClosed.
  Wait WaitForEvent(std::chrono::milliseconds timeout);
  // Wakes every waiter with kClosed (server shutting down).
  void Close();
  // True once every choice's finished event has arrived from the engine.
  bool finished() const;
  // Whether choice `index` has finished.
  bool choice_finished(int index) const;

 private:
  const std::string request_id_;
  const int choices_;
  mutable std::mutex mu_;
  RequestRecorder recorder_;  // guarded by mu_
  std::condition_variable cv_;
  std::deque<std::pair<int, GenerateEvent>> events_;
  std::set<int> finished_choices_;
  bool closed_ = false;
};

}  // namespace ringserve::http
