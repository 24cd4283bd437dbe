#include "coordinator/http/starting_engine.h"


#include "fmt/format.h"

namespace ringserve::http {

StartingEngine::StartingEngine(std::string model_id, std::vector<StageLayout> stages)
    : model_id_(std::move(model_id)),
      layout_(std::move(stages)),
      status_(layout_.size(), "waiting for the stage") {}

void StartingEngine::SetStageStatus(int stage, std::string status) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stage >= 0 && stage < static_cast<int>(status_.size())) status_[stage] = std::move(status);
}

void StartingEngine::Attach(Engine* engine) { engine_.store(engine); }

void StartingEngine::Fail(const absl::Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  failure_ = status;
}

absl::Status StartingEngine::NotReady() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!failure_.ok()) {
    return absl::UnavailableError(
        fmt::format("the ring failed to start: {}", std::string(failure_.message())));
  }
  return absl::UnavailableError("the ring is starting (see /dashboard for each stage's progress)");
}

absl::Status StartingEngine::Submit(GenerateRequest request, EventCallback on_event) {
  if (Engine* engine = engine_.load())
    return engine->Submit(std::move(request), std::move(on_event));
  return NotReady();
}

void StartingEngine::Cancel(const std::string& request_id) {
  if (Engine* engine = engine_.load()) engine->Cancel(request_id);
}

absl::StatusOr<std::vector<int32_t>> StartingEngine::Tokenize(const std::string& text,
                                                              bool add_special_tokens) {
  if (Engine* engine = engine_.load()) return engine->Tokenize(text, add_special_tokens);
  return NotReady();
}

std::string StartingEngine::Detokenize(const std::vector<int32_t>& ids) {
  if (Engine* engine = engine_.load()) return engine->Detokenize(ids);
  return "";
}

ModelInfo StartingEngine::Info() {
  if (Engine* engine = engine_.load()) return engine->Info();
  ModelInfo info;
  info.model_id = model_id_;
  info.architecture = "starting";
  if (!layout_.empty()) info.num_layers = layout_.back().last_layer;
  return info;
}

RingStats StartingEngine::Stats() {
  if (Engine* engine = engine_.load()) return engine->Stats();
  RingStats stats;
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < layout_.size(); ++i) {
    StageStats stage;
    stage.index = static_cast<int>(i);
    stage.endpoint = layout_[i].endpoint;
    stage.first_layer = layout_[i].first_layer;
    stage.last_layer = layout_[i].last_layer;
    stage.load_status = failure_.ok() ? status_[i] : "failed: " + std::string(failure_.message());
    stats.stages.push_back(std::move(stage));
  }
  return stats;
}

}  // namespace ringserve::http
