#!/usr/bin/env bash
# One call on the GPU machine, from binaries built elsewhere and carried in .carry/ring/{bin,lib}
# (bench/ring/make_carry.sh; or packed as .carry/ring.tar.xz, unpacked here): the gpu-labelled
# tests, then the ring benchmark of issue 6 — a random-weight Llama-3.1-8B-shaped model (bf16),
# 1, 2 and 4 stages on ONE GPU over cuda_ipc, at 1/8/32/64 streams (128-token prompts), decode
# spreading against packing — with ringserve_loadgen against the real coordinator. Logs and JSON
# go to $OUT; a table is printed as it goes ($OUT/table.md) and again at the end.
# Env: DURATION_S (default 3), SKIP_TESTS=1, STREAMS="1 8 32 64", SHAPE (a make_random_model
# shape, e.g. qwen3-30b-a3b with PARTITIONS="16x1 4x4 8x2" and MODEL_LAYERS=16: the first layers
# only, for a disk and GPU that do not hold the whole model),
# RINGS="s1 s4 s4_m4_spread s4_m4_packed s2" (which rings, in order; also s4_bal: P4BAL, default
# 9,8,8,7); for a smoke test without
# a GPU: DEVICE=cpu CHANNEL=tcp SHAPE=tiny PARTITIONS="2x1 1x2 1x2" (the partitions in the
# 1-, 4- and 2-stage slots; tiny has 2 layers). The model directory is reused when it exists.
# MPS=1 runs the rings (not the tests) under a CUDA MPS daemon started here and stopped at the
# end (deploy/ringserve-mps.service does the same for an installed ring).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/rs_out}
mkdir -p "$out"
[ -d .carry/ring/bin ] || tar -xJf .carry/ring.tar.xz -C .carry || exit 1
nccl_dir=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib
export LD_LIBRARY_PATH="$PWD/.carry/ring/lib:$nccl_dir:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export RINGSERVE_SOURCE_DIR="$PWD" RINGSERVE_BINARY_DIR="$PWD/.carry/ring/tree"
bin=$PWD/.carry/ring/bin
duration=${DURATION_S:-3}
streams=${STREAMS:-1 8 32 64}
device=${DEVICE:-cuda:0}
channel=${CHANNEL:-cuda_ipc}
shape=${SHAPE:-llama-3.1-8b}
read -r p1 p4 p2 <<<"${PARTITIONS:-32x1 8x4 16x2}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null \
  | tee "$out/gpu.txt"

# The ring tests find the binaries in the build-tree layout.
mkdir -p .carry/ring/tree/stage .carry/ring/tree/coordinator
ln -sf "$bin/stage" .carry/ring/tree/stage/stage
ln -sf "$bin/coordinator" .carry/ring/tree/coordinator/coordinator

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  for t in ring_gpu_test kernels_cuda_sampling_test stage_cuda_model_slice_test \
      stage_cuda_gpu_step_timer_test; do
    [ -x "$bin/$t" ] || { echo "$t: not carried" | tee -a "$out/tests.txt"; continue; }
    start=$(date +%s)
    timeout 150 "$bin/$t" --gtest_brief=1 >"$out/test.log" 2>&1
    rc=$?
    echo "$t rc=$rc $(( $(date +%s) - start )) s" | tee -a "$out/tests.txt"
    { echo "=== $t"; cat "$out/test.log"; } >>"$out/tests.log"
    [ $rc -ne 0 ] && grep -E "Failure|Expected|Which is|error|FAILED|differ" "$out/test.log" | head -30
  done
  rm -f "$out/test.log"
fi

if [ "${MPS:-0}" = 1 ]; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/rs_mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/rs_mps_log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  nvidia-cuda-mps-control -d || exit 1
  trap 'echo quit | nvidia-cuda-mps-control' EXIT
  echo "rings run under CUDA MPS" | tee -a "$out/tests.txt"
