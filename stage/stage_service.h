// The stage control service (ringserve.v1.StageControl, proto/stage.proto): one per stage
// process. It starts empty; Configure loads the model slice and binds the activation listener,
// ConnectPeers joins the ring, and one Steps stream then runs plans in order until the
// coordinator closes it. After the stream ends (or fails) the stage drops its slice and
// channels and waits to be configured again, so a restarted coordinator can take it over.
//
// Thread-safe: gRPC calls it from its threads.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "common/ring_secret.h"
#include "proto/stage.grpc.pb.h"
#include "ring/control_auth.h"
#include "ring/kv_cache_dtype.h"
#include "stage/channels/tcp_channel.h"
#include "stage/speculative/speculator.h"
#include "stage/step_executor.h"

namespace ringserve {

struct StageServiceOptions {
  // Host the activation listener binds (the control --listen host, e.g. 0.0.0.0).
  std::string bind_host = "127.0.0.1";
  // Called with human-readable progress while configuring ("loading layers [0, 2) ...").
  std::function<void(const std::string& status)> on_status;
  // Called once the weights are loaded and the stage can serve plans (sd_notify READY=1).
  std::function<void(const std::string& status)> on_ready;
  // Called when a Shutdown RPC arrives; the owner stops the server (not from this call).
  std::function<void()> on_shutdown;
  // The ring secret: when set, every call must prove knowledge of it (stage_auth.h), the stage
  // belongs to the coordinator that configured it until its ring ends, and the activation
  // channels authenticate their peers with it.
  std::optional<RingSecret> secret;
  // When not empty, Configure refuses model directories outside this directory (after
  // resolving symlinks and "..").
  std::string model_root;
  // Testing aid (stage --debug_step_delay_ms): extra time in every step.
  absl::Duration debug_step_delay = absl::ZeroDuration();
  // Testing aid (stage --debug_stall_after_steps): StepExecutorOptions::debug_stall_after_steps.
  int debug_stall_after_steps = 0;
  // stage --kv_cache_dtype: the KV cache's element type when a Configure names none.
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kAuto;
};

class StageService final : public v1::StageControl::Service {
 public:
  explicit StageService(StageServiceOptions options);
  ~StageService() override;

  grpc::Status Challenge(grpc::ServerContext* context, const v1::ChallengeRequest* request,
                         v1::ChallengeResponse* response) override;
  grpc::Status Configure(grpc::ServerContext* context, const v1::ConfigureRequest* request,
                         grpc::ServerWriter<v1::LoadProgress>* writer) override;
  grpc::Status ConnectPeers(grpc::ServerContext* context, const v1::ConnectPeersRequest* request,
                            v1::ConnectPeersResponse* response) override;
  grpc::Status Steps(grpc::ServerContext* context,
                     grpc::ServerReaderWriter<v1::StepResult, v1::StepPlan>* stream) override;
  grpc::Status Health(grpc::ServerContext* context, const v1::StageHealthRequest* request,
                      v1::StageHealthResponse* response) override;
  grpc::Status Stats(grpc::ServerContext* context, const v1::StageStatsRequest* request,
                     v1::StageStatsResponse* response) override;
  grpc::Status Shutdown(grpc::ServerContext* context, const v1::ShutdownRequest* request,
                        v1::ShutdownResponse* response) override;

  // False while a step has run longer than any step may (the receive timeout plus a minute):
  // the executor is wedged (e.g. a hung device), and the systemd watchdog should restart the
  // stage. True when idle. Thread-safe and cheap (the watchdog pinger calls it).
  bool ExecutorAlive() const;

 private:
  void SetStatus(const std::string& status);
  void ResetLocked();

  // The caller's coordinator id, or the status to answer with (unauthenticated; with
  // `owner_only`, another coordinator's call while the stage belongs to one).
  absl::StatusOr<std::string> Caller(const grpc::ServerContext& context, bool owner_only);

  const StageServiceOptions options_;
  StageAuthenticator auth_;
  const absl::Time start_time_ = absl::Now();

  std::mutex mu_;
  std::string status_ = "waiting for configuration";
  bool configuring_ = false;
  bool steps_active_ = false;
  v1::ConfigureRequest config_;
  std::unique_ptr<TcpListener> listener_;
  std::unique_ptr<ModelSlice> slice_;       // loaded, not yet handed to the executor
  std::unique_ptr<Speculator> speculator_;  // with slice_: the last stage's draft model, if any
  std::shared_ptr<StepExecutor> executor_;

  std::atomic<int64_t> busy_us_{0};
  std::atomic<int64_t> steps_{0};
  std::atomic<int> in_flight_{0};
  std::atomic<int64_t> bytes_sent_{0};
  std::atomic<int64_t> bytes_received_{0};
  std::atomic<int64_t> step_started_us_{0};  // 0 = no step running
  std::atomic<int64_t> step_limit_us_{180'000'000};
};

}  // namespace ringserve
