// Fuzzes the plan codec (ring/plan_codec.h): the input is a serialized StepPlan as a stage
// receives it; it is decoded as the first, a middle and the last stage would.
#include <cstdint>

#include "ring/plan_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ringserve::v1::StepPlan plan;
  if (!plan.ParseFromArray(data, static_cast<int>(size))) return 0;
  for (bool first : {false, true}) {
    for (bool last : {false, true}) {
      (void)ringserve::DecodeStepPlan(plan, first, last, /*kv_block_size=*/16);
    }
  }
  return 0;
}
