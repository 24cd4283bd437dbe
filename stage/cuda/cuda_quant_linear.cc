#include "stage/cuda/cuda_quant_linear.h"

#include <algorithm>
#include <cstring>

#include "absl/status/status.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "stage/model/packed_weights.h"
#include "stage/model/quantized_weights.h"
#include "stage/model/slice_weights.h"

namespace ringserve::cuda {
namespace {

constexpr int64_t kAlign = 256;

// The checkpoint modules each fused matrix stacks, in row order.
const std::array<std::vector<std::string>, kLayerLinears> kParts = {{
    {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"},
    {"self_attn.o_proj"},
    {"mlp.gate_proj", "mlp.up_proj"},
    {"mlp.down_proj"},
}};

// [rows, cols] of each part of a fused matrix.
std::vector<std::pair<int64_t, int64_t>> PartShapes(const ModelConfig& c, int which) {
  const int64_t h = c.hidden_size, q = int64_t{c.num_heads} * c.head_dim,
                kv = int64_t{c.num_kv_heads} * c.head_dim, inter = c.intermediate_size;
  switch (which) {
    case 0:
      return {{q, h}, {kv, h}, {kv, h}};
    case 1:
      return {{h, q}};
    case 2:
      return {{inter, h}, {inter, h}};
    default:
      return {{h, inter}};
  }
}

// An fp8 matrix's scales per row and 128 columns as [cols / 128, rows] (the row fastest), when its
// groups are 128 columns; else empty.
std::vector<float> RowScalesTransposed(const quant::PackedMatrix& m) {
  if (m.format != quant::PackedFormat::kFp8 || m.group_cols != kFp8Block ||
      m.cols % kFp8Block != 0) {
    return {};
  }
  const int64_t groups = m.groups();
  std::vector<float> out(groups * m.rows);
  for (int64_t r = 0; r < m.rows; ++r) {
    for (int64_t g = 0; g < groups; ++g) out[g * m.rows + r] = m.scales[r * groups + g];
  }
  return out;
}

// An fp8 matrix's scales once per 128x128 block in Fp8BlockScaleStride rows, when its groups are
// 128 columns and every block's rows share their scales; else empty.
std::vector<float> BlockScales(const quant::PackedMatrix& m) {
  if (m.format != quant::PackedFormat::kFp8 || m.group_cols != kFp8Block ||
      m.cols % kFp8Block != 0) {
    return {};
  }
  const int64_t groups = m.groups(), stride = Fp8BlockScaleStride(m.cols);
  const int64_t row_blocks = (m.rows + kFp8Block - 1) / kFp8Block;
  std::vector<float> out(row_blocks * stride, 0.0f);
  for (int64_t rb = 0; rb < row_blocks; ++rb) {
    for (int64_t g = 0; g < groups; ++g) {
      const float s = m.scales[rb * kFp8Block * groups + g];
      for (int64_t r = rb * kFp8Block; r < std::min(m.rows, (rb + 1) * kFp8Block); ++r) {
        if (m.scales[r * groups + g] != s) return {};
      }
      out[rb * stride + g] = s;
    }
  }
  return out;
}

uint64_t SplitMix(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

std::vector<float> DeviceScales(const quant::PackedMatrix& m) {
  if (!quant::IsIntegerFormat(m.format)) return m.scales;
  std::vector<float> scales(2 * m.scales.size());
  for (size_t g = 0; g < m.scales.size(); ++g) {
    scales[2 * g] = m.scales[g];
    scales[2 * g + 1] = m.zeros[g];
  }
  return scales;
}

void MakeRandomCodesUsable(quant::PackedFormat format, std::span<uint8_t> codes) {
  for (uint8_t& b : codes) {
    switch (format) {
      case quant::PackedFormat::kFp8:
        if ((b & 0x7f) == 0x7f) b ^= 1;  // e4m3 NaN
        break;
      case quant::PackedFormat::kInt8:
        if (b == 0) b = 128;
        break;
      case quant::PackedFormat::kInt4:
        if ((b & 0x0f) == 0) b |= 0x08;
        if ((b & 0xf0) == 0) b |= 0x80;
        break;
      case quant::PackedFormat::kFp4:
        break;
    }
  }
}

absl::StatusOr<QuantLinears> QuantLinears::Load(const ModelConfig& config,
                                                const SliceOptions& options, cudaStream_t stream) {
  QuantLinears out;
  RS_ASSIGN_OR_RETURN(const quant::QuantConfig q, quant::LoadQuantConfig(options.model_dir));
  if (q.method == quant::QuantMethod::kNone) return out;
  if (config.mla) {
    // Latent attention and DeepSeek's dense MLPs run in bf16: the loader dequantizes them.
    RS_LOG_INFO(
        "quantized linear layers: all dequantized to bf16 at load ({} runs multi-head "
        "latent attention in bf16 only)",
        ArchitectureName(config.architecture));
    return out;
  }
  RS_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsModel> weights,
                      SafetensorsModel::Open(options.model_dir));
  out.layers_.resize(options.layers.size());
  int held = 0, kept_bf16 = 0;
  for (int i = 0; i < options.layers.size(); ++i) {
    const int layer = options.layers.first + i;
    const std::vector<TensorSpec> specs = LayerTensorSpecs(config, layer);
    for (int which = 0; which < kLayerLinears; ++which) {
      // A MoE layer has no dense MLP: its experts live in the MoE layer (cuda_moe_layer.h).
      if (config.moe.IsMoeLayer(layer) && which >= static_cast<int>(LayerLinear::kGateUp)) {
        continue;
      }
      std::vector<quant::PackedMatrix> parts;
      std::string why_not;
      for (const std::string& module : kParts[which]) {
        const std::string name = fmt::format("model.layers.{}.{}.weight", layer, module);
        const auto spec = std::find_if(specs.begin(), specs.end(),
                                       [&](const TensorSpec& s) { return s.name == name; });
        if (spec == specs.end()) return absl::InternalError(fmt::format("no tensor {}", name));
        RS_ASSIGN_OR_RETURN(PackedWeight p, ReadPackedWeight(*weights, q, *spec));
        if (!p.matrix) {
          why_not = fmt::format("{}: {}", name, p.why_not);
          break;
        }
        parts.push_back(*std::move(p.matrix));
      }
      absl::StatusOr<quant::PackedMatrix> stacked =
          why_not.empty() ? quant::StackRows(parts) : absl::StatusOr<quant::PackedMatrix>();
      if (why_not.empty() && !stacked.ok()) why_not = std::string(stacked.status().message());
      if (why_not.empty() &&
          !QuantMatrixSupported(static_cast<QuantFormat>(stacked->format), stacked->rows,
                                stacked->cols, stacked->group_cols)) {
        why_not =
            fmt::format("{} columns in groups of {} are not multiples of {}", stacked->cols,
                        stacked->group_cols, QuantChunk(static_cast<QuantFormat>(stacked->format)));
      }
      if (!why_not.empty()) {
        RS_LOG_INFO("layer {} {}: held dequantized in bf16 ({})", layer, kParts[which][0], why_not);
        ++kept_bf16;
        continue;
      }
      RS_RETURN_IF_ERROR(out.Add(i, static_cast<LayerLinear>(which), *stacked, stream));
      ++held;
    }
  }
  RS_LOG_INFO("quantized linear layers: {} held quantized ({} MiB), {} in bf16", held,
              out.bytes_ >> 20, kept_bf16);
  if (held > 0) RS_RETURN_IF_ERROR(out.AllocateScratch());
  return out;
}

absl::StatusOr<QuantLinears> QuantLinears::Random(const ModelConfig& config,
                                                  const SliceOptions& options,
                                                  quant::PackedFormat format, int64_t group_cols,
                                                  uint64_t seed, cudaStream_t stream) {
  QuantLinears out;
  out.layers_.resize(options.layers.size());
  // As Load: latent attention and DeepSeek's dense MLPs run in bf16.
  if (config.mla) return out;
  // Random codes (MakeRandomCodesUsable), scales giving weights of std ~0.02.
  const float scale = format == quant::PackedFormat::kInt4   ? 0.02f / 4.6f
                      : format == quant::PackedFormat::kInt8 ? 0.02f / 74.0f
                      : format == quant::PackedFormat::kFp8  ? 2e-4f
                                                             : 1.0f / 256;
  uint64_t state = seed;
  for (int i = 0; i < options.layers.size(); ++i) {
    for (int which = 0; which < kLayerLinears; ++which) {
      // A MoE layer's experts are the MoE layer's (CudaMoeLayer::RandomizeQuantized).
      if (config.moe.IsMoeLayer(options.layers.first + i) &&
          which >= static_cast<int>(LayerLinear::kGateUp)) {
        continue;
      }
      int64_t rows = 0, cols = 0;
      for (const auto& [r, c] : PartShapes(config, which)) {
        rows += r;
        cols = c;
      }
      const int64_t g = std::min(group_cols, cols);
      quant::PackedMatrix m{.format = format, .rows = rows, .cols = cols, .group_cols = g};
      m.codes.resize(rows * cols * quant::PackedBits(format) / 8);
      for (size_t b = 0; b < m.codes.size(); b += 8) {
        const uint64_t word = SplitMix(state);
        std::memcpy(m.codes.data() + b, &word, std::min<size_t>(8, m.codes.size() - b));
      }
      MakeRandomCodesUsable(format, m.codes);
      m.scales.assign(rows * m.groups(), scale);
      if (quant::IsIntegerFormat(format)) {
        m.zeros.assign(rows * m.groups(), format == quant::PackedFormat::kInt4 ? 8.0f : 128.0f);
      }
      if (!QuantMatrixSupported(static_cast<QuantFormat>(format), rows, cols, g)) {
        return absl::InvalidArgumentError(
            fmt::format("random {} weights: [{}, {}] in groups of {} not supported",
                        quant::PackedFormatName(format), rows, cols, g));
      }
      RS_RETURN_IF_ERROR(out.Add(i, static_cast<LayerLinear>(which), m, stream));
    }
  }
  RS_RETURN_IF_ERROR(out.AllocateScratch());
  return out;
}

absl::Status QuantLinears::Add(int layer, LayerLinear which, const quant::PackedMatrix& m,
                               cudaStream_t stream) {
  const QuantFormat format = static_cast<QuantFormat>(m.format);
  const int64_t code_bytes = QuantCodeBytes(format, m.rows, m.cols);
  const int64_t scale_bytes = QuantScaleBytes(format, m.rows, m.cols, m.group_cols);
  const int64_t scale_at = (code_bytes + kAlign - 1) / kAlign * kAlign;
  const std::vector<float> scales = DeviceScales(m);
  Held held;
  RS_RETURN_IF_ERROR(held.memory.Allocate(scale_at + scale_bytes));
  RS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(held.memory.get(), m.codes.data(), code_bytes,
                                          cudaMemcpyHostToDevice, stream));
  RS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(held.memory.as<char>() + scale_at, scales.data(),
                                          scale_bytes, cudaMemcpyHostToDevice, stream));
  // FP8 GEMM scales: per row transposed, then per block when uniform.
  std::vector<float> fp8_scales = RowScalesTransposed(m);
  const size_t row_floats = fp8_scales.size();
  const std::vector<float> blocks = row_floats > 0 ? BlockScales(m) : std::vector<float>();
  fp8_scales.insert(fp8_scales.end(), blocks.begin(), blocks.end());
  if (!fp8_scales.empty()) {
    RS_RETURN_IF_ERROR(held.block_scales.Allocate(fp8_scales.size() * sizeof(float)));
    RS_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(held.block_scales.get(), fp8_scales.data(),
                                            fp8_scales.size() * sizeof(float),
                                            cudaMemcpyHostToDevice, stream));
  }
  RS_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));  // the host vectors go away
  held.view = {
      .format = format,
      .rows = static_cast<int>(m.rows),
      .cols = static_cast<int>(m.cols),
      .group_cols = static_cast<int>(m.group_cols),
      .codes = held.memory.as<uint8_t>(),
      .scales = reinterpret_cast<const float*>(held.memory.as<char>() + scale_at),
      .row_scales_t = row_floats == 0 ? nullptr : held.block_scales.as<float>(),
      .block_scales = blocks.empty() ? nullptr : held.block_scales.as<float>() + row_floats};
  bytes_ += static_cast<int64_t>(held.memory.bytes() + held.block_scales.bytes());
  layers_[layer][static_cast<int>(which)] = std::move(held);
  return absl::OkStatus();
}

