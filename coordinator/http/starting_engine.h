// An Engine that stands in for the real one while the ring starts, so that the HTTP front
// (dashboard, /health, /metrics) is up during the long start-up and shows each stage's load
// progress. Requests get 503 until Attach(); from then on every call goes to the real engine.
//
//   StartingEngine front(model_id, layout);                  // from the RingConfig
//   auto http = StartHttpApi(front, model_dir, {...});        // serving at once
//   bring_up.on_progress = [&](const StageProgress& p) {     // coordinator/ring_bringup.h
//     front.SetStageStatus(p.stage, p.message);               // "loading layers [2, 4) ..."
//   };
//   auto engine = RingEngine::Start(engine_options);
//   if (engine.ok()) front.Attach(engine->get()); else front.Fail(engine.status());
//
// Thread-safe. The attached engine must outlive this object's use (stop HTTP first).
#pragma once

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "coordinator/engine.h"

namespace ringserve::http {

class StartingEngine : public Engine {
 public:
  struct StageLayout {
    std::string endpoint;
    int first_layer = 0;
    int last_layer = 0;
  };
  StartingEngine(std::string model_id, std::vector<StageLayout> stages);

  // Start-up progress of one stage (shown as its load_status until attached).
  void SetStageStatus(int stage, std::string status);
  // From now on, forwards everything to `engine` (not owned).
  void Attach(Engine* engine);
  // Start-up failed: requests get this error (Unavailable) instead of "starting".
  void Fail(const absl::Status& status);

  absl::Status Submit(GenerateRequest request, EventCallback on_event) override;
  void Cancel(const std::string& request_id) override;
  absl::StatusOr<std::vector<int32_t>> Tokenize(const std::string& text,
                                                bool add_special_tokens) override;
  std::string Detokenize(const std::vector<int32_t>& ids) override;
  ModelInfo Info() override;
  RingStats Stats() override;

 private:
  absl::Status NotReady();

  std::atomic<Engine*> engine_{nullptr};
  const std::string model_id_;
  const std::vector<StageLayout> layout_;
  std::mutex mu_;
  std::vector<std::string> status_;
  absl::Status failure_;
};

}  // namespace ringserve::http
