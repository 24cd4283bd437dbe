// Plans sent ahead, on the wire. With SchedulerOptions::plan_ahead the scheduler plans a
// micro-batch's follow-up while the micro-batch runs (as vLLM's asynchronous scheduling does),
// assuming each of its sampling sequences continues; the follow-up's decodes of tokens not yet
// sampled carry a placeholder, and stage 0 fills it with the token the last stage sends it over
// the token back edge (stage/token_back_edge.h). So stage 0 never waits for the coordinator
// between steps; the coordinator still gets every token in the last stage's StepResult and
// drops a finished sequence from the next plan it builds (the one extra token of a sequence
// already planned ahead is discarded, its KV blocks freed as usual).
//
// Pure functions; thread-safe.
#pragma once

#include "coordinator/scheduler/scheduler.h"
#include "proto/stage.pb.h"

namespace ringserve {

// Adds the plan-ahead fields of `plan` to the wire plan of one stage (EncodeStepPlan's):
// the last stage sends its sampled tokens back; stage 0 gets the back edge's bounds and where
// each placeholder's token comes from (proto/stage.proto, StepPlan). Call for every plan of a
// ring whose scheduler plans ahead (every plan then sends its tokens back).
void AddPlanAheadFields(const MicroBatchPlan& plan, bool is_first, bool is_last,
                        v1::StepPlan* wire);

}  // namespace ringserve
