#!/usr/bin/env bash
# GPU checks of branch h-qmoe3 (quantized MoE checkpoints): runs from the repo root on the GPU
# machine with the binaries in ./build as built on the CPU machine; logs to $OUT.
#   stage_cuda_quantized_moe_test  CUDA slice vs CPU slice on C++-written quantized copies of the
#                                  MoE fixtures (fp8 block, ue8m0, DeepSeek fp8 128x128, int4
#                                  compressed-tensors, AWQ, gpt-oss MXFP4): experts in bf16
#   stage_cuda_moe_golden_test     the float MoE fixtures still match transformers
#   stage_cuda_model_slice_test    the dense quantized CUDA paths (QuantLinears) still hold
set -uo pipefail
out=${OUT:-/tmp/rs_out}
mkdir -p "$out"
export RINGSERVE_SOURCE_DIR="$PWD"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
for t in stage/cuda/stage_cuda_quantized_moe_test stage/cuda/stage_cuda_moe_golden_test \
         stage/cuda/stage_cuda_model_slice_test stage/cuda/stage_cuda_mla_slice_test; do
  name=$(basename "$t")
  start=$(date +%s)
  timeout 280 "./build/$t" --gtest_brief=1 >"$out/$name.log" 2>&1
  rc=$?
  echo "== $name rc=$rc $(($(date +%s) - start)) s"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|Expected|Which is|Value of|dequantized|error" \
    "$out/$name.log" | head -40
done
