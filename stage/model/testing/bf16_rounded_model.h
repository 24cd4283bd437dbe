// Test helper: a copy of a model directory whose weights are rounded to
// bf16 precision (still stored in their dtype). The CPU slice on such a copy sees the weights the
// GPU slice holds, so the two CPU runs measure how much a prompt's logits move under bf16 weight
// rounding alone: the reference's own sensitivity (routing near-ties in MoE models), against
// which GPU tests judge their bf16 error.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace ringserve::testing {

// Writes model_dir's .json files (config, tokenizer, shard index) and its .safetensors files,
// every F32 tensor rounded to the nearest bf16 value (other dtypes copied as they are), into
// out_dir (created).
// stochastic_seed > 0 rounds each value up or down at random instead (to one of its two bf16
// neighbours, the nearer one the more likely: unbiased noise of bf16's size), so several seeds
// probe a prompt's sensitivity to bf16 noise from several directions; BF16 tensors then get
// noise within half a bf16 step too (written as F32).
absl::Status WriteBf16RoundedModel(const std::string& model_dir, const std::string& out_dir,
                                   uint64_t stochastic_seed = 0);

}  // namespace ringserve::testing
