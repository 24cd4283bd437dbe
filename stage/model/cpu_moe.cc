#include "stage/model/cpu_moe.h"

#include <algorithm>
#include <cmath>

#include "common/status_macros.h"
#include "kernels/cpu/ops.h"
#include "stage/model/moe_router.h"
#include "stage/model/quantized_weights.h"
#include "stage/model/slice_weights.h"

namespace ringserve {
namespace {

// gpt-oss: expert x of the stacked, input-major tensors, as [out, in] matrices.
CpuExpert SplitStacked(const std::vector<float>& gate_up, const std::vector<float>& gate_up_bias,
                       const std::vector<float>& down, const std::vector<float>& down_bias,
                       int64_t x, int64_t hidden, int64_t inter) {
  CpuExpert e;
  e.gate.resize(inter * hidden);
  e.up.resize(inter * hidden);
  e.down.resize(hidden * inter);
  const float* gu = gate_up.data() + x * hidden * 2 * inter;  // [hidden, 2 * inter]
  for (int64_t h = 0; h < hidden; ++h) {
    for (int64_t i = 0; i < inter; ++i) {
      e.gate[i * hidden + h] = gu[h * 2 * inter + 2 * i];
      e.up[i * hidden + h] = gu[h * 2 * inter + 2 * i + 1];
    }
  }
  const float* gub = gate_up_bias.data() + x * 2 * inter;
  for (int64_t i = 0; i < inter; ++i) {
    e.gate_bias.push_back(gub[2 * i]);
    e.up_bias.push_back(gub[2 * i + 1]);
  }
  const float* d = down.data() + x * inter * hidden;  // [inter, hidden]
  for (int64_t i = 0; i < inter; ++i) {
    for (int64_t h = 0; h < hidden; ++h) e.down[h * inter + i] = d[i * hidden + h];
  }
  e.down_bias.assign(down_bias.begin() + x * hidden, down_bias.begin() + (x + 1) * hidden);
  return e;
}

const float* BiasOrNull(const std::vector<float>& b) { return b.empty() ? nullptr : b.data(); }

// y = expert(x) for n rows; x: [n, hidden], y: [n, hidden].
void RunExpert(const MoeConfig& moe, const CpuExpert& e, int64_t hidden, int64_t inter,
               const float* x, int64_t n, float* y) {
  std::vector<float> gate(n * inter), up(n * inter);
  cpu::MatMul(x, e.gate.data(), BiasOrNull(e.gate_bias), n, hidden, inter, gate.data());
  cpu::MatMul(x, e.up.data(), BiasOrNull(e.up_bias), n, hidden, inter, up.data());
  if (moe.activation == ExpertActivation::kClampedSwiglu) {
    const float limit = moe.swiglu_limit;
    for (int64_t i = 0; i < n * inter; ++i) {
      const float g = std::min(gate[i], limit);
      const float u = std::clamp(up[i], -limit, limit);
      const float glu = g * (1.0f / (1.0f + std::exp(-g * moe.swiglu_alpha)));
      gate[i] = (u + 1.0f) * glu;
    }
  } else {
    cpu::SiluMul(gate.data(), up.data(), n * inter, gate.data());
  }
  cpu::MatMul(gate.data(), e.down.data(), BiasOrNull(e.down_bias), n, inter, hidden, y);
}

}  // namespace

absl::StatusOr<CpuMoeLayer> LoadCpuMoeLayer(const ModelConfig& config, int layer,
                                            SafetensorsModel& weights,
                                            const quant::QuantConfig& quant) {
  auto Read = [&](SafetensorsModel& w, const TensorSpec& spec) {
    return ReadWeightFloat(w, quant, spec);
  };
  const MoeConfig& m = config.moe;
  const MoeTensorSpecs specs = MoeLayerTensorSpecs(config, layer);
  CpuMoeLayer out;
  RS_ASSIGN_OR_RETURN(out.router, Read(weights, specs.router));
  if (specs.router_bias) {
    RS_ASSIGN_OR_RETURN(out.router_bias, Read(weights, *specs.router_bias));
  }
  if (specs.correction_bias) {
    RS_ASSIGN_OR_RETURN(out.correction_bias, Read(weights, *specs.correction_bias));
  }
  const int64_t e = m.router.num_experts;
  if (m.layout == ExpertLayout::kGptOssStacked) {
    RS_ASSIGN_OR_RETURN(std::vector<float> gate_up, Read(weights, *specs.gate_up));
    RS_ASSIGN_OR_RETURN(std::vector<float> gate_up_bias, Read(weights, *specs.gate_up_bias));
    RS_ASSIGN_OR_RETURN(std::vector<float> down, Read(weights, *specs.stacked_down));
    RS_ASSIGN_OR_RETURN(std::vector<float> down_bias, Read(weights, *specs.down_bias));
    for (int64_t x = 0; x < e; ++x) {
      out.experts.push_back(SplitStacked(gate_up, gate_up_bias, down, down_bias, x,
                                         config.hidden_size, m.expert_intermediate_size));
    }
  } else {
    out.experts.resize(e);
    for (int64_t x = 0; x < e; ++x) {
      RS_ASSIGN_OR_RETURN(out.experts[x].gate, Read(weights, specs.gate[x]));
      RS_ASSIGN_OR_RETURN(out.experts[x].up, Read(weights, specs.up[x]));
      RS_ASSIGN_OR_RETURN(out.experts[x].down, Read(weights, specs.down[x]));
    }
  }
  if (specs.shared_gate) {
    RS_ASSIGN_OR_RETURN(out.shared.gate, Read(weights, *specs.shared_gate));
    RS_ASSIGN_OR_RETURN(out.shared.up, Read(weights, *specs.shared_up));
    RS_ASSIGN_OR_RETURN(out.shared.down, Read(weights, *specs.shared_down));
  }
  if (specs.shared_expert_gate) {
    RS_ASSIGN_OR_RETURN(out.shared_expert_gate, Read(weights, *specs.shared_expert_gate));
  }
  return out;
}

void CpuMoeForward(const MoeConfig& moe, int hidden, const CpuMoeLayer& layer, const float* x,
                   int64_t num_tokens, float* out) {
  const int64_t e = moe.router.num_experts;
  const int k = moe.router.top_k;
  std::vector<float> logits(num_tokens * e);
  cpu::MatMul(x, layer.router.data(), BiasOrNull(layer.router_bias), num_tokens, hidden, e,
              logits.data());
  std::vector<int32_t> ids(num_tokens * k);
  std::vector<float> weights(num_tokens * k);
  RouteTokens(moe.router, logits, layer.correction_bias, num_tokens, ids, weights);

  std::fill_n(out, num_tokens * hidden, 0.0f);
  std::vector<int64_t> rows;
  std::vector<float> row_weight, gathered, y;
  for (int64_t expert = 0; expert < e; ++expert) {
    rows.clear();
    row_weight.clear();
    for (int64_t t = 0; t < num_tokens; ++t) {
      for (int j = 0; j < k; ++j) {
        if (ids[t * k + j] == expert) {
          rows.push_back(t);
          row_weight.push_back(weights[t * k + j]);
        }
      }
    }
    if (rows.empty()) continue;
    const int64_t n = static_cast<int64_t>(rows.size());
    gathered.resize(n * hidden);
    y.resize(n * hidden);
    for (int64_t r = 0; r < n; ++r) {
      std::copy_n(x + rows[r] * hidden, hidden, gathered.data() + r * hidden);
    }
    RunExpert(moe, layer.experts[expert], hidden, moe.expert_intermediate_size, gathered.data(), n,
              y.data());
    for (int64_t r = 0; r < n; ++r) {
      float* o = out + rows[r] * hidden;
      for (int64_t h = 0; h < hidden; ++h) o[h] += y[r * hidden + h] * row_weight[r];
    }
  }
  if (layer.shared.gate.empty()) return;
  y.resize(num_tokens * hidden);
  RunExpert(moe, layer.shared, hidden, moe.shared_intermediate_size, x, num_tokens, y.data());
  for (int64_t t = 0; t < num_tokens; ++t) {
    float scale = 1.0f;
    if (!layer.shared_expert_gate.empty()) {
      float dot = 0.0f;
      for (int64_t h = 0; h < hidden; ++h) dot += x[t * hidden + h] * layer.shared_expert_gate[h];
      scale = 1.0f / (1.0f + std::exp(-dot));
    }
    for (int64_t h = 0; h < hidden; ++h) out[t * hidden + h] += scale * y[t * hidden + h];
  }
}

}  // namespace ringserve
