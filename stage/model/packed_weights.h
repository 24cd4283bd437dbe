// A quantized checkpoint's linear weight kept quantized: the matrix its format's rule
// dequantizes (stage/model/quantized_weights.h) re-expressed exactly as codes and per-row group
// scales (quant/packed_matrix.h), the layout the CUDA quantized linear layers hold. The rule is
// not written a second time: the weight is dequantized by the format's one rule and packed
// again with the scales the checkpoint stores, and PackExact checks every value.
//
//   fp8 (block) and compressed-tensors float   -> fp8, scales per row and block column
//   compressed-tensors int 4 / 8 bits          -> int4 / int8, scales per row and group
//   gptq 4 / 8 bits, awq                       -> int4 / int8, scales [group, out] transposed
//   mxfp4 (gpt-oss's stacked experts)         -> fp4, e8m0 scales per row and 32 columns
// Anything else (gptq 2 bits, other compressed-tensors widths, activation order whose groups are
// not contiguous columns, ...) is returned as nullopt: the caller keeps the dequantized matrix.
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "stage/model/quant/packed_matrix.h"
#include "stage/model/quant/quant_config.h"
#include "stage/model/safetensors.h"
#include "stage/model/slice_weights.h"

namespace ringserve {

struct PackedWeight {
  std::optional<quant::PackedMatrix> matrix;  // nullopt: hold the dequantized matrix
  std::string why_not;                        // when nullopt, the reason (for the log)
};

// `spec` (IsQuantizedWeight) packed as above. Errors as ReadWeightFloat's.
absl::StatusOr<PackedWeight> ReadPackedWeight(SafetensorsModel& weights,
                                              const quant::QuantConfig& quant,
                                              const TensorSpec& spec);

// Expert `expert` of gpt-oss's stacked MXFP4 experts `spec` (quant_method mxfp4,
// spec.stacked_experts, shape [E, in, out]) packed as its stored [out, in] rows (gate_up: gate
// and up rows interleaved, as stored). nullopt with the reason when a value is not exactly
// representable (an e8m0 scale of 255, NaN); errors as Mxfp4ExpertTensors'.
absl::StatusOr<PackedWeight> ReadPackedMxfp4Expert(SafetensorsModel& weights,
                                                   const TensorSpec& spec, int64_t expert);

}  // namespace ringserve
