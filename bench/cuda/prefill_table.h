// Where a long prefill's time goes: the four layer GEMMs at m = n tokens (cuBLASLt's heuristic
// plan and the tuned plan) and the causal prefill attention for one sequence of n tokens, each
// timed alone with CUDA events and printed with its TFLOP/s, plus the per-layer sum.
#pragma once

#include <string>
#include <vector>

#include "ring/model_config.h"

namespace ringserve::cuda {

// Appends one block per length to `out`. Uses its own device buffers and its own GEMM runner
// (freed on return), so its tuning does not change the plans a model slice uses.
void PrefillTable(const ModelConfig& c, const std::vector<int>& lengths, std::string* out);

}  // namespace ringserve::cuda
