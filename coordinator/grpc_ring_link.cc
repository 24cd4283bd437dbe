#include "coordinator/grpc_ring_link.h"

#include <algorithm>
#include <utility>

#include "common/status_macros.h"
#include "fmt/format.h"

namespace ringserve {
namespace {

const char* StateName(v1::StageActivity::State state) {
  switch (state) {
    case v1::StageActivity::RECEIVING:
      return "receiving";
    case v1::StageActivity::COMPUTING:
      return "computing";
    case v1::StageActivity::SENDING:
      return "sending";
    default:
      return "idle";
  }
}

}  // namespace

GrpcRingLink::GrpcRingLink(std::vector<std::unique_ptr<StageClient>> stages,
                           GrpcRingLinkOptions options)
    : stages_(std::move(stages)), options_(options), watch_(stages_.size()) {}

GrpcRingLink::~GrpcRingLink() { Close(/*stop_stages=*/false); }

absl::Status GrpcRingLink::Open(Handlers handlers) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    handlers_ = std::move(handlers);
    progress_ = absl::Now();
  }
  for (auto& stage : stages_) {
    const int index = stage->index();
    const std::string endpoint = stage->endpoint();
    RS_RETURN_IF_ERROR(
        stage->StartSteps([this](v1::StepResult result) { Deliver(std::move(result)); },
                          [this, index, endpoint](absl::Status status) {
                            if (status.ok()) {
                              status = absl::UnavailableError(fmt::format(
                                  "stage {} ({}) closed its Steps stream", index, endpoint));
                            }
                            Fail(std::move(status));
                          }));
  }
  if (options_.stall_timeout > absl::ZeroDuration()) {
    watchdog_ = std::thread([this] { WatchdogLoop(); });
  }
  return absl::OkStatus();
}

void GrpcRingLink::Deliver(v1::StepResult result) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_ || failed_) return;
  const absl::Time now = absl::Now();
  const int stage = result.stage_index();
  const bool known = stage >= 0 && stage < num_stages();
  if (result.has_activity()) {
    if (known) NoteActivityLocked(stage, result.activity(), now);
    return;  // the watchdog's, not the engine's
  }
  if (known) {
    StageWatch& watch = watch_[stage];
    watch.in_flight = std::max<int64_t>(watch.in_flight - 1, 0);
    watch.heard = now;
    progress_ = now;
  }
  if (!result.error().empty()) {
    failed_ = true;
    if (handlers_.on_failure) {
      handlers_.on_failure(
          absl::InternalError(fmt::format("stage {}: micro-batch {}: {}", result.stage_index(),
                                          result.micro_batch_id(), result.error())));
    }
    return;
  }
  if (handlers_.on_result) handlers_.on_result(std::move(result));
}

void GrpcRingLink::NoteActivityLocked(int stage, const v1::StageActivity& activity,
                                      absl::Time now) {
  StageWatch& watch = watch_[stage];
  const bool computing = activity.state() == v1::StageActivity::COMPUTING;
  // A channel that cannot count its bytes (GPU channels) may be moving them: not a stall.
  const bool waiting = activity.state() == v1::StageActivity::RECEIVING ||
                       activity.state() == v1::StageActivity::SENDING;
  const bool bytes_unknown = activity.channel_bytes() < 0 && waiting;
  const bool bytes_moved = watch.reported && activity.channel_bytes() >= 0 &&
                           activity.channel_bytes() != watch.activity.channel_bytes();
  if (computing || bytes_unknown || bytes_moved) progress_ = now;
  watch.reported = true;
  watch.activity = activity;
  watch.heard = now;
}

void GrpcRingLink::Send(int stage, v1::StepPlan plan) {
  if (stage < 0 || stage >= num_stages()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t in_flight = 0;
    for (const StageWatch& watch : watch_) in_flight += watch.in_flight;
    if (in_flight == 0) progress_ = absl::Now();  // idle time is no stall
    ++watch_[stage].in_flight;
  }
  stages_[stage]->SendPlan(std::move(plan));
}

void GrpcRingLink::WatchdogLoop() {
  const absl::Duration tick =
      std::clamp(options_.stall_timeout / 8, absl::Milliseconds(50), absl::Milliseconds(500));
  std::unique_lock<std::mutex> lock(mu_);
  while (!closed_ && !failed_) {
    watchdog_cv_.wait_for(lock, absl::ToChronoMilliseconds(tick));
    if (closed_ || failed_) return;
    const absl::Time now = absl::Now();
    int64_t in_flight = 0;
    bool armed = true;
    for (const StageWatch& watch : watch_) {
      in_flight += watch.in_flight;
      armed = armed && watch.reported;
    }
    if (!armed || in_flight == 0 || now - progress_ < options_.stall_timeout) continue;
    failed_ = true;
    if (handlers_.on_failure) handlers_.on_failure(StallErrorLocked(now));
    return;
  }
}

absl::Status GrpcRingLink::StallErrorLocked(absl::Time now) const {
  std::string stages;
  for (int i = 0; i < num_stages(); ++i) {
    const StageWatch& watch = watch_[i];
    const v1::StageActivity& activity = watch.activity;
    if (!stages.empty()) stages += "; ";
    stages += fmt::format("stage {} ({}) ", i, stages_[i]->endpoint());
    if (activity.state() == v1::StageActivity::IDLE) {
      stages += "idle";
    } else {
      stages += fmt::format("{} micro-batch {} for {}", StateName(activity.state()),
                            activity.micro_batch_id(),
                            absl::FormatDuration(absl::Trunc(
                                absl::Microseconds(activity.state_us()), absl::Milliseconds(100))));
    }
    stages += fmt::format(", {} plan(s) in flight", watch.in_flight);
    if (now - watch.heard > options_.stall_timeout) {
      stages += fmt::format(", silent for {}",
                            absl::FormatDuration(absl::Trunc(now - watch.heard, absl::Seconds(1))));
    }
  }
  return absl::UnavailableError(fmt::format(
      "the ring made no progress for {} (no stage finished a step, computed or moved "
      "activation bytes): {}",
      absl::FormatDuration(absl::Trunc(now - progress_, absl::Milliseconds(100))), stages));
}

void GrpcRingLink::Fail(absl::Status status) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_ || failed_) return;
  failed_ = true;
  if (handlers_.on_failure) handlers_.on_failure(std::move(status));
}

void GrpcRingLink::Close(bool stop_stages) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
    watchdog_cv_.notify_all();
  }
  if (watchdog_.joinable()) watchdog_.join();
  for (auto& stage : stages_) stage->CloseSteps(absl::Seconds(5));
  if (stop_stages) {
    for (auto& stage : stages_) (void)stage->Shutdown(absl::Seconds(2));
  }
}

}  // namespace ringserve
