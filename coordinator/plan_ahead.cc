#include "coordinator/plan_ahead.h"

namespace ringserve {

void AddPlanAheadFields(const MicroBatchPlan& plan, bool is_first, bool is_last,
                        v1::StepPlan* wire) {
  if (is_last) wire->set_send_tokens_back(true);
  if (!is_first) return;
  wire->set_back_edge_through(plan.back_edge_through);
  wire->set_back_edge_keep_from(plan.back_edge_keep_from);
  wire->set_tokens_from(plan.tokens_from);
  for (size_t i = 0; i < plan.entries.size(); ++i) {
    if (plan.entries[i].ahead) wire->add_ahead_chunks(static_cast<int32_t>(i));
  }
}

}  // namespace ringserve
