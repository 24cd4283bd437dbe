#!/usr/bin/env bash
# NOT RUN YET: written 2026-12-04 while only one-GPU machines (nvidia-h200) were lent; it needs a
# multi-GPU kind (nvidia-h200-x2 for 2-GPU rings, -x8 for all of them). Expect to fix small things
# on its first run.
#
# One call on a machine with several GPUs, from binaries built elsewhere and carried in
# .carry/ring/{bin,lib} (bench/ring/make_carry.sh, which also carries nccl_channel_test when the
# build has it; or packed as .carry/ring.tar.xz, unpacked here): the multigpu-labelled tests
# (stage/nccl/nccl_channel_test) and the gpu ring test, then the ring benchmark of issue 25 — a
# random-weight Llama-3.1-8B-shaped model (bf16) on 1 GPU (the baseline) and on 2, 4 and 8 GPUs,
# one stage per GPU over the nccl channel (hosts.yaml mode: one `stage` process per GPU, started
# here), micro-batches in flight = GPUs, decodes spread against packed, at 1/8/32/64 streams
# (128-token prompts, 96 output tokens) with ringserve_loadgen against the real coordinator.
# The table ($OUT/table.md) has the columns of the prediction (bench/ring/MULTIGPU_PREDICTION.md,
# made by ringserve_predict_multigpu) plus the hop bytes a step from the stages' own counters.
#
# Structure as bench/ring/device_run.sh (the one-GPU version). Env: DURATION_S (default 3),
# SKIP_TESTS=1, STREAMS="1 8 32 64", GPUS="2 4 8" (rings larger than the machine are skipped),
# PACKINGS="spread packed", CHANNEL=nccl (cuda_ipc also works, for comparison), SHAPE
# (default llama-3.1-8b; the MoE shape of the MoE issue when it exists) with LAYERS (its layer
# count, default 32). A smoke test of the script without GPUs (what was run when it was
# written): DEVICE=cpu CHANNEL=tcp SHAPE=tiny LAYERS=2 NGPU=2 GPUS=2 SKIP_TESTS=1.
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
channel=${CHANNEL:-nccl}
shape=${SHAPE:-llama-3.1-8b}
layers=${LAYERS:-32}
device=${DEVICE:-cuda}  # stage i on cuda:i; cpu: every stage on the CPU
ngpu=${NGPU:-$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | wc -l)}
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>/dev/null \
  | tee "$out/gpu.txt"
nvidia-smi topo -m >"$out/topo.txt" 2>&1  # NVLink or PCIe between the GPUs: which hop row applies
echo "$ngpu GPUs" | tee -a "$out/tests.txt"
[ "$ngpu" -ge 2 ] || { echo "needs at least 2 GPUs" | tee -a "$out/tests.txt"; exit 1; }

mkdir -p .carry/ring/tree/stage .carry/ring/tree/coordinator
ln -sf "$bin/stage" .carry/ring/tree/stage/stage
ln -sf "$bin/coordinator" .carry/ring/tree/coordinator/coordinator

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  for t in nccl_channel_test ring_gpu_test; do
    [ -x "$bin/$t" ] || { echo "$t: not carried" | tee -a "$out/tests.txt"; continue; }
    start=$(date +%s)
    timeout 240 "$bin/$t" --gtest_brief=1 >"$out/test.log" 2>&1
    rc=$?
    echo "$t rc=$rc $(( $(date +%s) - start )) s" | tee -a "$out/tests.txt"
    { echo "=== $t"; cat "$out/test.log"; } >>"$out/tests.log"
    [ $rc -ne 0 ] && grep -E "Failure|Expected|Which is|error|FAILED|differ|SKIPPED" "$out/test.log" | head -30
  done
  rm -f "$out/test.log"
fi

model=/tmp/rs_bench_$shape
start=$(date +%s)
[ -f "$model/config.json" ] || "$bin/make_random_model" --shape "$shape" --out "$model" --dtype bf16 --no-tokenizer \
  >"$out/model.log" 2>&1 || { cat "$out/model.log"; exit 1; }
echo "model written in $(( $(date +%s) - start )) s" | tee -a "$out/tests.txt"

