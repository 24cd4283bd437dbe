#include "coordinator/grpc_ring_engine.h"

#include <utility>

#include "common/status_macros.h"
#include "coordinator/served_model.h"

namespace ringserve {

absl::StatusOr<std::unique_ptr<RingEngine>> StartGrpcRingEngine(GrpcRingEngineOptions options) {
  const RingConfig& ring = options.bring_up.ring;
  RS_RETURN_IF_ERROR(ValidateRingConfig(ring));
  RS_ASSIGN_OR_RETURN(ServedModel served, LoadServedModel(ring));
  RingEngineOptions engine{.model_id = served.model_id,
                           .model = served.config,
                           .tokenizer = served.tokenizer,
                           .scheduler = SchedulerOptionsFor(ring, served, options.packing),
                           .recover = options.recover,
                           .ring_down_timeout = options.ring_down_timeout};
  // Speculating sequences go step by step (drafts come back with the result and make the next
  // plan); the scheduler plans the others ahead, so a ring whose speculation backs off
  // (speculation_payoff.h) decodes as fast as one without.
  engine.scheduler.plan_ahead = options.plan_ahead;
  engine.scheduler.prefix_caching = options.prefix_caching;
  options.bring_up.token_back_edge = options.plan_ahead;
  if (options.bring_up.speculation.enabled()) {
    engine.scheduler.speculation.max_drafts = options.bring_up.speculation.num_tokens;
    engine.scheduler.speculation.max_decoding_sequences = options.speculation_max_sequences;
    engine.scheduler.speculation.payoff.enabled = options.speculation_payoff;
  }
  for (const StageConfig& stage : ring.stages) {
    engine.stages.push_back({stage.endpoint(), stage.first_layer, stage.last_layer});
  }
  engine.form_ring = [bring_up = options.bring_up, model = served.config,
                      local = options.local_stages](int attempt) -> absl::StatusOr<FormedRing> {
    if (attempt > 0 && local != nullptr) {
      RS_RETURN_IF_ERROR(local->RespawnExited(absl::Seconds(30)));
    }
    return FormGrpcRing(bring_up, model);
  };
  return RingEngine::Start(std::move(engine));
}

}  // namespace ringserve