fi

model=/tmp/rs_bench_$shape${MODEL_LAYERS:+_$MODEL_LAYERS}
start=$(date +%s)
[ -f "$model/config.json" ] || "$bin/make_random_model" --shape "$shape" --out "$model" --dtype bf16 --notokenizer \
  ${MODEL_LAYERS:+--layers $MODEL_LAYERS} \
  >"$out/model.log" 2>&1 || { cat "$out/model.log"; exit 1; }
echo "model written in $(( $(date +%s) - start )) s" | tee -a "$out/tests.txt"

port=50151
run_ring() {  # name partition "coordinator flags" streams...
  local name=$1 partition=$2 flags=$3; shift 3
  local log=/tmp/coord_$name.log
  port=$((port + 1))
  "$bin/coordinator" --model "$model" --partition "$partition" --device "$device" \
    --channel "$channel" $flags --listen 127.0.0.1:$port >"$log" 2>&1 &
  local pid=$!
  local ok=0
  for _ in $(seq 1 120); do
    grep -q "serving" "$log" 2>/dev/null && { ok=1; break; }
    kill -0 $pid 2>/dev/null || break
    sleep 0.5
  done
  if [ $ok != 1 ]; then echo "$name: coordinator did not come up"; tail -20 "$log"; kill $pid; return; fi
  grep -E "ring of|ready, layers" "$log" | head -5
  for w in 1 8 64; do  # warm-up: decode graphs of the common batch sizes, cuBLAS heuristics
    timeout 60 "$bin/ringserve_loadgen" --target 127.0.0.1:$port --streams $w --requests $w \
      --prompt_tokens 128 --max_tokens 8 --seed 2 --quiet >/dev/null 2>&1
  done
  for n in "$@"; do
    timeout $((duration + 60)) "$bin/ringserve_loadgen" --target 127.0.0.1:$port --streams "$n" \
      --prompt_tokens 128 --max_tokens 96 --duration_s "$duration" --seed 1 --quiet \
      --json "$out/runs/${name}_n$n.json" >/tmp/loadgen.txt 2>&1 || { echo "$name n=$n: loadgen rc=$?"; tail -5 /tmp/loadgen.txt; }
    python3 bench/ring/summarize.py "$out/runs" "$name" "$n" | tee -a "$out/table.md"
  done
  kill -INT $pid; wait $pid 2>/dev/null
  { echo "=== $name"; grep -E "per step|error|failed" "$log" | tail -12; } >>"$out/coordinators.log"
}
mkdir -p "$out/runs"
echo "| ring | streams | tok/s | of 1 stage | TTFT p50 ms | ITL p50 ms | ITL p99 ms | busy (run) per stage |" >"$out/table.md"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |" >>"$out/table.md"
# Default scheduling: micro-batches in flight = GPUs (1 here), decodes spread over them.
for ring in ${RINGS:-s1 s4 s4_m4_spread s4_m4_packed s2}; do
  case $ring in
    s1) run_ring s1 "$p1" "" $streams ;;
    s4) run_ring s4 "$p4" "" $streams ;;
    # Four micro-batches in flight on the one GPU, decodes spread over them or packed into one.
    s4_m4_spread) run_ring s4_m4_spread "$p4" "--micro_batches 4 --packing spread" 8 32 ;;
    s4_m4_packed) run_ring s4_m4_packed "$p4" "--micro_batches 4 --packing packed" 8 32 ;;
    s2) run_ring s2 "$p2" "" $streams ;;
    # 4 stages with the last one (final norm, lm_head, sampling) a layer lighter.
    s4_bal) run_ring s4_bal "${P4BAL:-9,8,8,7}" "" $streams ;;
    *) echo "unknown ring $ring" ;;
  esac
done
tar -cf "$out/runs.tar" -C "$out" runs && rm -rf "$out/runs"
echo; cat "$out/table.md"
cat "$out/tests.txt"
