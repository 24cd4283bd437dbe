#include "coordinator/grpc_ring_link.h"

#include <utility>

#include "common/status_macros.h"
#include "fmt/format.h"

namespace ringserve {

GrpcRingLink::GrpcRingLink(std::vector<std::unique_ptr<StageClient>> stages)
    : stages_(std::move(stages)) {}

GrpcRingLink::~GrpcRingLink() { Close(/*stop_stages=*/false); }

absl::Status GrpcRingLink::Open(Handlers handlers) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    handlers_ = std::move(handlers);
  }
  for (auto& stage : stages_) {
    const int index = stage->index();
    const std::string endpoint = stage->endpoint();
    RS_RETURN_IF_ERROR(stage->StartSteps(
        [this](v1::StepResult result) { Deliver(std::move(result)); },
        [this, index, endpoint](absl::Status status) {
          if (status.ok()) {
            status = absl::UnavailableError(
                fmt::format("stage {} ({}) closed its Steps stream", index, endpoint));
          }
          Fail(std::move(status));
        }));
  }
  return absl::OkStatus();
}

void GrpcRingLink::Deliver(v1::StepResult result) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_ || failed_) return;
  if (!result.error().empty()) {
    failed_ = true;
    if (handlers_.on_failure) {
      handlers_.on_failure(absl::InternalError(
          fmt::format("stage {}: micro-batch {}: {}", result.stage_index(),
                      result.micro_batch_id(), result.error())));
    }
    return;
  }
  if (handlers_.on_result) handlers_.on_result(std::move(result));
}

void GrpcRingLink::Fail(absl::Status status) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_ || failed_) return;
  failed_ = true;
  if (handlers_.on_failure) handlers_.on_failure(std::move(status));
}

void GrpcRingLink::Send(int stage, v1::StepPlan plan) {
  if (stage < 0 || stage >= num_stages()) return;
  stages_[stage]->SendPlan(std::move(plan));
}

void GrpcRingLink::Close(bool stop_stages) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
  }
  for (auto& stage : stages_) stage->CloseSteps(absl::Seconds(5));
  if (stop_stages) {
    for (auto& stage : stages_) (void)stage->Shutdown(absl::Seconds(2));
  }
}

}  // namespace ringserve
