// A CPU ring for the operations tests: real `stage` processes on loopback (tcp channel), the
// real RingEngine connected to them in this process, and the HTTP front (OpenAI API, /metrics,
// /dashboard) on a free port, serving the test model of ops_util.h (MakeTestModel) so that text
// and chat requests go through the real tokenizer and chat-template code.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "coordinator/hosts/ring_config.h"
#include "coordinator/http/http_server.h"
#include "coordinator/local_stages.h"
#include "coordinator/grpc_ring_engine.h"
#include "tests/ops/ops_util.h"

namespace ringserve::ops {

struct OpsRingOptions {
  int num_stages = 3;
  std::string api_key{};  // required on /v1/* when not empty
};

class OpsRing {
 public:
  // Starts the stages, waits for them (bounded), configures them through the engine and
  // starts HTTP. Fails with the first error, naming the stage.
  static absl::StatusOr<std::unique_ptr<OpsRing>> Start(const OpsRingOptions& options);
  ~OpsRing();

  // "http://127.0.0.1:PORT".
  std::string url() const;
  RingEngine& engine() { return *engine_; }
  const RingConfig& config() const { return config_; }

 private:
  OpsRing() = default;
  TempDir dir_;
  RingConfig config_;
  std::optional<LocalStages> stages_;
  std::unique_ptr<RingEngine> engine_;
  std::unique_ptr<http::HttpServer> http_;
};

}  // namespace ringserve::ops
