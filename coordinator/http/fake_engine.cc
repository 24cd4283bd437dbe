#include "coordinator/http/fake_engine.h"

#include <algorithm>

#include "fmt/format.h"

namespace ringserve::http {

FakeEngine::FakeEngine(Script script) : script_(std::move(script)) {
  worker_ = std::thread([this] { Loop(); });
}

FakeEngine::~FakeEngine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void FakeEngine::set_script(Script script) {
  std::lock_guard<std::mutex> lock(mu_);
  script_ = std::move(script);
}

absl::Status FakeEngine::Submit(GenerateRequest request, EventCallback on_event) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!script_.submit_error.ok()) return script_.submit_error;
  if (request.prompt_ids.empty()) return absl::InvalidArgumentError("empty prompt");
  if (running_.count(request.request_id) > 0) {
    return absl::InvalidArgumentError("duplicate request id " + request.request_id);
  }
  last_request_ = request;
  prompt_tokens_ += static_cast<int64_t>(request.prompt_ids.size());
  std::string id = request.request_id;
  running_.emplace(
      id, Running{.request = std::move(request),
                  .on_event = std::move(on_event),
                  .ready_at = std::chrono::steady_clock::now() + script_.first_event_delay});
  cv_.notify_all();
  return absl::OkStatus();
}

void FakeEngine::Cancel(const std::string& request_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = running_.find(request_id);
  if (it == running_.end()) return;
  it->second.cancel = true;
  cv_.notify_all();
}

absl::StatusOr<std::vector<int32_t>> FakeEngine::Tokenize(const std::string& text,
                                                          bool add_special_tokens) {
  std::vector<int32_t> ids;
  if (add_special_tokens) ids.push_back(1);  // "BOS"
  for (unsigned char c : text) ids.push_back(static_cast<int32_t>(c) + kOffset);
  return ids;
}

std::string FakeEngine::Detokenize(const std::vector<int32_t>& ids) {
  std::string text;
  for (int32_t id : ids) {
    if (id >= kOffset) text.push_back(static_cast<char>(id - kOffset));
  }
  return text;
}

ModelInfo FakeEngine::Info() {
  std::lock_guard<std::mutex> lock(mu_);
  return {.model_id = "fake-model",
          .architecture = "FakeForCausalLM",
          .num_layers = 6,
          .vocab_size = 256 + kOffset,
          .max_context = script_.max_context,
          .eos_token_ids = {2}};
}

RingStats FakeEngine::Stats() {
  std::lock_guard<std::mutex> lock(mu_);
  RingStats stats;
  for (int i = 0; i < script_.num_stages; ++i) {
    stats.stages.push_back({.index = i,
                            .endpoint = fmt::format("127.0.0.1:{}", 7000 + i),
                            .first_layer = 2 * i,
                            .last_layer = 2 * i + 2,
                            .busy_fraction = running_.empty() ? 0.0 : 0.5 + 0.1 * i,
                            .mean_step_ms = 1.5,
                            .micro_batches_in_flight = running_.empty() ? 0 : 1,
                            .kv_blocks_used = static_cast<int64_t>(running_.size()),
                            .kv_blocks_total = 64,
                            .bytes_sent = 1024 * generated_,
                            .load_status = "ready"});
  }
  stats.requests = {.requests_finished = finished_,
                    .requests_failed = failed_,
                    .requests_cancelled = cancelled_count_,
                    .prompt_tokens = prompt_tokens_,
                    .generated_tokens = generated_,
                    .queue_depth = 0,
                    .running = static_cast<int>(running_.size()),
                    .tokens_per_second = running_.empty() ? 0.0 : 100.0};
  stats.recent_spans = spans_;
  return stats;
}

GenerateRequest FakeEngine::last_request() {
  std::lock_guard<std::mutex> lock(mu_);
  return last_request_;
}

bool FakeEngine::WaitForCancel(const std::string& request_id, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return cancelled_.count(request_id) > 0; });
}

std::set<std::string> FakeEngine::cancelled() {
  std::lock_guard<std::mutex> lock(mu_);
  return cancelled_;
}

