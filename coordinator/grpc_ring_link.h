// GrpcRingLink: the RingLink over the stages' control connections (one StageClient each, its
// Steps stream carrying plans out and results in). A stream that ends without Close, or a
// stage error result, is the ring's failure.
//
// Thread-safe as RingLink requires.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "coordinator/ring_link.h"
#include "coordinator/stage_client.h"

namespace ringserve {

class GrpcRingLink final : public RingLink {
 public:
  // `stages` are connected, configured and joined (ring_bringup.h), in ring order.
  explicit GrpcRingLink(std::vector<std::unique_ptr<StageClient>> stages);
  ~GrpcRingLink() override;

  int num_stages() const override { return static_cast<int>(stages_.size()); }
  absl::Status Open(Handlers handlers) override;
  void Send(int stage, v1::StepPlan plan) override;
  void Close(bool stop_stages) override;

 private:
  void Deliver(v1::StepResult result);
  void Fail(absl::Status status);

  std::vector<std::unique_ptr<StageClient>> stages_;
  std::mutex mu_;
  Handlers handlers_;
  bool closed_ = false;
  bool failed_ = false;
};

}  // namespace ringserve
