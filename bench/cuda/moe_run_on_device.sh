#!/usr/bin/env bash
# Runs the CUDA MoE tests and moe_bench on the device machine from binaries built elsewhere
# (stripped, xz-compressed) in $CARRY/bin and their non-system libraries in $CARRY/lib. Logs go to
# $OUT (or /tmp/rs_out). Usage: bench/cuda/moe_run_on_device.sh [moe_bench flags...]
set -uo pipefail
carry=${CARRY:-.carry/h-moe}
out=${OUT:-/tmp/rs_out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/$carry/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export RINGSERVE_SOURCE_DIR="$PWD"
for f in "$carry"/bin/*.xz; do xz -dkf -T4 "$f" && chmod +x "${f%.xz}"; done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
run() {  # name timeout_s [args...]
  local name=$1 limit=$2
  shift 2
  local start=$(date +%s)
  timeout "$limit" "$carry/bin/$name" --gtest_brief=1 "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "== $name rc=$rc $(($(date +%s) - start)) s"
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|Expected|Which is|Value of|actual|seed [0-9]|error" \
    "$out/$name.log" | head -${LINES_PER_TEST:-40}
}
run stage_cuda_moe_layer_test 40
run stage_cuda_moe_golden_test 60
run stage_cuda_model_slice_test 100 --gtest_filter='Moe/*:CudaMoe*:Fixtures/*/0'
run kernels_cuda_attention_test 40
run kernels_cuda_ops_test 40
start=$(date +%s)
timeout 120 "$carry/bin/moe_bench" "$@" 2>&1 | grep -v "^\[" | tee "$out/moe_bench.log"
echo "== moe_bench rc=${PIPESTATUS[0]} $(($(date +%s) - start)) s"
# A/B: 32 and 64 streams through the tensor-core grouped GEMM instead of the grouped GEMV.
RINGSERVE_MOE_GEMV_MAX_TOKENS=0 timeout 60 "$carry/bin/moe_bench" --streams 32,64 \
  --prefill_tokens 0 2>&1 | grep -v "^\[" | grep decode | sed 's/^/[gemm] /' | tee -a "$out/moe_bench.log"