port=50251
stage_pids=()
stop_stages() {
  for pid in "${stage_pids[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${stage_pids[@]}"; do wait "$pid" 2>/dev/null; done
  stage_pids=()
}
trap stop_stages EXIT

# run_ring NAME GPUS PACKING STREAMS...: GPUS stage processes (stage i on cuda:i), a hosts.yaml
# naming them, the coordinator in hosts.yaml mode, then the loadgen points.
run_ring() {
  local name=$1 gpus=$2 packing=$3; shift 3
  local yaml=/tmp/hosts_$name.yaml log=/tmp/coord_$name.log
  port=$((port + 1))
  local api=$port
  {
    echo "model: $model"
    echo "channel: $([ "$gpus" = 1 ] && [ "$device" = cuda ] && echo cuda_ipc || echo "$channel")"
    echo "scheduler:"
    echo "  micro_batches_in_flight: $gpus"
    echo "partition: $((layers / gpus))x$gpus"
    echo "stages:"
  } >"$yaml"
  for ((i = 0; i < gpus; i++)); do
    port=$((port + 1))
    "$bin/stage" --listen 127.0.0.1:$port >/tmp/stage_${name}_$i.log 2>&1 &
    stage_pids+=($!)
    echo "  - {host: 127.0.0.1, port: $port, device: $([ "$device" = cuda ] && echo "cuda:$i" || echo cpu)}" >>"$yaml"
  done
  "$bin/coordinator" --stages "$yaml" --listen 127.0.0.1:$api --packing "$packing" \
    --connect_timeout 120 >"$log" 2>&1 &
  local pid=$!
  local ok=0
  for _ in $(seq 1 400); do
    grep -q "serving" "$log" 2>/dev/null && { ok=1; break; }
    kill -0 $pid 2>/dev/null || break
    sleep 0.5
  done
  if [ $ok != 1 ]; then
    echo "$name: coordinator did not come up"; tail -20 "$log"
    kill $pid 2>/dev/null; stop_stages; return
  fi
  grep -E "ring of|ready, layers|nccl" "$log" | head -8
  for w in 1 8 64; do  # warm-up: decode graphs of the common batch sizes, cuBLAS heuristics
    timeout 90 "$bin/ringserve_loadgen" --target 127.0.0.1:$api --streams $w --requests $w \
      --prompt-tokens 128 --max-tokens 8 --seed 2 --quiet >/dev/null 2>&1
  done
  for n in "$@"; do
    timeout $((duration + 60)) "$bin/ringserve_loadgen" --target 127.0.0.1:$api --streams "$n" \
      --prompt-tokens 128 --max-tokens 96 --duration-s "$duration" --seed 1 --quiet \
      --json "$out/runs/${name}_n$n.json" >/tmp/loadgen.txt 2>&1 || { echo "$name n=$n: loadgen rc=$?"; tail -5 /tmp/loadgen.txt; }
    python3 bench/ring/multigpu_summarize.py "$out/runs" "$name" "$n" | tee -a "$out/table.md"
  done
  kill -INT $pid; wait $pid 2>/dev/null
  stop_stages  # their exit logs hold the per-step timing (waiting for input, sending, GPU time)
  { echo "=== $name"; grep -E "per step|error|failed" "$log" /tmp/stage_${name}_*.log | tail -20; } \
    >>"$out/coordinators.log"
}

mkdir -p "$out/runs"
echo "| ring | streams | tok/s | of 1 GPU | TTFT p50 ms | ITL p50 ms | ITL p99 ms | busy (run) per stage | hop KB a step |" >"$out/table.md"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |" >>"$out/table.md"
run_ring g1 1 spread $streams  # the baseline: the whole model on cuda:0
for g in ${GPUS:-2 4 8}; do
  [ "$g" -le "$ngpu" ] || { echo "g$g: skipped, $ngpu GPUs" | tee -a "$out/tests.txt"; continue; }
  for p in ${PACKINGS:-spread packed}; do
    run_ring "g${g}_$p" "$g" "$p" $streams
  done
done
tar -cf "$out/runs.tar" -C "$out" runs && rm -rf "$out/runs"
echo; cat "$out/table.md"
cat "$out/tests.txt"
