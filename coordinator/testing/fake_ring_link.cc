#include "coordinator/testing/fake_ring_link.h"

#include <future>
#include <thread>
#include <utility>

#include "fmt/format.h"

namespace ringserve {

int32_t FakeNextToken(int32_t token, int32_t position, int vocab_size) {
  return static_cast<int32_t>((static_cast<int64_t>(token) * 31 + position * 7 + 3) % vocab_size);
}

absl::Status FakeRingLink::Open(Handlers handlers) {
  std::lock_guard<std::mutex> lock(mu_);
  handlers_ = std::move(handlers);
  return absl::OkStatus();
}

void FakeRingLink::Send(int stage, v1::StepPlan plan) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_ || failed_) return;
  const uint64_t id = plan.micro_batch_id();
  std::vector<v1::StepPlan>& plans = pending_[id];
  plans.resize(options_.num_stages);
  plans[stage] = std::move(plan);
  for (const v1::StepPlan& p : plans) {
    if (p.micro_batch_id() != id) return;  // a stage's plan has not arrived yet
  }
  v1::StepPlan first = std::move(plans.front());
  const bool send_back = plans.back().send_tokens_back();
  pending_.erase(id);
  if (first.ahead_chunks_size() > 0) {
    const auto& sampled = back_edge_[first.tokens_from()];
    std::vector<int> ends;
    int offset = 0;
    for (const auto& chunk : first.chunks()) ends.push_back(offset += chunk.num_tokens());
    for (int c : first.ahead_chunks()) {
      for (const auto& [seq, token] : sampled) {
        if (seq == first.chunks(c).seq_id()) first.set_token_ids(ends[c] - 1, token);
      }
    }
  }
  if (options_.fail_after_micro_batches >= 0 && done_ >= options_.fail_after_micro_batches) {
    // Under mu_: only the engine's loop sends (and closes), and Submit needs no link lock.
    if (options_.fault_gate)
      options_.fault_gate->WaitForNotificationWithTimeout(options_.fault_gate_wait);
    failed_ = true;
    if (options_.fail_as_stage_error) {
      v1::StepResult result;
      result.set_micro_batch_id(id);
      result.set_stage_index(options_.num_stages - 1);
      result.set_error("injected stage error");
      handlers_.on_result(std::move(result));
    } else {
      handlers_.on_failure(
          absl::UnavailableError(fmt::format("injected failure at micro-batch {}", id)));
    }
    return;
  }
  ++done_;
  if (options_.step_time > absl::ZeroDuration()) absl::SleepFor(options_.step_time);
  for (int s = 0; s < options_.num_stages; ++s) {
    v1::StepResult result;
    result.set_micro_batch_id(id);
    result.set_stage_index(s);
    result.set_busy_us(100);
    if (s == options_.num_stages - 1) {
      int offset = 0;
      for (const auto& chunk : first.chunks()) {
        offset += chunk.num_tokens();
        if (chunk.logits() != v1::LOGITS_LAST_TOKEN) continue;
        const int32_t token = first.token_ids(offset - 1);
        const int32_t position = chunk.start_position() + chunk.num_tokens() - 1;
        const int32_t next = FakeNextToken(token, position, options_.vocab_size);
        result.add_tokens()->set_token_id(next);
        if (send_back) back_edge_[id].emplace_back(chunk.seq_id(), next);
      }
    }
    handlers_.on_result(std::move(result));
  }
}

void FakeRingLink::Close(bool) {
  std::function<void(absl::Status)> on_failure;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
    if (options_.stream_ends_on_close && !failed_) {
      failed_ = true;
      on_failure = handlers_.on_failure;
    }
  }
  if (on_failure) EndStreamWhileClosing(std::move(on_failure));
  if (options_.on_close) options_.on_close();
}

void FakeRingLink::EndStreamWhileClosing(std::function<void(absl::Status)> on_failure) {
  std::promise<void> entered;
  std::future<void> in_handler = entered.get_future();
  std::thread reader([mu = stream_mu_, entered = std::move(entered),
                      on_failure = std::move(on_failure)]() mutable {
    std::lock_guard<std::timed_mutex> lock(*mu);
    entered.set_value();
    on_failure(absl::UnavailableError("stage 1 closed its Steps stream"));
  });
  in_handler.wait();  // the reader is in the handler, holding the link's lock
  if (stream_mu_->try_lock_for(absl::ToChronoMilliseconds(options_.close_wait))) {
    stream_mu_->unlock();
    reader.join();
  } else {  // the handler waits for a lock our caller holds
    if (options_.close_deadlocks) ++*options_.close_deadlocks;
    reader.detach();
  }
}

}  // namespace ringserve
