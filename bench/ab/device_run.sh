#!/usr/bin/env bash
# One call on the GPU machine (binaries from bench/ab/make_carry.sh): the gpu tests of the new
# build (and of the extra build, e.g. compute_80 code only, when carried), then an A/B of the
# old and new binaries in the same call: stage_bench --decode_only (alternating, ROUNDS times,
# default 1), stage_bench --quick --prefill_only once each (PREFILL=1), and a 1-stage ring
# through the real coordinator with ringserve_loadgen at 1 and 32 streams (RING_ORDER, default
# "old new"). SKIP_TESTS=1, SKIP_AB=1 (no stage_bench rows), SKIP_RING=1 leave those out. Results under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/ab_out}
mkdir -p "$out"
tar -xJf .carry/ab.tar.xz -C .carry || exit 1
nccl_dir=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib
export LD_LIBRARY_PATH="$PWD/.carry/ab/lib:$nccl_dir:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export RINGSERVE_SOURCE_DIR="$PWD"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"

run_tests() {  # dir label
  local dir=$1 label=$2
  mkdir -p "$PWD/.carry/tree_$label/stage" "$PWD/.carry/tree_$label/coordinator"
  ln -sf "$dir/stage" "$PWD/.carry/tree_$label/stage/stage"
  ln -sf "$dir/coordinator" "$PWD/.carry/tree_$label/coordinator/coordinator"
  local tests="kernels_cuda_ops_test kernels_cuda_attention_test kernels_cuda_sampling_test
    stage_cuda_model_slice_test stage_cuda_gpu_step_timer_test ring_gpu_test"
  # The extra build (another architecture list) runs the kernel and slice tests only.
  [ "${TESTS_EXTRA:-0}" = 1 ] && tests="kernels_cuda_ops_test kernels_cuda_attention_test
    stage_cuda_model_slice_test"
  for t in $tests; do
    [ -x "$dir/$t" ] || continue
    local start=$(date +%s)
    RINGSERVE_BINARY_DIR="$PWD/.carry/tree_$label" timeout 280 "$dir/$t" --gtest_brief=1 \
      >"$out/$label.$t.log" 2>&1
    local rc=$?
    echo "$label $t rc=$rc $(( $(date +%s) - start )) s" | tee -a "$out/tests.txt"
    [ $rc -ne 0 ] && grep -E "Failure|Expected|Which is|error|FAILED|Value of" \
      "$out/$label.$t.log" | head -20
  done
}
[ "${SKIP_TESTS:-0}" = 1 ] || run_tests "$PWD/.carry/ab/new" new
[ -d .carry/ab/extra ] && [ "${SKIP_TESTS:-0}" != 1 ] && TESTS_EXTRA=1 run_tests "$PWD/.carry/ab/extra" extra

rounds=${ROUNDS:-1}
[ "${SKIP_AB:-0}" = 1 ] && rounds=0
for r in $(seq 1 "$rounds"); do
  for v in old new; do
    echo "=== $v decode round $r" | tee -a "$out/decode.txt"
    timeout 240 ".carry/ab/$v/stage_bench" --decode_only 2>&1 | grep -v "^\[" \
      | tee -a "$out/decode_$v.log" | grep -E "decode|tok/s" | tail -6 | tee -a "$out/decode.txt"
  done
done
[ "${PREFILL:-0}" = 1 ] && for v in old new; do
  echo "=== $v prefill" | tee -a "$out/prefill.txt"
  timeout 240 ".carry/ab/$v/stage_bench" --quick --prefill_only 2>&1 | grep -v "^\[" \
    | tee "$out/prefill_$v.log" | grep -E "prefill" | tail -6 | tee -a "$out/prefill.txt"
done

# The ring: one stage through the real coordinator (dashed flag spellings: both builds take them).
if [ "${SKIP_RING:-0}" != 1 ]; then
  model=/tmp/ab_model
  [ -f "$model/config.json" ] || .carry/ab/new/make_random_model --shape llama-3.1-8b \
    --out "$model" --dtype bf16 --no-tokenizer >"$out/make_model.log" 2>&1 \
    || { echo "make_random_model failed"; tail -5 "$out/make_model.log"; }
  port=50151
  for v in ${RING_ORDER:-old new}; do
    bin=.carry/ab/$v
    port=$((port + 1))
    log=$out/coord_$v.$port.log
    "$bin/coordinator" --model "$model" --partition 32x1 --device cuda:0 --channel cuda_ipc \
      --listen 127.0.0.1:$port >"$log" 2>&1 &
    pid=$!
    for _ in $(seq 1 240); do
      grep -q "serving" "$log" 2>/dev/null && break
      kill -0 $pid 2>/dev/null || break
      sleep 0.5
    done
    for w in 1 8 32; do  # warm-up: decode graphs of the common batch sizes
      timeout 60 "$bin/ringserve_loadgen" --target 127.0.0.1:$port --streams $w --requests $w \
        --prompt-tokens 128 --max-tokens 8 --seed 2 --quiet >/dev/null 2>&1
    done
    for n in 1 32; do
      timeout 90 "$bin/ringserve_loadgen" --target 127.0.0.1:$port --streams $n \
        --prompt-tokens 128 --max-tokens 96 --duration-s ${DURATION_S:-4} --seed 1 \
        >"$out/ring_$v.$port.n$n.txt" 2>&1
      echo "ring $v (port $port) streams $n: $(grep -iE "tok/s|output tokens" \
        "$out/ring_$v.$port.n$n.txt" | head -2 | tr '\n' ' ')" | tee -a "$out/ring.txt"
    done
    kill -INT $pid; wait $pid 2>/dev/null
  done
fi
cd "$out" && tar -czf logs.tgz --exclude=logs.tgz . 2>/dev/null
echo done