absl::Status QuantLinears::AllocateScratch() {
  int64_t elems = 0;
  for (const auto& layer : layers_) {
    for (const auto& held : layer) {
      if (held) elems = std::max(elems, int64_t{held->view.rows} * held->view.cols);
    }
  }
  bool block_scaled = false;
  for (const auto& layer : layers_) {
    for (const auto& held : layer) block_scaled |= held && held->view.row_scales_t != nullptr;
  }
  if (block_scaled) {
    absl::StatusOr<std::unique_ptr<Fp8BlockGemm>> fp8 = Fp8BlockGemm::Create(kFp8Workspace);
    if (fp8.ok()) {
      fp8_ = *std::move(fp8);
    } else {
      RS_LOG_WARN("FP8 block-scaled GEMM unavailable ({}): prefill dequantizes",
                  std::string(fp8.status().message()));
    }
  }
  return scratch_.Allocate(elems * 2);
}

const QuantMatrixView* QuantLinears::Get(int layer, LayerLinear which) const {
  if (layer < 0 || layer >= static_cast<int>(layers_.size())) return nullptr;
  const auto& held = layers_[layer][static_cast<int>(which)];
  return held ? &held->view : nullptr;
}

absl::Status QuantLinears::Linear(GemmRunner& gemm, const bf16* x, const QuantMatrixView& w,
                                  void* y, OutType out, int m, LaunchStream stream) {
  if (m <= kQuantMmaMaxRows && out == OutType::kBF16) {
    // One row of 8-bit or fp4 codes: the CUDA-core GEMV streamed them faster on an H100 (one
    // layer 96.6 against 122.3 us for fp8; bench/cuda/NOTES.md); int4 and every batch take the
    // tensor-core kernel.
    if (m == 1 && w.format != QuantFormat::kInt4) {
      return LaunchQuantGemv(x, w, static_cast<bf16*>(y), m, stream);
    }
    return LaunchQuantMma(x, w, static_cast<bf16*>(y), m, stream);
  }
  if (out == OutType::kBF16 && w.row_scales_t != nullptr && fp8_ != nullptr) {
    return LinearFp8(gemm, x, w, static_cast<bf16*>(y), m, stream);
  }
  RS_RETURN_IF_ERROR(LaunchQuantDequantize(w, scratch_.as<bf16>(), stream));
  return gemm.Linear(x, scratch_.as<bf16>(), y, out, m, w.rows, w.cols, stream);
}

