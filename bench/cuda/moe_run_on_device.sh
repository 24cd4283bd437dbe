#!/usr/bin/env bash
# Runs the CUDA MoE tests, moe_bench and the transformers comparison on the device machine from
# binaries built elsewhere (stripped, xz-compressed) in $CARRY/bin and their non-system libraries
# in $CARRY/lib. Logs go to $OUT (or /tmp/rs_out).
#   bench/cuda/moe_run_on_device.sh [tests] [bench] [transformers]   (default: all three)
# bench: moe_bench's 32 and 64 stream decode rows (MOE_BENCH_FLAGS adds flags, e.g. the 1-stream
# and prefill rows); transformers: transformers_moe_decode.py on the same shape in the same call
# (TRANSFORMERS_FLAGS adds flags), so the two tok/s figures compare like for like.
set -uo pipefail
carry=${CARRY:-.carry/h-moe}
out=${OUT:-/tmp/rs_out}
parts=${*:-tests bench transformers}
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
if [[ " $parts " == *" tests "* ]]; then
  run kernels_cuda_attention_test 40
  run kernels_cuda_ops_test 40
  run stage_cuda_moe_layer_test 40
  run stage_cuda_attention_variants_test 90
  # The comparisons above the plain 3e-2 (allowed up to 2x the reference's own sensitivity).
  grep -E "^variant-diff" "$out/stage_cuda_attention_variants_test.log" |
    awk '{split($NF, a, "="); if (a[2] + 0 > 0.03) print}' | head -30
  run stage_cuda_moe_golden_test 60
  run stage_cuda_model_slice_test 150 --gtest_filter='Moe/*:CudaMoe*:CudaGlm*:Fixtures/*'
fi
if [[ " $parts " == *" bench "* ]]; then
  start=$(date +%s)
  timeout 150 "$carry/bin/moe_bench" --streams 32,64 --prefill_tokens 0 ${MOE_BENCH_FLAGS:-} 2>&1 |
    grep -v "^\[" | tee "$out/moe_bench.log"
  echo "== moe_bench rc=${PIPESTATUS[0]} $(($(date +%s) - start)) s"
fi
if [[ " $parts " == *" transformers "* ]]; then
  start=$(date +%s)
  PYTHONUNBUFFERED=1 timeout 200 /opt/torch/.venv/bin/python3 "$carry/transformers_moe_decode.py" \
    ${TRANSFORMERS_FLAGS:-} 2>&1 | grep -v Warning | tee "$out/transformers.log"
  echo "== transformers rc=${PIPESTATUS[0]} $(($(date +%s) - start)) s"
fi
