// The CUDA slice's quantized linear layers: per layer, the q/k/v, o, gate/up and down matrices a
// quantized checkpoint stores in a format the kernels hold (stage/model/packed_weights.h),
// uploaded once in the kernels' layout (kernels/cuda/quant_gemv.h) and kept quantized in device
// memory. A matrix that cannot be held so (a part not quantized, a permuted activation order,
// sizes off the kernels' chunk) is not here: the slice keeps it dequantized in bf16 as before.
//
// Linear runs y = x · W^T: the tensor-core kernel that dequantizes in registers for m <=
// kQuantMmaMaxRows (decode and decode batches, quant_mma.h; a single row of 8-bit or fp4 codes
// takes the CUDA-core GEMV of quant_gemv.h, faster there). Above (prefill), FP8 matrices with
// scales per row and 128 columns (block-scaled checkpoints among them) run cuBLASLt's FP8
// block-scaled GEMM on an sm_90 device, the activations quantized per token and 128 columns into
// the scratch buffer (fp8_block_gemm.h); other matrices, devices and shapes are dequantized into
// the bf16 scratch buffer for the slice's GEMM. All are plain launches (capturable in CUDA
// graphs). Not thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/fp8_block_gemm.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/quant_gemv.h"
#include "kernels/cuda/quant_mma.h"
#include "ring/model_config.h"
#include "stage/model/model_slice.h"
#include "stage/model/quant/packed_matrix.h"

namespace ringserve::cuda {

// A packed matrix's scales as the kernels read them (quant_gemv.h): per row and group, {scale,
// zero} pairs for integer formats, the scale alone otherwise.
std::vector<float> DeviceScales(const quant::PackedMatrix& m);

// Random code bytes made fit for random weights (benchmarks): integer codes distributed
// symmetrically about the zero point 8 / 128 (the code 0, which has no mirror, becomes the zero
// point: any mean offset — the earlier rule, 0 -> 1, gave -7/16 of a step — adds one shared
// direction to every token's hidden state, layer after layer, and a MoE router then sends all
// tokens to the same few experts), no e4m3 NaN codes.
void MakeRandomCodesUsable(quant::PackedFormat format, std::span<uint8_t> codes);

enum class LayerLinear { kQkv = 0, kO = 1, kGateUp = 2, kDown = 3 };
inline constexpr int kLayerLinears = 4;

class QuantLinears {
 public:
  // The slice's layers of options.model_dir's checkpoint; empty when it is not quantized. Only
  // attention and dense MLP matrices: a MoE layer's experts are the MoE layer's (dequantized to
  // bf16 at load), and a multi-head latent attention model (DeepSeek) holds nothing here (its
  // every linear weight is dequantized to bf16 at load).
  static absl::StatusOr<QuantLinears> Load(const ModelConfig& config, const SliceOptions& options,
                                           cudaStream_t stream);
  // Every linear layer of the slice quantized from random weights (std 0.02) with `format`,
  // groups of `group_cols` columns (benchmarks).
  static absl::StatusOr<QuantLinears> Random(const ModelConfig& config, const SliceOptions& options,
                                             quant::PackedFormat format, int64_t group_cols,
                                             uint64_t seed, cudaStream_t stream);

  // The quantized matrix of (local layer, which), or null: the slice holds it in bf16.
  const QuantMatrixView* Get(int layer, LayerLinear which) const;
  bool empty() const { return bytes_ == 0; }
  // Device bytes of codes and scales, and of the dequantization scratch buffer.
  int64_t bytes() const { return bytes_; }
  int64_t scratch_bytes() const {
    return static_cast<int64_t>(scratch_.bytes()) + (fp8_ ? kFp8Workspace : 0);
  }

  absl::Status Linear(GemmRunner& gemm, const bf16* x, const QuantMatrixView& w, void* y,
                      OutType out, int m, LaunchStream stream);

  // false (KernelOptions::fp8_gemm_sm90 off): FP8 prefill GEMMs never take the wgmma kernel,
  // only cuBLASLt's block-scaled GEMM where it has one, else dequantize + bf16 GEMM.
  void AllowWgmmaFp8Gemm(bool allow) {
    if (fp8_ != nullptr && !allow) fp8_->DisableWgmma();
  }

 private:
  absl::Status Add(int layer, LayerLinear which, const quant::PackedMatrix& m, cudaStream_t stream);
  absl::Status AllocateScratch();

  absl::Status LinearFp8(GemmRunner& gemm, const bf16* x, const QuantMatrixView& w, bf16* y, int m,
                         LaunchStream stream);

  static constexpr int64_t kFp8Workspace = int64_t{32} << 20;
  struct Held {
    DeviceBuffer memory;
    DeviceBuffer block_scales;  // fp8 with groups of 128: the FP8 GEMM's scale layouts
    QuantMatrixView view;
  };
  std::vector<std::array<std::optional<Held>, kLayerLinears>> layers_;
  DeviceBuffer scratch_;  // bf16, the largest matrix (GEMM path); its bytes in scratch_bytes()
  int64_t bytes_ = 0;
  std::unique_ptr<Fp8BlockGemm> fp8_;  // when some matrix has block scales
};

}  // namespace ringserve::cuda
