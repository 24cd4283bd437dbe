// RingLink: how the engine talks to the stages of one formed ring. The engine sends each
// micro-batch's plan to every stage in order and receives every stage's StepResult; it never
// sees gRPC, processes or sockets. GrpcRingLink (grpc_ring_link.h) is the production link over
// the stages' Steps streams; FakeRingLink (testing/fake_ring_link.h) runs plans in-process for
// the engine's unit tests.
//
// A formed ring lives until it fails or is closed. RingFormer makes a new one: at start-up and
// again after a failure (a stage died, a stream broke, a keepalive went unanswered), when the
// engine re-forms the ring and resumes its requests.
#pragma once

#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/stage.pb.h"

namespace ringserve {

class RingLink {
 public:
  struct Handlers {
    // Every stage's result for every plan, in each stage's order. Any thread; must not block.
    std::function<void(v1::StepResult)> on_result;
    // The ring cannot run plans any more (at most once per link). Any thread; must not block.
    std::function<void(absl::Status)> on_failure;
  };

  virtual ~RingLink() = default;

  virtual int num_stages() const = 0;
  // Starts delivering results to `handlers`; called once, before the first Send.
  virtual absl::Status Open(Handlers handlers) = 0;
  // Queues `plan` for stage `stage`; plans reach a stage in the order sent. Never blocks.
  virtual void Send(int stage, v1::StepPlan plan) = 0;
  // Ends the ring: closes the streams (waiting briefly for queued plans) and, with
  // `stop_stages`, asks the stage processes to exit. No handler runs after Close returns, so
  // Close (and a link's destructor, which closes it) waits for a handler that is running: never
  // call it holding a lock that a handler takes. Idempotent.
  virtual void Close(bool stop_stages) = 0;
};

// A formed ring: the link and the KV capacity every stage holds (the minimum over stages).
struct FormedRing {
  std::unique_ptr<RingLink> link;
  int kv_num_blocks = 0;
};

// Forms (connects, configures, joins) a ring. `attempt` counts from 0 (start-up); later
// attempts re-form after a failure and may first restart local stage processes.
using RingFormer = std::function<absl::StatusOr<FormedRing>(int attempt)>;

}  // namespace ringserve
