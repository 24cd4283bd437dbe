// Reading a slice's weights from a quantized checkpoint: each linear weight that config.json's
// quantization_config says is quantized is read from the tensors its format stores, as the hub
// stores them, and dequantized at load by that format's one rule (stage/model/quant/). Shared by
// the CPU slice (fp32 weights) and the CUDA weight loader (which converts the result to bf16).
//
// Tensors read per linear module M ("model.layers.3.mlp.down_proj"), [out, in]:
//   fp8                 M.weight F8_E4M3 [out, in], M.weight_scale_inv [ceil(out/br), ceil(in/bc)]
//   compressed-tensors  pack-quantized: M.weight_packed I32, M.weight_scale, M.weight_shape
//                       (checked when present), M.weight_zero_point (asymmetric), M.weight_g_idx
//                       (when present); int-quantized: M.weight I8, M.weight_scale,
//                       [M.weight_zero_point]; float-quantized: M.weight F8_E4M3, M.weight_scale
//   gptq                M.qweight, M.qzeros, M.scales, M.g_idx (required with desc_act)
//   awq                 M.qweight, M.qzeros, M.scales
//   mxfp4               gpt-oss's stacked experts only (TensorSpec::stacked_experts, shape
//                       [E, in, out]: gate_up_proj [E, hidden, 2 * inter] with gate and up
//                       columns interleaved, down_proj [E, inter, hidden]): M_blocks U8
//                       [E, out, in / 32, 16] and M_scales U8 [E, out, in / 32], dequantized to
//                       [E, out, in] (quant/mxfp4.h, an expert at a time) and transposed to
//                       [E, in, out], as transformers' convert_moe_packed_tensors does (the
//                       host holds the result and one expert's values). Other methods refuse
//                       stacked experts unless modules_to_not_convert leaves them in bf16.
// MoE experts are linear modules like any other: mlp.experts.E.{gate,up,down}_proj (Mixtral
// block_sparse_moe.experts.E.w1/w2/w3) and the shared experts follow the same rule; routers
// (mlp.gate, e_score_correction_bias, shared_expert_gate) are always read as floats.
// Modules the config leaves unquantized (modules_to_not_convert, ignore, lm_head) are read from
// M.weight in F32/F16/BF16. Thread-compatible (SafetensorsModel is not thread-safe).
#pragma once

#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "stage/model/quant/fp8_block.h"
#include "stage/model/quant/quant_config.h"
#include "stage/model/quant/quant_tensor.h"
#include "stage/model/safetensors.h"
#include "stage/model/slice_weights.h"

namespace ringserve {

// Whether `spec` is a linear weight (or gpt-oss stacked experts) that `quant` stores quantized.
bool IsQuantizedWeight(const quant::QuantConfig& quant, const TensorSpec& spec);

// Whether `spec`, a linear weight quantized under an FP8 configuration, is stored in a float
// dtype in the file (a writer that kept it in full precision without listing it, e.g. an
// lm_head): it is then read as stored.
bool StoredUnquantized(SafetensorsModel& weights, const quant::QuantConfig& quant,
                       const TensorSpec& spec);

// `spec` as fp32, row-major, spec.shape: dequantized when IsQuantizedWeight (and not
// StoredUnquantized), else converted from
// F32/F16/BF16. NotFound naming the missing tensor; InvalidArgument naming the tensor and the
// format for wrong dtypes or shapes.
absl::StatusOr<std::vector<float>> ReadWeightFloat(SafetensorsModel& weights,
                                                   const quant::QuantConfig& quant,
                                                   const TensorSpec& spec);

// The scale grid of a compressed-tensors scheme for an [out, in] weight: per tensor one block,
// per channel [1, in], per group [1, group_size], per block its blocks.
quant::Fp8BlockGrid GridOf(const quant::CompressedScheme& scheme, int64_t out, int64_t in);

// An MXFP4 tensor as gpt-oss stores its experts: `name`_blocks U8 [..., G, 16] and `name`_scales U8
// [..., G] ("model.layers.0.mlp.experts.down_proj" -> [E, rows, G * 32] fp32, the stored rows
// first; quant/mxfp4.h). `expected_shape` is the result's shape. NotFound / InvalidArgument
// naming the tensor.
absl::StatusOr<std::vector<float>> ReadMxfp4Float(SafetensorsModel& weights,
                                                  const std::string& name,
                                                  std::span<const int64_t> expected_shape);

// Expert `expert` of gpt-oss's stacked MXFP4 tensor `spec` (spec.shape [E, in, out], the bf16
// checkpoint's): its stored blocks [out, in / 32, 16] and scales [out, in / 32], viewing the
// checkpoint's bytes (valid while `weights` is). InvalidArgument naming the tensor for shapes or
// dtypes that do not match, NotFound for a missing tensor.
struct Mxfp4Expert {
  quant::QTensor blocks;
  quant::QTensor scales;
};
absl::StatusOr<Mxfp4Expert> Mxfp4ExpertTensors(SafetensorsModel& weights, const TensorSpec& spec,
                                               int64_t expert);

}  // namespace ringserve
