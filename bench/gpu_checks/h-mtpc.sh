#!/usr/bin/env bash
# GPU checks of the CUDA MTP layer and drafter (branch h-mtpc). Run from the repo root on the GPU
# machine with ./build built here; results under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/h-mtpc-out}
mkdir -p "$OUT"
export RINGSERVE_SOURCE_DIR=$PWD
# The new test, then the existing CUDA DeepSeek tests the slice changes touch.
ctest --test-dir build -R 'stage_cuda_mtp_test' --output-on-failure -V >"$OUT/cuda_mtp_test.log" 2>&1
echo "stage_cuda_mtp_test rc=$?" | tee "$OUT/summary.txt"
ctest --test-dir build -R 'stage_cuda_(mla_slice|mla_golden|moe_golden|model_slice)_test' \
  --output-on-failure >"$OUT/cuda_slice_tests.log" 2>&1
echo "cuda slice tests rc=$?" | tee -a "$OUT/summary.txt"