absl::Status QuantLinears::LinearFp8(GemmRunner& gemm, const bf16* x, const QuantMatrixView& w,
                                     bf16* y, int m, LaunchStream stream) {
  const int64_t k = w.cols, n = w.rows;
  // Pieces of rows whose codes and scales fit the scratch buffer, multiples of 4 (cuBLASLt's
  // scale vectors); the last 1-3 rows take the tensor-core kernel.
  const int64_t code_bytes_per_row = (k + kAlign - 1) / kAlign * kAlign;
  const int64_t per_row = k + (k / kFp8Block) * 4 + 8;
  const int piece = static_cast<int>(
      std::min<int64_t>(m, (static_cast<int64_t>(scratch_.bytes()) - kAlign) / per_row) / 4 * 4);
  if (piece < 4) {
    RS_RETURN_IF_ERROR(LaunchQuantDequantize(w, scratch_.as<bf16>(), stream));
    return gemm.Linear(x, scratch_.as<bf16>(), y, OutType::kBF16, m, static_cast<int>(n),
                       static_cast<int>(k), stream);
  }
  int m0 = 0;
  while (m - m0 >= 4) {
    const int rows = std::min(piece, (m - m0) / 4 * 4);
    const bf16* xs = x + m0 * k;
    bf16* ys = y + m0 * n;
    if (!fp8_->Supported(rows, static_cast<int>(n), static_cast<int>(k),
                         w.block_scales != nullptr)) {
      RS_RETURN_IF_ERROR(LaunchQuantDequantize(w, scratch_.as<bf16>(), stream));
      RS_RETURN_IF_ERROR(gemm.Linear(xs, scratch_.as<bf16>(), ys, OutType::kBF16, m - m0,
                                     static_cast<int>(n), static_cast<int>(k), stream));
      return absl::OkStatus();
    }
    uint8_t* codes = scratch_.as<uint8_t>();
    float* scales = reinterpret_cast<float*>(scratch_.as<char>() + rows * code_bytes_per_row);
    RS_RETURN_IF_ERROR(
        LaunchQuantizeFp8Groups(xs, codes, scales, rows, static_cast<int>(k), stream));
    RS_RETURN_IF_ERROR(fp8_->Linear(codes, scales, w.codes, w.row_scales_t, w.block_scales, ys,
                                    rows, static_cast<int>(n), static_cast<int>(k), stream));
    m0 += rows;
  }
  if (m0 < m) RS_RETURN_IF_ERROR(LaunchQuantMma(x + m0 * k, w, y + m0 * n, m - m0, stream));
  return absl::OkStatus();
}

}  // namespace ringserve::cuda
