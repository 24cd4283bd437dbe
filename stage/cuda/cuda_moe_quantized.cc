// CudaMoeLayer's routed experts held quantized (cuda_moe_layer.h): the stacks' layout, loading
// them from a checkpoint (per-expert hub tensors, or gpt-oss's stacked MXFP4) and random ones
// for benchmarks.
#include <string>
#include <vector>

#include "common/logging.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "stage/cuda/cuda_moe_layer.h"
#include "stage/cuda/cuda_quant_linear.h"
#include "stage/model/packed_weights.h"
#include "stage/model/quantized_weights.h"

namespace ringserve::cuda {
namespace {

constexpr int64_t kAlign = 256;

int64_t AlignUp(int64_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

// Byte offsets of the quantized expert stacks in one allocation (gate/up codes first).
struct QuantStacks {
  int64_t gate_up_scales = 0;
  int64_t down_codes = 0;
  int64_t down_scales = 0;
  int64_t bytes = 0;
};
QuantStacks StacksOf(const QuantMatrixView& gate_up, const QuantMatrixView& down) {
  QuantStacks s;
  s.gate_up_scales = AlignUp(QuantCodeBytes(gate_up.format, gate_up.rows, gate_up.cols));
  s.down_codes = s.gate_up_scales + AlignUp(QuantScaleBytes(gate_up.format, gate_up.rows,
                                                            gate_up.cols, gate_up.group_cols));
  s.down_scales = s.down_codes + AlignUp(QuantCodeBytes(down.format, down.rows, down.cols));
  s.bytes =
      s.down_scales + AlignUp(QuantScaleBytes(down.format, down.rows, down.cols, down.group_cols));
  return s;
}

// Copies packed matrix `m` into rows [row0, row0 + m.rows) of a stack whose codes and scales
// start at `codes` and `scales` (device; `stack` gives its format and sizes).
absl::Status CopyRows(const QuantMatrixView& stack, char* codes, char* scales, int64_t row0,
                      const quant::PackedMatrix& m) {
  RS_CUDA_RETURN_IF_ERROR(cudaMemcpy(codes + QuantCodeBytes(stack.format, row0, stack.cols),
                                     m.codes.data(), m.codes.size(), cudaMemcpyHostToDevice));
  const std::vector<float> device_scales = DeviceScales(m);
  RS_CUDA_RETURN_IF_ERROR(cudaMemcpy(
      scales + QuantScaleBytes(stack.format, row0, stack.cols, stack.group_cols),
      device_scales.data(), device_scales.size() * sizeof(float), cudaMemcpyHostToDevice));
  return absl::OkStatus();
}

}  // namespace

absl::Status CudaMoeLayer::AllocateQuantizedExperts(const QuantMatrixView& gate_up,
                                                    const QuantMatrixView& down) {
  const QuantStacks stacks = StacksOf(gate_up, down);
  gate_up_ = down_ = nullptr;
  RS_RETURN_IF_ERROR(experts_.Allocate(stacks.bytes));
  char* base = experts_.as<char>();
  quant_gate_up_ = gate_up;
  quant_gate_up_.codes = reinterpret_cast<const uint8_t*>(base);
  quant_gate_up_.scales = reinterpret_cast<const float*>(base + stacks.gate_up_scales);
  quant_down_ = down;
  quant_down_.codes = reinterpret_cast<const uint8_t*>(base + stacks.down_codes);
  quant_down_.scales = reinterpret_cast<const float*>(base + stacks.down_scales);
  return absl::OkStatus();
}

absl::StatusOr<std::string> CudaMoeLayer::LoadQuantizedExperts(const ModelConfig& config, int layer,
                                                               SafetensorsModel& weights,
                                                               const quant::QuantConfig& quant) {
  const MoeTensorSpecs specs = MoeLayerTensorSpecs(config, layer);
  for (int64_t x = 0; x < moe_.router.num_experts; ++x) {
    for (const TensorSpec* spec : {&specs.gate[x], &specs.up[x], &specs.down[x]}) {
      if (!IsQuantizedWeight(quant, *spec)) return fmt::format("{} is not quantized", spec->name);
    }
  }
  // Expert x's gate and up rows stacked, and its down matrix.
  return StoreQuantizedExperts(
      layer,
      [&](int64_t x, quant::PackedMatrix* gate_up,
          quant::PackedMatrix* down) -> absl::StatusOr<std::string> {
        std::vector<quant::PackedMatrix> parts;
        for (const TensorSpec* spec : {&specs.gate[x], &specs.up[x], &specs.down[x]}) {
          RS_ASSIGN_OR_RETURN(PackedWeight p, ReadPackedWeight(weights, quant, *spec));
          if (!p.matrix) return fmt::format("{}: {}", spec->name, p.why_not);
          parts.push_back(*std::move(p.matrix));
        }
        *down = std::move(parts[2]);
        parts.pop_back();
        absl::StatusOr<quant::PackedMatrix> stacked = quant::StackRows(parts);
        if (!stacked.ok()) return std::string(stacked.status().message());
        *gate_up = *std::move(stacked);
        return std::string();
      });
}

absl::StatusOr<std::string> CudaMoeLayer::LoadQuantizedStackedExperts(
    const ModelConfig& config, int layer, SafetensorsModel& weights,
    const quant::QuantConfig& quant) {
  const MoeTensorSpecs specs = MoeLayerTensorSpecs(config, layer);
  for (const TensorSpec* spec : {&*specs.gate_up, &*specs.stacked_down}) {
    if (!IsQuantizedWeight(quant, *spec)) return fmt::format("{} is not quantized", spec->name);
  }
  if (quant.method != quant::QuantMethod::kMxfp4) {
    return fmt::format("stacked experts under quant_method {}",
                       quant::QuantMethodName(quant.method));
  }
  // The stored gate_up rows interleave gate and up (row 2j: gate j, row 2j + 1: up j); the
  // kernels want the gate rows first.
  const int64_t inter = moe_.expert_intermediate_size;
  std::vector<int64_t> gate_then_up(2 * inter);
  for (int64_t j = 0; j < inter; ++j) {
    gate_then_up[j] = 2 * j;
    gate_then_up[inter + j] = 2 * j + 1;
  }
  return StoreQuantizedExperts(
      layer,
      [&](int64_t x, quant::PackedMatrix* gate_up,
          quant::PackedMatrix* down) -> absl::StatusOr<std::string> {
        RS_ASSIGN_OR_RETURN(PackedWeight gu, ReadPackedMxfp4Expert(weights, *specs.gate_up, x));
        if (!gu.matrix) return fmt::format("{}: {}", specs.gate_up->name, gu.why_not);
        RS_ASSIGN_OR_RETURN(PackedWeight d, ReadPackedMxfp4Expert(weights, *specs.stacked_down, x));
        if (!d.matrix) return fmt::format("{}: {}", specs.stacked_down->name, d.why_not);
        RS_ASSIGN_OR_RETURN(*gate_up, quant::SelectRows(*gu.matrix, gate_then_up));
        *down = *std::move(d.matrix);
        return std::string();
      });
}

absl::StatusOr<std::string> CudaMoeLayer::StoreQuantizedExperts(int layer,
                                                                const ExpertPacker& pack) {
  const int64_t e = moe_.router.num_experts, inter = moe_.expert_intermediate_size, h = hidden_;
  // The stack each matrix kind goes into, shaped after expert 0's.
  const auto stack_of = [](const quant::PackedMatrix& m, int64_t experts) {
    return QuantMatrixView{.format = static_cast<QuantFormat>(m.format),
                           .rows = static_cast<int>(m.rows * experts),
                           .cols = static_cast<int>(m.cols),
                           .group_cols = static_cast<int>(m.group_cols)};
  };
  const auto fits = [](const QuantMatrixView& stack, const quant::PackedMatrix& m,
                       int64_t experts) {
    return static_cast<QuantFormat>(m.format) == stack.format && m.cols == stack.cols &&
           m.group_cols == stack.group_cols && m.rows * experts == stack.rows;
  };
  quant::PackedMatrix gate_up, down;
  RS_ASSIGN_OR_RETURN(std::string why, pack(0, &gate_up, &down));
  if (!why.empty()) return why;
  const QuantMatrixView gate_up_stack = stack_of(gate_up, e), down_stack = stack_of(down, e);
  if (gate_up.rows != 2 * inter || gate_up.cols != h || down.rows != h || down.cols != inter) {
    return std::string("unexpected expert shapes");
  }
  for (const QuantMatrixView& stack : {gate_up_stack, down_stack}) {
    if (!QuantMatrixSupported(stack.format, stack.rows, stack.cols, stack.group_cols)) {
      return fmt::format("{} columns in groups of {} are not multiples of {}", stack.cols,
                         stack.group_cols, QuantChunk(stack.format));
    }
  }
  RS_RETURN_IF_ERROR(AllocateQuantizedExperts(gate_up_stack, down_stack));
  const QuantStacks stacks = StacksOf(gate_up_stack, down_stack);
  char* base = experts_.as<char>();
  for (int64_t x = 0; x < e; ++x) {
    if (x > 0) {
      RS_ASSIGN_OR_RETURN(why, pack(x, &gate_up, &down));
      if (why.empty() && (!fits(gate_up_stack, gate_up, e) || !fits(down_stack, down, e))) {
        why = fmt::format("expert {} differs from expert 0 in format or group size", x);
      }
      if (!why.empty()) {
        experts_.Reset();
        quant_gate_up_ = quant_down_ = QuantMatrixView{};
        return why;
      }
    }
    RS_RETURN_IF_ERROR(
        CopyRows(gate_up_stack, base, base + stacks.gate_up_scales, x * 2 * inter, gate_up));
    RS_RETURN_IF_ERROR(
        CopyRows(down_stack, base + stacks.down_codes, base + stacks.down_scales, x * h, down));
  }
  RS_LOG_INFO("layer {}: routed experts held quantized ({} gate/up, {} down; {} MiB)", layer,
              quant::PackedFormatName(static_cast<quant::PackedFormat>(gate_up_stack.format)),
              quant::PackedFormatName(static_cast<quant::PackedFormat>(down_stack.format)),
              experts_.bytes() >> 20);
  return std::string();
}

absl::Status CudaMoeLayer::RandomizeQuantized(uint64_t seed, QuantFormat format, int group_cols,
                                              cudaStream_t stream) {
  const int64_t e = moe_.router.num_experts, inter = moe_.expert_intermediate_size, h = hidden_;
  const QuantMatrixView gate_up{.format = format,
                                .rows = static_cast<int>(e * 2 * inter),
                                .cols = static_cast<int>(h),
                                .group_cols = group_cols};
  const QuantMatrixView down{.format = format,
                             .rows = static_cast<int>(e * h),
                             .cols = static_cast<int>(inter),
                             .group_cols = group_cols};
  for (const QuantMatrixView& stack : {gate_up, down}) {
    if (!QuantMatrixSupported(format, stack.rows, stack.cols, group_cols)) {
      return absl::InvalidArgumentError(fmt::format(
          "random quantized experts: [{}, {}] in groups of {} not supported (multiples of {})",
          stack.rows, stack.cols, group_cols, QuantChunk(format)));
    }
  }
  RS_RETURN_IF_ERROR(AllocateQuantizedExperts(gate_up, down));
  // One expert's random codes and scales (values of about std 0.02), copied to every expert:
  // the timing does not depend on the values, the routing comes from the random router.
  const QuantStacks stacks = StacksOf(gate_up, down);
  char* base = experts_.as<char>();
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 1;
  const auto next = [&state] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  const float scale = format == QuantFormat::kInt4   ? 0.0043f
                      : format == QuantFormat::kInt8 ? 0.00027f
                      : format == QuantFormat::kFp8  ? 1.0e-4f
                                                     : 0.007f;
  const auto random_matrix = [&](int64_t rows, int64_t cols) {
    quant::PackedMatrix m{.format = static_cast<quant::PackedFormat>(format),
                          .rows = rows,
                          .cols = cols,
                          .group_cols = group_cols};
    m.codes.resize(QuantCodeBytes(format, rows, cols));
    for (uint8_t& b : m.codes) b = static_cast<uint8_t>(next());
    MakeRandomCodesUsable(static_cast<quant::PackedFormat>(format), m.codes);
    m.scales.assign(rows * m.groups(), scale);
    if (format == QuantFormat::kInt4 || format == QuantFormat::kInt8) {
      m.zeros.assign(rows * m.groups(), format == QuantFormat::kInt4 ? 8.0f : 128.0f);
    }
    return m;
  };
  const quant::PackedMatrix one_gate_up = random_matrix(2 * inter, h),
                            one_down = random_matrix(h, inter);
  for (int64_t x = 0; x < e; ++x) {
    RS_RETURN_IF_ERROR(
        CopyRows(gate_up, base, base + stacks.gate_up_scales, x * 2 * inter, one_gate_up));
    RS_RETURN_IF_ERROR(
        CopyRows(down, base + stacks.down_codes, base + stacks.down_scales, x * h, one_down));
  }
  return Randomize(seed, stream);
}

}  // namespace ringserve::cuda
