#!/usr/bin/env bash
# Runs the CUDA tests and the stage benchmark on the device machine from binaries built
# elsewhere and carried in .carry/cuda/{bin,lib}. Logs go to $OUT (or /tmp/rs_out); the
# benchmark table is printed last. Usage: bench/cuda/run_on_device.sh [stage_bench flags...]
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/rs_out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/.carry/cuda/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${LD_LIBRARY_PATH:-}"
export RINGSERVE_SOURCE_DIR="$PWD"
bin=.carry/cuda/bin
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used --format=csv \
  | tee "$out/gpu.txt"
status=0
for t in kernels_cuda_ops_test kernels_cuda_attention_test stage_cuda_model_slice_test; do
  [ -x "$bin/$t" ] || continue
  start=$(date +%s%N)
  "$bin/$t" --gtest_brief=1 >"$out/$t.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && status=1
  printf '%-32s rc=%d  %d ms\n' "$t" $rc $((($(date +%s%N) - start) / 1000000)) | tee -a "$out/tests.txt"
  [ $rc -ne 0 ] && grep -E "Failure|Expected|Which is|error|seed|FAILED|Value of|actual" "$out/$t.log" | head -40
done
# memcheck only when a test failed (or SANITIZE=1): it is slow.
if { [ "${SANITIZE:-0}" = 1 ] || [ $status -ne 0 ]; } && command -v compute-sanitizer >/dev/null; then
  for t in kernels_cuda_attention_test stage_cuda_model_slice_test; do
    compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/$t" --gtest_brief=1 \
      --gtest_filter='*Decode*:*Prefill*:*llama*' >"$out/$t.memcheck.log" 2>&1
    echo "memcheck $t rc=$?" | tee -a "$out/tests.txt"
    grep -m 10 -E "Invalid|ERROR SUMMARY|at 0x" "$out/$t.memcheck.log"
  done
fi
if [ -x "$bin/stage_bench" ]; then
  "$bin/stage_bench" "$@" 2>&1 | tee "$out/bench.log" | grep -v "^\[" | tail -60
  rc=${PIPESTATUS[0]}
  if [ $rc -ne 0 ]; then
    status=1
    echo "stage_bench rc=$rc; again without CUDA graphs" | tee -a "$out/tests.txt"
    "$bin/stage_bench" --nographs --quick "$@" 2>&1 | tee "$out/bench_nographs.log" | tail -30
  fi
fi
cat "$out/tests.txt"
exit $status
