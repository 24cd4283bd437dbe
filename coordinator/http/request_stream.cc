#include "coordinator/http/request_stream.h"

#include "common/logging.h"

namespace ringserve::http {

void RequestStream::OnEvent(const GenerateEvent& event) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    recorder_.OnEvent(event);
    if (event.finished) {
      finished_ = true;
      static constexpr const char* kReasons[] = {"none", "stop", "length", "cancelled", "error"};
      RS_LOG_INFO(
          "request {}: {} after {:.1f} ms, {} prompt + {} generated tokens{}", request_id_,
          kReasons[static_cast<int>(event.finish_reason)],
          std::chrono::duration<double, std::milli>(Clock::now() - recorder_.arrival()).count(),
          event.usage.prompt_tokens, event.usage.completion_tokens,
          event.error.ok() ? "" : ": " + event.error.ToString());
    }
    events_.push_back(event);
  }
  cv_.notify_all();
}

RequestStream::Wait RequestStream::Next(std::chrono::milliseconds timeout, GenerateEvent* event) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [this] { return closed_ || !events_.empty(); });
  if (!events_.empty()) {
    *event = std::move(events_.front());
    events_.pop_front();
    return Wait::kEvent;
  }
  return closed_ ? Wait::kClosed : Wait::kTimeout;
}

RequestStream::Wait RequestStream::WaitForEvent(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [this] { return closed_ || !events_.empty(); });
  if (!events_.empty()) return Wait::kEvent;
  return closed_ ? Wait::kClosed : Wait::kTimeout;
}

void RequestStream::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  cv_.notify_all();
}

bool RequestStream::finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finished_;
}

}  // namespace ringserve::http
