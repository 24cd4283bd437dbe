#!/usr/bin/env bash
# On the device machine, from binaries carried by mla_make_carry.sh in $CARRY: writes the
# latent-512 DeepSeek fixtures with transformers (scripts/make_mla_fixtures.py; returned as
# $OUT/fixtures.tar.gz, to unpack into tests/fixtures/models/), runs the MLA kernel tests, the
# MLA layer test, the CUDA-vs-CPU DeepSeek slice test, the DeepSeek GPU golden test on the new
# fixtures and the MoE golden test (a memcheck of the golden test when it fails), then
# mla_decode_bench and mla_slice_bench (DeepSeek-V3 layers 3-6; fewer layers where they do not
# fit). At most 8 files under $OUT.
# Usage: bash .carry/mla/run.sh [mla_slice_bench flags...]
set -uo pipefail
carry=${CARRY:-.carry/mla}
out=${OUT:-/tmp/rs_out}
fixtures=${FIXTURES:-deepseek_v3_moe_nolora,deepseek_v3_latent512,deepseek_v3_moe_latent512,deepseek_v2_moe_latent512}
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/$carry/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
for f in "$carry"/bin/*.xz; do xz -dkf -T4 "$f" && chmod +x "${f%.xz}"; done
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
# Fixtures, in a source root beside the tree's own (the tests read $RINGSERVE_SOURCE_DIR).
src=/tmp/rs_src
mkdir -p $src/tests/fixtures/models /tmp/rs_fx
cp -r tests/fixtures/models/* $src/tests/fixtures/models/
start=$(date +%s)
PYTHONUNBUFFERED=1 timeout 150 /opt/torch/.venv/bin/python "$carry/scripts/make_mla_fixtures.py" \
  --out /tmp/rs_fx --only "$fixtures" >"$out/fixtures.log" 2>&1
echo "== fixtures rc=$? $(($(date +%s) - start)) s"
grep -E "tried=|Error" "$out/fixtures.log" | head -20
(cd /tmp/rs_fx && tar -czf "$out/fixtures.tar.gz" --exclude summary.json .)
cp -r /tmp/rs_fx/* $src/tests/fixtures/models/ 2>/dev/null
export RINGSERVE_SOURCE_DIR=$src
status=0
for t in kernels_cuda_mla_decode_test kernels_cuda_mla_prepare_test stage_cuda_mla_attention_test \
         stage_cuda_mla_slice_test stage_cuda_mla_golden_test stage_cuda_moe_golden_test; do
  start=$(date +%s)
  timeout 120 "$carry/bin/$t" --gtest_brief=1 >>"$out/tests.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && status=1
  echo "== $t rc=$rc $(($(date +%s) - start)) s" | tee -a "$out/summary.txt"
  [ $t = stage_cuda_mla_golden_test ] && golden_rc=$rc
done
grep -E "^\[  (PASSED|FAILED|SKIPPED) |Failure|Expected|Which is|Value of|actual|error" \
  "$out/tests.log" | head -60
if [ "${golden_rc:-0}" -ne 0 ] && command -v compute-sanitizer >/dev/null; then
  timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$carry/bin/stage_cuda_mla_golden_test" --gtest_brief=1 --gtest_filter='*latent512*' \
    >"$out/memcheck.log" 2>&1
  echo "== memcheck rc=$?"
  grep -m 12 -E "Invalid|ERROR SUMMARY|at 0x|by thread" "$out/memcheck.log"
fi
timeout 60 "$carry/bin/mla_decode_bench" --contexts 4096,32768 --streams 1,32 2>&1 |
  tee "$out/mla_decode_bench.log"
timeout 150 "$carry/bin/mla_slice_bench" "$@" 2>&1 | tee "$out/mla_slice_bench.log"
exit $status
