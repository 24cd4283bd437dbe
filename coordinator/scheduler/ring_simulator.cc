#include "coordinator/scheduler/ring_simulator.h"

#include <algorithm>
#include <deque>
#include <queue>
#include <tuple>

#include "fmt/format.h"

namespace ringserve {
namespace {

enum class EventKind { kArrival, kCancel, kStageArrive, kStageDone, kReturn };

struct Event {
  double time;
  uint64_t order;  // ties in time resolve in creation order: deterministic
  EventKind kind;
  uint64_t a;  // request index, plan id or stage
  bool operator>(const Event& other) const {
    return std::tie(time, order) > std::tie(other.time, other.order);
  }
};

struct KvEntry {
  uint64_t seq_id = 0;
  int32_t position = -1;
  int32_t token = 0;
};

class Simulation {
 public:
  Simulation(Scheduler& scheduler, const RingSimOptions& options, std::vector<SimRequest> requests)
      : scheduler_(scheduler),
        options_(options),
        requests_(std::move(requests)),
        block_size_(scheduler.options().kv_block_size),
        stages_(options.num_stages),
        kv_(options.num_stages,
            std::vector<KvEntry>(static_cast<size_t>(scheduler.options().kv_num_blocks) *
                                 scheduler.options().kv_block_size)) {
    result_.stage_spans.resize(options.num_stages);
    for (size_t i = 0; i < requests_.size(); ++i) {
      by_id_[requests_[i].seq_id] = i;
      Push(requests_[i].arrival_time, EventKind::kArrival, i);
      if (requests_[i].cancel_time >= 0) Push(requests_[i].cancel_time, EventKind::kCancel, i);
    }
  }

  SimResult Run(double max_time) {
    if (scheduler_.options().num_stages != options_.num_stages) {
      Violation("scheduler num_stages differs from the simulator's");
    }
    while (!events_.empty()) {
      Event event = events_.top();
      events_.pop();
      if (event.time > max_time) {
        Violation(fmt::format("not finished by time {}", max_time));
        break;
      }
      now_ = event.time;
      Handle(event);
      // Everything that happens at the same instant is seen before planning (requests that
      // arrive together are admitted together).
      while (!events_.empty() && events_.top().time == now_) {
        Event same = events_.top();
        events_.pop();
        Handle(same);
      }
      Pump();
      if (options_.check_invariants) {
        absl::Status status = scheduler_.CheckInvariants();
        if (!status.ok()) Violation(std::string(status.message()));
      }
      if (result_.violations.size() > 20) break;
    }
    if (events_.empty() && scheduler_.HasWork()) {
      Violation(fmt::format("stuck at time {}: scheduler has work but nothing is in flight", now_));
    }
    result_.end_time = now_;
    SchedulerStats stats = scheduler_.Stats();
    result_.preemptions = stats.preemptions;
    result_.kv_blocks_used_at_end = stats.kv_blocks_used;
    return std::move(result_);
  }

 private:
  struct StageState {
    std::deque<uint64_t> queue;
    bool busy = false;
    uint64_t current = 0;
  };

  void Push(double time, EventKind kind, uint64_t a) {
    events_.push(Event{time, next_order_++, kind, a});
  }

  void Violation(const std::string& what) {
    result_.violations.push_back(fmt::format("t={}: {}", now_, what));
  }

  bool Alive(uint64_t seq_id) {
    auto it = result_.requests.find(seq_id);
    return it != result_.requests.end() && it->second.finish_reason == FinishReason::kNone;
  }

  // Prompt + tokens returned so far.
  std::vector<int32_t> History(uint64_t seq_id) {
    std::vector<int32_t> history = requests_[by_id_.at(seq_id)].prompt;
    const auto& tokens = result_.requests[seq_id].tokens;
    history.insert(history.end(), tokens.begin(), tokens.end());
    return history;
  }

  void Handle(const Event& event) {
    switch (event.kind) {
      case EventKind::kArrival: {
        const SimRequest& request = requests_[event.a];
        result_.requests[request.seq_id];
        absl::Status status = scheduler_.AddRequest(request.seq_id, request.prompt, request.params);
        if (!status.ok()) Violation(std::string(status.message()));
        break;
      }
      case EventKind::kCancel: {
        const SimRequest& request = requests_[event.a];
        if (!Alive(request.seq_id)) break;
        if (!scheduler_.Cancel(request.seq_id)) {
          Violation(fmt::format("Cancel({}) did not find a live request", request.seq_id));
        }
        auto& out = result_.requests[request.seq_id];
        out.finish_reason = FinishReason::kCancelled;
        out.finish_time = now_;
        break;
      }
      case EventKind::kStageArrive: {
        int stage = static_cast<int>(event.a >> 48);
        uint64_t plan_id = event.a & ((uint64_t{1} << 48) - 1);
        stages_[stage].queue.push_back(plan_id);
        StartNext(stage);
        break;
      }
      case EventKind::kStageDone: {
        int stage = static_cast<int>(event.a);
        StageState& state = stages_[stage];
        uint64_t plan_id = state.current;
        state.busy = false;
        const double hop =
            options_.hop_cost ? options_.hop_cost(stage, plans_.at(plan_id)) : options_.hop_latency;
        if (hop < 0) Violation(fmt::format("hop_cost({}, plan {}) = {} < 0", stage, plan_id, hop));
        if (stage + 1 < options_.num_stages) {
          Push(now_ + std::max(0.0, hop), EventKind::kStageArrive,
               (static_cast<uint64_t>(stage + 1) << 48) | plan_id);
        } else {
          Push(now_ + std::max(0.0, hop), EventKind::kReturn, plan_id);
        }
        StartNext(stage);
        break;
      }
      case EventKind::kReturn:
        Return(event.a);
        break;
    }
  }

