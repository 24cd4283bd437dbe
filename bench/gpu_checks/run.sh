#!/usr/bin/env bash
# One combined GPU check on the device machine, from the carry of bench/gpu_checks/make_carry.sh:
#   1. in the background: the latent-512 DeepSeek fixtures with transformers
#      (scripts/make_mla_fixtures.py, written into tests/fixtures/models/ here and returned as
#      $OUT/fixtures.tar.gz) and, unless SPEC=0, a larger speculation target trained with
#      scripts/train_small_model.py (bench/spec/device_run.sh's recipe);
#   2. every carried `gpu` test, PARALLEL at a time (the DeepSeek golden test after the fixtures);
#   3. the benchmarks of the file BENCHES (default bench/gpu_checks/benches.txt; one line each,
#      "name|time limit in s|command"), one at a time;
#   4. unless SPEC=0, bench/spec/device_run.sh on the trained target.
# Returns at most 8 files: summary.txt, tests.tar.gz (each test's log), fixtures.tar.gz,
# benches.log, spec.tar.gz.
# Env: TESTS (a regex choosing the tests), PARALLEL (4), TEST_TIMEOUT (150 s a test),
# TESTS_TIMEOUT (200 s for all), FIXTURES (make_mla_fixtures.py --only list), SPEC (0: none).
set -uo pipefail
out=${OUT:-/tmp/rs_gpu_out}
carry=${CARRY:-.carry/gpu}
mkdir -p "$out" /tmp/rs
tar -xJf "$carry/pack.tar.xz" -C /tmp/rs || exit 1
pack=/tmp/rs/pack
export LD_LIBRARY_PATH="$pack/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export RINGSERVE_SOURCE_DIR=$PWD PATH="$pack/bin:$PATH"
# The ring tests start build/stage/stage and build/coordinator/coordinator under this directory.
mkdir -p /tmp/rs/bindir/stage /tmp/rs/bindir/coordinator
ln -sf "$pack/bin/stage" /tmp/rs/bindir/stage/stage
ln -sf "$pack/bin/coordinator" /tmp/rs/bindir/coordinator/coordinator
export RINGSERVE_BINARY_DIR=/tmp/rs/bindir
py=${PYTHON:-/opt/torch/.venv/bin/python}
summary=$out/summary.txt
t0=$(date +%s)
stamp() { echo "[$(($(date +%s) - t0)) s] $*" | tee -a "$summary"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$summary"

fixtures=${FIXTURES:-deepseek_v3_moe_nolora,deepseek_v3_latent512,deepseek_v3_moe_latent512,deepseek_v2_moe_latent512}
(PYTHONUNBUFFERED=1 timeout 200 "$py" "$pack/make_mla_fixtures.py" --out /tmp/rs_fx \
   --only "$fixtures" >/tmp/rs/fixtures.log 2>&1
 echo "rc=$?" >>/tmp/rs/fixtures.log
 (cd /tmp/rs_fx && tar -czf "$out/fixtures.tar.gz" --exclude summary.json .)
 cp -r /tmp/rs_fx/* tests/fixtures/models/) &
fixtures_pid=$!
if [ "${SPEC:-1}" != 0 ]; then
  (timeout 150 "$py" "$pack/train_small_model.py" --corpus "$pack/corpus" --out /tmp/rs_spec_trained \
     --target-shape "${TARGET_SHAPE:-24x768}" --tokenizer models/ringserve-tiny/tokenizer.json \
     --max-train-seconds "${TRAIN_S:-60}" --steps "${STEPS:-1000}" --eval-every 100000 \
     >/tmp/rs/train.log 2>&1; echo "rc=$?" >>/tmp/rs/train.log) &
  train_pid=$!
fi

mkdir -p /tmp/rs/tests
run_test() {  # name
  local start rc
  start=$(date +%s)
  timeout "${TEST_TIMEOUT:-150}" "$pack/bin/$1" --gtest_brief=1 >"/tmp/rs/tests/$1.log" 2>&1
  rc=$?
  echo "$1 rc=$rc $(($(date +%s) - start)) s $(grep -E '^\[  (PASSED|FAILED) ' "/tmp/rs/tests/$1.log" | tr '\n' ' ')"
}
export -f run_test
export pack
stamp "tests start"
ls "$pack/bin" | grep -E '_test$' | grep -E "${TESTS:-.}" | grep -v stage_cuda_mla_golden_test |
  timeout "${TESTS_TIMEOUT:-200}" xargs -P "${PARALLEL:-4}" -I{} bash -c 'run_test {}' |
  tee -a "$summary"
wait $fixtures_pid
stamp "fixtures: $(tail -1 /tmp/rs/fixtures.log); $(grep -cE 'tried=' /tmp/rs/fixtures.log) written"
run_test stage_cuda_mla_golden_test | tee -a "$summary"
grep -hE "^\[  FAILED  \]|Failure$" /tmp/rs/tests/*.log | sort | uniq | head -60 >>"$summary"
(cd /tmp/rs && tar -czf "$out/tests.tar.gz" tests fixtures.log)
[ -n "${train_pid:-}" ] && wait "$train_pid"

stamp "benches start"
benches=${BENCHES:-bench/gpu_checks/benches.txt}
while IFS='|' read -r name limit cmd; do
  case "$name" in ''|'#'*) continue ;; esac
  echo "=== $name: $cmd" >>"$out/benches.log"
  start=$(date +%s)
  timeout "$limit" bash -c "$cmd" >>"$out/benches.log" 2>&1
  stamp "bench $name rc=$? $(($(date +%s) - start)) s"
done <"$benches"

if [ "${SPEC:-1}" != 0 ]; then
  stamp "spec: $(tail -1 /tmp/rs/train.log)"
  # device_run.sh reads its binaries from $PWD/$CARRY/pack.
  mkdir -p .carry/spec_rt/pack
  ln -sf "$pack"/* .carry/spec_rt/pack/
  TARGET=/tmp/rs_spec_trained/ringserve-target-${TARGET_SHAPE:-24x768} CARRY=.carry/spec_rt \
    OUT=/tmp/rs/spec timeout "${SPEC_TIMEOUT:-120}" bash bench/spec/device_run.sh \
    >/tmp/rs/spec.log 2>&1
  stamp "spec rc=$?"
  cat /tmp/rs/spec/table.md >>"$summary" 2>/dev/null
  (cd /tmp/rs && tar -czf "$out/spec.tar.gz" spec spec.log train.log)
fi
stamp "done"
