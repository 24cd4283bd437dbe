// Test helper: a quantized copy of a float checkpoint in the hub's layouts, written by C++
// reference quantizers, beside the DEQUANTIZED float checkpoint: the same model with every
// quantized weight replaced by exactly the values its format's rule gives back. A loader that
// reads the quantized copy must then behave exactly as it does on the float one.
//
// Quantized (unless listed in keep_float): every rank-2 tensor "model.layers.*" whose name ends
// with "_proj.weight" or "_proj_with_mqa.weight" or is a Mixtral expert ("w1/w2/w3.weight") --
// attention, dense MLPs, experts, shared experts and DeepSeek's MTP layer -- except the MTP's
// eh_proj; with kMxfp4 only gpt-oss's stacked experts (mlp.experts.gate_up_proj / down_proj).
// Routers, norms, biases, embeddings and the lm_head stay float. Layouts (as
// stage/model/quantized_weights.h reads them):
//   kFp8Block / kFp8BlockUe8m0  quant_method fp8, weight_block_size [block, block]: weight
//       F8_E4M3, weight_scale_inv F32 [ceil(out / block), ceil(in / block)] (partial edge blocks;
//       ue8m0: scales rounded up to powers of two), scale = block absmax / 448
//   kCompressedInt4  compressed-tensors pack-quantized, int 4 bits symmetric, group `block`:
//       weight_packed I32 [out, ceil(in / 8)], weight_scale F32 [out, ceil(in / block)],
//       weight_shape I64 [2]; q = clamp(round(w / s), -8, 7), s = group absmax / 7
//   kCompressedFp8   compressed-tensors float-quantized, e4m3 per channel: weight F8_E4M3,
//       weight_scale F32 [out, 1]
//   kGptq4  gptq 4 bits, group `block`, sym, checkpoint_format gptq (zeros stored minus 1):
//       qweight I32 [in / 8, out], qzeros I32 [G, out / 8], scales F16 [G, out]
//   kAwq4   awq gemm 4 bits, group `block`, zero_point (min/max): qweight I32 [in, out / 8],
//       qzeros I32 [G, out / 8] (AutoAWQ's column order), scales F16 [G, out]
//   kMxfp4  gpt-oss experts [E, in, out] stored transposed: `name`_blocks U8 [E, out, in / 32, 16],
//       `name`_scales U8 [E, out, in / 32] (e8m0, scale = 2^ceil(log2(absmax / 6)))
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ringserve::testing {

enum class CopyFormat {
  kFp8Block,
  kFp8BlockUe8m0,
  kCompressedInt4,
  kCompressedFp8,
  kGptq4,
  kAwq4,
  kMxfp4,
};

struct CopyOptions {
  CopyFormat format = CopyFormat::kFp8Block;
  int block = 16;  // the fp8 block or the integer group size
  // Modules left in float: a module (name without ".weight") containing one of these is not
  // quantized, and the list is the format's exclusion: modules_to_not_convert (fp8, awq, mxfp4;
  // substrings there too) or ignore (compressed-tensors: give whole module names). Not for gptq.
  std::vector<std::string> keep_float = {};
};

struct QuantizedCopy {
  // Each tensor written quantized: its float checkpoint name -> the dequantized values, in the
  // float tensor's shape (the float copy holds exactly these).
  std::map<std::string, std::vector<float>> dequantized;
};

// Reads the float checkpoint `src_dir` (config.json and its safetensors, no quantization_config)
// and writes `quant_dir` and `float_dir` (created; config.json, one model.safetensors and the
// source's generation_config.json each).
absl::StatusOr<QuantizedCopy> WriteQuantizedCopy(const std::string& src_dir,
                                                 const CopyOptions& options,
                                                 const std::string& quant_dir,
                                                 const std::string& float_dir);

// A gpt-oss checkpoint whose experts MXFP4 can store: the config.json of `gpt_oss_fixture` with
// intermediate_size 32 (the fixture's 12 is no multiple of MXFP4's 32-value blocks) and random
// float32 weights (std 0.15; norms 1 + that), written to `dir`.
absl::Status WriteMxfp4ReadyGptOss(const std::string& gpt_oss_fixture, const std::string& dir);

}  // namespace ringserve::testing
