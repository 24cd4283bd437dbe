#include "coordinator/http/request_stream.h"

#include "common/logging.h"
#include "coordinator/http/request_ids.h"

namespace ringserve::http {

std::string RequestStream::ChoiceRequestId(int index) const {
  return http::ChoiceRequestId(request_id_, index);
}

void RequestStream::OnEvent(int index, const GenerateEvent& event) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (index == 0) recorder_.OnEvent(event);
    if (event.finished) {
      finished_choices_.insert(index);
      static constexpr const char* kReasons[] = {"none", "stop", "length", "cancelled", "error"};
      RS_LOG_INFO(
          "request {}: {} after {:.1f} ms, {} prompt + {} generated tokens{}",
          ChoiceRequestId(index), kReasons[static_cast<int>(event.finish_reason)],
          std::chrono::duration<double, std::milli>(Clock::now() - recorder_.arrival()).count(),
          event.usage.prompt_tokens, event.usage.completion_tokens,
          event.error.ok() ? "" : ": " + event.error.ToString());
    }
    events_.emplace_back(index, event);
  }
  cv_.notify_all();
}

RequestStream::Wait RequestStream::Next(std::chrono::milliseconds timeout, GenerateEvent* event,
                                        int* index) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [this] { return closed_ || !events_.empty(); });
  if (!events_.empty()) {
    if (index != nullptr) *index = events_.front().first;
    *event = std::move(events_.front().second);
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
  return static_cast<int>(finished_choices_.size()) >= choices_;
}

bool RequestStream::choice_finished(int index) const {
  std::lock_guard<std::mutex> lock(mu_);
  return finished_choices_.count(index) > 0;
}

}  // namespace ringserve::http