  void StartNext(int stage) {
    StageState& state = stages_[stage];
    if (state.busy || state.queue.empty()) return;
    uint64_t plan_id = state.queue.front();
    state.queue.pop_front();
    state.busy = true;
    state.current = plan_id;
    const MicroBatchPlan& plan = plans_.at(plan_id);
    const int tokens = static_cast<int>(plan.num_tokens());
    const double cost = options_.stage_cost ? options_.stage_cost(stage, plan)
                                            : options_.batch_cost + options_.token_cost * tokens;
    if (cost < 0) Violation(fmt::format("stage_cost({}, plan {}) = {} < 0", stage, plan_id, cost));
    const double end = now_ + std::max(0.0, cost);
    result_.stage_spans[stage].push_back(SimStageSpan{plan_id, now_, end, tokens});
    RunOnStage(stage, plan);
    Push(end, EventKind::kStageDone, static_cast<uint64_t>(stage));
  }

  // What a stage does with the KV cache: read [0, start), write [start, start + n).
  void RunOnStage(int stage, const MicroBatchPlan& plan) {
    std::vector<KvEntry>& kv = kv_[stage];
    size_t offset = 0;
    for (size_t c = 0; c < plan.batch.chunks.size(); ++c) {
      const SequenceChunk& chunk = plan.batch.chunks[c];
      const bool alive = Alive(chunk.seq_id);
      const int32_t end = chunk.start_position + chunk.num_tokens;
      if (static_cast<int64_t>(chunk.block_table.size()) * block_size_ < end) {
        Violation(
            fmt::format("plan {} seq {}: block table of {} blocks does not cover {} "
                        "positions",
                        plan.id, chunk.seq_id, chunk.block_table.size(), end));
        offset += chunk.num_tokens;
        continue;
      }
      auto slot = [&](int32_t position) -> KvEntry& {
        return kv[static_cast<size_t>(chunk.block_table[position / block_size_]) * block_size_ +
                  position % block_size_];
      };
      if (alive && stage == 0) {
        std::vector<int32_t> history = History(chunk.seq_id);
        for (int32_t i = 0; i < chunk.num_tokens; ++i) {
          int32_t position = chunk.start_position + i;
          if (position >= static_cast<int32_t>(history.size()) ||
              plan.batch.token_ids[offset + i] != history[position]) {
            Violation(
                fmt::format("plan {} seq {}: fed token at position {} is not the "
                            "sequence's token there",
                            plan.id, chunk.seq_id, position));
            break;
          }
        }
      }
      if (alive) {
        // Every earlier position must hold this sequence's token there (written by it, or by
        // another sequence with the same prefix: a prefix-cache hit), so its K/V are right.
        const std::vector<int32_t> history = History(chunk.seq_id);
        for (int32_t position = 0; position < chunk.start_position; ++position) {
          const KvEntry& entry = slot(position);
          if (entry.position != position || position >= static_cast<int32_t>(history.size()) ||
              entry.token != history[position]) {
            Violation(
                fmt::format("stage {} plan {} seq {}: KV of position {} missing or "
                            "overwritten (holds seq {} position {})",
                            stage, plan.id, chunk.seq_id, position, entry.seq_id, entry.position));
            break;
          }
        }
      }
      for (int32_t i = 0; i < chunk.num_tokens; ++i) {
        slot(chunk.start_position + i) =
            KvEntry{chunk.seq_id, chunk.start_position + i, plan.batch.token_ids[offset + i]};
      }
      offset += chunk.num_tokens;
    }
  }

