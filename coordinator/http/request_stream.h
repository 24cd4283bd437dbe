// One generation request in flight between the engine's callback thread and the HTTP worker
// that writes its response. Internal to coordinator/http.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>

#include "coordinator/engine.h"
#include "coordinator/http/metrics.h"

namespace ringserve::http {

// Thread-safe. The engine callback pushes (OnEvent); one HTTP worker pops (Next).
class RequestStream {
 public:
  using Clock = std::chrono::steady_clock;

  RequestStream(std::string request_id, ServingMetrics* metrics)
      : request_id_(std::move(request_id)), recorder_(metrics, "http") {}

  const std::string& request_id() const { return request_id_; }

  // The engine callback: queues the event and records latency and outcome metrics.
  void OnEvent(const GenerateEvent& event);

  enum class Wait { kEvent, kTimeout, kClosed };
  // Waits up to `timeout` for an event; kClosed when Close() was called.
  Wait Next(std::chrono::milliseconds timeout, GenerateEvent* event);
  // Waits up to `timeout` until an event is queued (not taking it): kEvent, kTimeout or kClosed.
  Wait WaitForEvent(std::chrono::milliseconds timeout);
  // Wakes every waiter with kClosed (server shutting down).
  void Close();
  // True once the finished event has arrived from the engine.
  bool finished() const;

 private:
  const std::string request_id_;
  mutable std::mutex mu_;
  RequestRecorder recorder_;  // guarded by mu_
  std::condition_variable cv_;
  std::deque<GenerateEvent> events_;
  bool finished_ = false;
  bool closed_ = false;
};

}  // namespace ringserve::http
