// The CPU reference of a mixture-of-experts MLP block (fp32, host memory): the router
// (moe_router.h), the chosen experts of each token, their weighted sum, and shared experts.
// Follows transformers 5.17: experts are visited in index order and each adds its weighted
// output to the tokens that chose it.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "ring/model_config.h"
#include "stage/model/quant/quant_config.h"
#include "stage/model/safetensors.h"

namespace ringserve {

// One expert FFN: gate and up [inter, hidden], down [hidden, inter] ([out, in], as nn.Linear);
// biases [inter] / [hidden] or empty (only gpt-oss has them).
struct CpuExpert {
  std::vector<float> gate, up, down;
  std::vector<float> gate_bias, up_bias, down_bias;
};

struct CpuMoeLayer {
  std::vector<float> router;              // [num_experts, hidden]
  std::vector<float> router_bias;         // [num_experts] or empty
  std::vector<float> correction_bias;     // [num_experts] or empty
  std::vector<CpuExpert> experts;         // [num_experts]
  CpuExpert shared;                       // empty weights when the model has no shared expert
  std::vector<float> shared_expert_gate;  // [hidden] or empty (Qwen2-MoE)
};

// Reads layer `layer`'s MoE block (MoeLayerTensorSpecs) as fp32; gpt-oss's stacked
// input-major tensors are split per expert and transposed to [out, in]. Experts and shared
// experts that `quant` stores quantized are dequantized at load by their format's one rule
// (ReadWeightFloat, stage/model/quantized_weights.h: fp8 blocks, compressed-tensors, GPTQ, AWQ,
// gpt-oss MXFP4); the router and its biases are read as floats. Only this layer's tensors are
// read. Errors name the tensor. Precondition: config.moe.IsMoeLayer(layer).
absl::StatusOr<CpuMoeLayer> LoadCpuMoeLayer(const ModelConfig& config, int layer,
                                            SafetensorsModel& weights,
                                            const quant::QuantConfig& quant);

// out[t, :] = sum over token t's chosen experts e of weight(t, e) * expert_e(x[t, :])
//             (+ the shared expert, gated by sigmoid(shared_expert_gate . x[t, :]) if present).
//   x: [num_tokens, hidden] (the post-attention-norm activations); out: [num_tokens, hidden],
//   overwritten, must not alias x. `layer` must match `moe` (as loaded by LoadCpuMoeLayer).
void CpuMoeForward(const MoeConfig& moe, int hidden, const CpuMoeLayer& layer, const float* x,
                   int64_t num_tokens, float* out);

}  // namespace ringserve