  void Return(uint64_t plan_id) {
    const MicroBatchPlan& plan = plans_.at(plan_id);
    std::vector<int32_t> sampled;
    for (const PlannedChunk& entry : plan.entries) {
      if (!entry.samples) continue;
      if (Alive(entry.seq_id)) {
        int32_t generated = static_cast<int32_t>(result_.requests[entry.seq_id].tokens.size());
        if (entry.token_index != generated) {
          Violation(fmt::format("plan {} seq {}: token_index {} but {} tokens generated", plan_id,
                                entry.seq_id, entry.token_index, generated));
        }
      }
      sampled.push_back(options_.sample(entry.seq_id, entry.token_index));
    }
    absl::StatusOr<MicroBatchResult> done = scheduler_.OnMicroBatchDone(plan_id, sampled);
    result_.plans[plan_index_.at(plan_id)].done_time = now_;
    if (!done.ok()) {
      Violation(std::string(done.status().message()));
      return;
    }
    for (const TokenUpdate& update : done->tokens) {
      if (!Alive(update.seq_id)) {
        Violation(fmt::format("token for finished or cancelled seq {}", update.seq_id));
        continue;
      }
      SimRequestResult& out = result_.requests[update.seq_id];
      out.tokens.push_back(update.token);
      out.token_times.push_back(now_);
      if (update.finish_reason != FinishReason::kNone) {
        out.finish_reason = update.finish_reason;
        out.finish_time = now_;
        if (options_.on_finish) AddRequests(options_.on_finish(update.seq_id, now_));
      }
    }
    plans_.erase(plan_id);
  }

  // Requests that join during the run (RingSimOptions::on_finish).
  void AddRequests(std::vector<SimRequest> more) {
    for (SimRequest& request : more) {
      if (by_id_.count(request.seq_id) > 0) {
        Violation(fmt::format("on_finish returned seq {} again", request.seq_id));
        continue;
      }
      if (request.arrival_time < now_) {
        Violation(fmt::format("on_finish returned seq {} arriving at {}, in the past",
                              request.seq_id, request.arrival_time));
        request.arrival_time = now_;
      }
      const size_t index = requests_.size();
      by_id_[request.seq_id] = index;
      Push(request.arrival_time, EventKind::kArrival, index);
      if (request.cancel_time >= 0) Push(request.cancel_time, EventKind::kCancel, index);
      requests_.push_back(std::move(request));
    }
  }

  void Pump() {
    while (scheduler_.num_in_flight() < scheduler_.max_micro_batches_in_flight()) {
      std::optional<MicroBatchPlan> plan = scheduler_.NextMicroBatch();
      if (!plan) break;
      SimPlanRecord record{.plan_id = plan->id,
                           .issue_time = now_,
                           .done_time = -1,
                           .num_decodes = plan->num_decodes(),
                           .num_prefill_tokens = 0,
                           .num_chunks = static_cast<int>(plan->batch.chunks.size()),
                           .num_preempted = static_cast<int>(plan->preempted.size())};
      for (size_t c = 0; c < plan->entries.size(); ++c) {
        const LogitsMode mode = plan->batch.chunks[c].logits;
        const bool samples = mode == LogitsMode::kLastToken ||
                             (mode == LogitsMode::kAllTokens && plan->entries[c].samples);
        if (samples != plan->entries[c].samples) {
          Violation(
              fmt::format("plan {}: chunk {} logits mode disagrees with samples", plan->id, c));
        }
        if (!plan->entries[c].is_decode) {
          record.num_prefill_tokens += plan->batch.chunks[c].num_tokens;
        }
      }
      if (static_cast<int64_t>(plan->batch.token_ids.size()) != plan->num_tokens() ||
          plan->num_tokens() > scheduler_.options().max_tokens_per_micro_batch) {
        Violation(fmt::format("plan {}: {} token ids for {} tokens (budget {})", plan->id,
                              plan->batch.token_ids.size(), plan->num_tokens(),
                              scheduler_.options().max_tokens_per_micro_batch));
      }
      plan_index_[plan->id] = result_.plans.size();
      result_.plans.push_back(record);
      uint64_t id = plan->id;
      plans_.emplace(id, *std::move(plan));
      Push(now_, EventKind::kStageArrive, id);
    }
  }

  Scheduler& scheduler_;
  RingSimOptions options_;
  std::vector<SimRequest> requests_;
  std::map<uint64_t, size_t> by_id_;
  int block_size_;
  std::vector<StageState> stages_;
  std::vector<std::vector<KvEntry>> kv_;  // [stage][block * block_size + offset]
  std::map<uint64_t, MicroBatchPlan> plans_;
  std::map<uint64_t, size_t> plan_index_;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  uint64_t next_order_ = 0;
  double now_ = 0;
  SimResult result_;
};

}  // namespace

double SimResult::BusyTime(int stage, double from, double to) const {
  double busy = 0;
  for (const SimStageSpan& span : stage_spans.at(stage)) {
    busy += std::max(0.0, std::min(span.end, to) - std::max(span.start, from));
  }
  return busy;
}

int64_t SimResult::TokensBetween(double from, double to) const {
  int64_t count = 0;
  for (const auto& [id, request] : requests) {
    for (double time : request.token_times) count += (time >= from && time < to) ? 1 : 0;
  }
  return count;
}

SimResult SimulateRing(Scheduler& scheduler, const RingSimOptions& options,
                       std::vector<SimRequest> requests, double max_time) {
  return Simulation(scheduler, options, std::move(requests)).Run(max_time);
}

}  // namespace ringserve
