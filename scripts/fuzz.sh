#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz; clang with ASan) in build-fuzz/ and runs each for
# SECONDS (default 20) from its seed corpus (tests/fuzz/<target>/corpus/, read only; new inputs
# go to build-fuzz/corpus/<target>/). Fails when a target crashes, leaks, times out or runs out
# of memory; the input that did it is left in build-fuzz/artifacts/. Prints each target's
# executions.
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]        (TARGET e.g. hosts, chat_template)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-20}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(safetensors model_config tokenizer hosts openai_request chat_template plan_codec
           activation_frame)
fi
launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
if [ ! -f build-fuzz/build.ninja ]; then
  # -O1 with line tables: quick to build on a small CI machine, fast enough to fuzz, readable
  # stack traces; asserts stay on.
  CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_FLAGS_RELEASE="-O1 -gline-tables-only" -DCMAKE_C_FLAGS_RELEASE="-O1" \
    -DRINGSERVE_ENABLE_CUDA=OFF -DRINGSERVE_FUZZ=ON "${launcher[@]}" >/dev/null
fi
ninja -C build-fuzz $(printf '%s_fuzzer ' "${targets[@]}")
mkdir -p build-fuzz/artifacts
failed=0
for t in "${targets[@]}"; do
  mkdir -p "build-fuzz/corpus/$t"
  log="build-fuzz/artifacts/$t.log"
  if ASAN_OPTIONS=detect_leaks=1 "build-fuzz/tests/fuzz/${t}_fuzzer" \
      -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="build-fuzz/artifacts/$t-" "build-fuzz/corpus/$t" "tests/fuzz/$t/corpus" \
      >"$log" 2>&1; then
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)
    echo "fuzz $t: ok, ${execs:-?} executions in ${seconds} s"
  else
    echo "fuzz $t: FAILED (see $log and build-fuzz/artifacts/$t-*)"
    grep -m1 -A20 'ERROR: \|==ERROR\|deadly signal\|Timeout\|out-of-memory' "$log" || tail -20 "$log"
    failed=1
  fi
done
exit $failed
