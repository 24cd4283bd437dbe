// GrpcRingLink: the RingLink over the stages' control connections (one StageClient each, its
// Steps stream carrying plans out and results in). A stream that ends without Close, a stage
// error result, or a ring that stalls (below) is the ring's failure.
//
// Progress watchdog: a stage that stopped or whose host vanished is noticed by its control
// connection's keepalive within seconds. A ring whose stages all answer but that cannot go on
// (a stage that no longer reads its input, a cut activation path) would otherwise hang until a
// stage's step timeout (minutes). With `stall_timeout`, every stage reports what its executor
// is doing (StageActivity, on its Steps stream); the ring fails when it has plans in flight and
// for `stall_timeout` no stage finished a step, computed, or moved activation bytes. A long
// step (a big prefill on a slow CPU) is computing, and a slow transfer moves bytes: neither is
// a stall, whatever it takes.
//
// Thread-safe as RingLink requires.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "coordinator/ring_link.h"
#include "coordinator/stage_client.h"

namespace ringserve {

struct GrpcRingLinkOptions {
  // Zero: no watchdog. The stages must have been configured to report their activity
  // (ConfigureRequest.activity_interval_ms, a few times per stall_timeout); the watchdog arms
  // once every stage has reported.
  absl::Duration stall_timeout = absl::ZeroDuration();
};

class GrpcRingLink final : public RingLink {
 public:
  // `stages` are connected, configured and joined (ring_bringup.h), in ring order.
  explicit GrpcRingLink(std::vector<std::unique_ptr<StageClient>> stages,
                        GrpcRingLinkOptions options = {});
  ~GrpcRingLink() override;

  int num_stages() const override { return static_cast<int>(stages_.size()); }
  absl::Status Open(Handlers handlers) override;
  void Send(int stage, v1::StepPlan plan) override;
  void Close(bool stop_stages) override;

 private:
  // What the watchdog knows of one stage. Guarded by mu_.
  struct StageWatch {
    int64_t in_flight = 0;  // plans sent whose result has not come back
    bool reported = false;  // an activity report came
    v1::StageActivity activity;
    absl::Time heard;  // the latest report or result
  };

  void Deliver(v1::StepResult result);
  void Fail(absl::Status status);
  // An activity report: progress when the stage computes or its channels moved bytes. mu_ held.
  void NoteActivityLocked(int stage, const v1::StageActivity& activity, absl::Time now);
  void WatchdogLoop();
  // The stall's error: what each stage waits for. mu_ held.
  absl::Status StallErrorLocked(absl::Time now) const;

  std::vector<std::unique_ptr<StageClient>> stages_;
  const GrpcRingLinkOptions options_;
  std::mutex mu_;
  Handlers handlers_;
  bool closed_ = false;
  bool failed_ = false;
  std::vector<StageWatch> watch_;
  absl::Time progress_;  // the latest progress, or when plans went in flight again
  std::condition_variable watchdog_cv_;
  std::thread watchdog_;
};

}  // namespace ringserve
