#include "coordinator/http/request_stream.h"

#include "common/logging.h"

namespace ringserve::http {

void RequestStream::OnEvent(const GenerateEvent& event) {
  Clock::time_point now = Clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!event.token_ids.empty()) {
      if (!seen_token_) {
        metrics_->ObserveTimeToFirstToken(std::chrono::duration<double>(now - arrival_).count());
        // Tokens after the first one in the same event arrived together.
        for (size_t i = 1; i < event.token_ids.size(); ++i) metrics_->ObserveInterTokenLatency(0);
      } else {
        double gap = std::chrono::duration<double>(now - last_token_).count();
        double per_token = gap / static_cast<double>(event.token_ids.size());
        for (size_t i = 0; i < event.token_ids.size(); ++i) {
          metrics_->ObserveInterTokenLatency(per_token);
        }
      }
      seen_token_ = true;
      last_token_ = now;
    }
    if (event.finished) {
      finished_ = true;
      static constexpr const char* kReasons[] = {"none", "stop", "length", "cancelled", "error"};
      RS_LOG_INFO("request {}: {} after {:.1f} ms, {} prompt + {} generated tokens{}", request_id_,
                  kReasons[static_cast<int>(event.finish_reason)],
                  std::chrono::duration<double, std::milli>(now - arrival_).count(),
                  event.usage.prompt_tokens, event.usage.completion_tokens,
                  event.error.ok() ? "" : ": " + event.error.ToString());
      switch (event.finish_reason) {
        case FinishReason::kStop:
        case FinishReason::kLength:
          metrics_->RecordOutcome("http", event.finish_reason == FinishReason::kStop
                                              ? RequestOutcome::kStop
                                              : RequestOutcome::kLength);
          metrics_->ObserveRequestDuration(std::chrono::duration<double>(now - arrival_).count());
          break;
        case FinishReason::kCancelled:
          metrics_->RecordOutcome("http", RequestOutcome::kCancelled);
          break;
        default:
          metrics_->RecordOutcome("http", RequestOutcome::kError);
          break;
      }
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
