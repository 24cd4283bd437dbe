// The coordinator's handle on one stage process: connect (bounded wait), configure (with load
// progress), connect peers, and the Steps stream (plans out, results in) for the ring's life.
//
// Thread-safe: SendPlan may be called from one thread while results arrive on the reader
// thread; the other calls are for start-up and shutdown.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "proto/stage.grpc.pb.h"
#include "ring/control_auth.h"

namespace ringserve {

class StageClient {
 public:
  // Connects to the stage's control endpoint, waiting up to `wait` for it to accept, and asks
  // it for a nonce to authenticate every later call with (`creds`, stage_auth.h).
  // Unavailable naming the stage, its endpoint and the wait when it did not accept;
  // Unauthenticated when it requires a ring secret and `creds` has none.
  static absl::StatusOr<std::unique_ptr<StageClient>> Connect(int index,
                                                              const std::string& endpoint,
                                                              absl::Duration wait,
                                                              const ControlCredentials& creds = {});
  ~StageClient();

  int index() const { return index_; }
  const std::string& endpoint() const { return endpoint_; }

  // Configures the stage; `on_progress` sees every LoadProgress message (on this thread).
  // Returns the stage's activation endpoint (empty on stage 0). Errors name the stage.
  absl::StatusOr<std::string> Configure(
      const v1::ConfigureRequest& request, absl::Duration timeout,
      const std::function<void(const v1::LoadProgress&)>& on_progress);
  absl::Status ConnectPeers(const v1::ConnectPeersRequest& request, absl::Duration timeout);

  // Opens the Steps stream. `on_result` runs on this client's reader thread for every result;
  // `on_closed` runs once when the stream ends (OK after CloseSteps; an error otherwise).
  absl::Status StartSteps(std::function<void(v1::StepResult)> on_result,
                          std::function<void(absl::Status)> on_closed);
  // Queues a plan; plans are written in the order queued. Never blocks on the network.
  void SendPlan(v1::StepPlan plan);
  // Half-closes the stream after the queued plans and waits (up to `timeout`) for it to end.
  void CloseSteps(absl::Duration timeout);

  absl::StatusOr<v1::StageStatsResponse> Stats(absl::Duration timeout);
  absl::StatusOr<v1::StageHealthResponse> Health(absl::Duration timeout);
  absl::Status Shutdown(absl::Duration timeout);

 private:
  StageClient(int index, std::string endpoint, std::shared_ptr<grpc::Channel> channel);
  // Adds the authentication metadata to a call's context.
  void Authorize(grpc::ClientContext* context) const;
  void WriterLoop();
  std::string Name() const;

  const int index_;
  const std::string endpoint_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::StageControl::Stub> stub_;
  ControlCredentials creds_;
  std::string nonce_;

  std::unique_ptr<grpc::ClientContext> steps_context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::StepPlan, v1::StepResult>> steps_;
  std::thread reader_;
  std::thread writer_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<v1::StepPlan> outbox_;
  bool closing_ = false;
  bool write_failed_ = false;
  bool reader_done_ = false;
};

}  // namespace ringserve
