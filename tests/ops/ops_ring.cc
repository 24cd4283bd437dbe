#include "tests/ops/ops_ring.h"

#include "common/status_macros.h"
#include "coordinator/http/http_api.h"
#include "fmt/format.h"

namespace ringserve::ops {

absl::StatusOr<std::unique_ptr<OpsRing>> OpsRing::Start(const OpsRingOptions& options) {
  std::unique_ptr<OpsRing> ring(new OpsRing());
  RS_ASSIGN_OR_RETURN(std::string model_dir, MakeTestModel(ring->dir_.path()));
  DefaultRingOptions ring_options;
  ring_options.model_dir = model_dir;
  ring_options.num_layers = 4;
  ring_options.num_stages = options.num_stages;
  ring_options.grpc_listen = "127.0.0.1:0";
  ring_options.http_listen = "127.0.0.1:0";
  RS_ASSIGN_OR_RETURN(ring->config_, DefaultRingConfig(ring_options));
  RS_ASSIGN_OR_RETURN(LocalStages stages, LocalStages::Launch(BinaryDir() + "/stage/stage",
                                                              ring->config_, absl::Seconds(30)));
  ring->stages_.emplace(std::move(stages));
  ring->config_.ring_secret_file = ring->stages_->secret_file();  // the stages require it
  RS_ASSIGN_OR_RETURN(ring->engine_,
                      StartGrpcRingEngine({.bring_up = {.ring = ring->config_,
                                                        .connect_timeout = absl::Seconds(30),
                                                        .configure_timeout = absl::Seconds(60)},
                                           .local_stages = &*ring->stages_}));
  RS_ASSIGN_OR_RETURN(ring->http_, http::StartHttpApi(*ring->engine_, model_dir,
                                                      {.listen = ring->config_.http_listen,
                                                       .api_key = options.api_key}));
  return ring;
}

OpsRing::~OpsRing() {
  if (http_) http_->Stop();
  if (engine_) engine_->Shutdown(/*stop_stages=*/true);
  engine_.reset();
  if (stages_) stages_->TerminateAll();
}

std::string OpsRing::url() const { return fmt::format("http://127.0.0.1:{}", http_->port()); }

}  // namespace ringserve::ops