int FakeEngine::running() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(running_.size());
}

void FakeEngine::Step(Running& r, std::vector<GenerateEvent>* out, bool* done) {
  const SamplingParams& sampling = r.request.sampling;
  GenerateEvent event;
  if (r.cancel) {
    event.finished = true;
    event.finish_reason = FinishReason::kCancelled;
    cancelled_.insert(r.request.request_id);
    ++cancelled_count_;
  } else if (!script_.error.ok() && r.generated >= script_.error_after_tokens) {
    event.finished = true;
    event.finish_reason = FinishReason::kError;
    event.error = script_.error;
    ++failed_;
  } else {
    const std::string& reply = script_.reply;
    char c = reply[r.generated % reply.size()];
    ++r.generated;
    ++generated_;
    r.text.push_back(c);
    event.token_ids.push_back(static_cast<int32_t>(static_cast<unsigned char>(c)) + kOffset);
    size_t visible = r.text.size();
    for (const std::string& stop : sampling.stop) {
      size_t at = r.text.find(stop);
      if (at != std::string::npos) {
        visible = std::min(visible, at);
        event.finished = true;
        event.finish_reason = FinishReason::kStop;
      }
    }
    if (!event.finished && script_.eos_after_replies > 0 &&
        r.generated >= script_.eos_after_replies * static_cast<int>(reply.size())) {
      event.finished = true;
      event.finish_reason = FinishReason::kStop;
    }
    if (!event.finished && r.generated >= sampling.max_tokens) {
      event.finished = true;
      event.finish_reason = FinishReason::kLength;
    }
    if (!event.finished) {
      // Hold back a tail that may still become a stop string, as the real engine does.
      for (const std::string& stop : sampling.stop) {
        for (size_t len = std::min(stop.size() - 1, r.text.size()); len > 0; --len) {
          if (r.text.compare(r.text.size() - len, len, stop, 0, len) == 0) {
            visible = std::min(visible, r.text.size() - len);
            break;
          }
        }
      }
    }
    if (visible > r.emitted) {
      event.text_delta = r.text.substr(r.emitted, visible - r.emitted);
      r.emitted = visible;
    }
    if (event.finished) ++finished_;
  }
  event.usage = {.prompt_tokens = static_cast<int>(r.request.prompt_ids.size()),
                 .completion_tokens = r.generated};
  *done = event.finished;
  out->push_back(std::move(event));
}

void FakeEngine::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (running_.empty()) {
      cv_.wait(lock, [this] { return stop_ || !running_.empty(); });
      continue;
    }
    std::vector<std::pair<EventCallback, GenerateEvent>> deliveries;
    int64_t t0 = std::chrono::duration_cast<std::chrono::microseconds>(
                     std::chrono::steady_clock::now() - start_)
                     .count();
    const auto now = std::chrono::steady_clock::now();
    for (auto it = running_.begin(); it != running_.end();) {
      if (now < it->second.ready_at && !it->second.cancel) {
        ++it;
        continue;
      }
      std::vector<GenerateEvent> events;
      bool done = false;
      Step(it->second, &events, &done);
      for (GenerateEvent& event : events) deliveries.emplace_back(it->second.on_event, event);
      it = done ? running_.erase(it) : std::next(it);
    }
    uint64_t mb = ++micro_batch_;
    for (int s = 0; s < script_.num_stages; ++s) {
      spans_.push_back({.micro_batch_id = mb,
                        .stage_index = s,
                        .start_us = t0 + 300 * s,
                        .end_us = t0 + 300 * s + 250,
                        .num_tokens = 1});
    }
    if (spans_.size() > 300) spans_.erase(spans_.begin(), spans_.end() - 300);
    std::chrono::milliseconds step = script_.step;
    cv_.notify_all();  // WaitForCancel waiters
    lock.unlock();
    for (auto& [callback, event] : deliveries) callback(event);
    lock.lock();
    cv_.wait_for(lock, step, [this] {
      if (stop_) return true;
      for (const auto& [id, r] : running_) {
        if (r.cancel) return true;
      }
      return false;
    });
  }
}

}  // namespace ringserve::http
