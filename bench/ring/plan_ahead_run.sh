#!/usr/bin/env bash
# Issue 26's speed targets in one call on the GPU machine (binaries as bench/ring/make_carry.sh
# collects them, in $CARRY/{bin,lib} or packed as $CARRY/pack.tar.xz; CARRY defaults to
# .carry/h-serve): a random-weight Llama-3.1-8B-shaped model (bf16) on one GPU,
# `ringserve_loadgen` against the real coordinator with every request at once (STREAMS requests
# of 128 prompt tokens and MAX_TOKENS output tokens, ignore EOS: mean decode context
# 128 + MAX_TOKENS / 2), and `stage_bench --decode_at` rows at those batch sizes and that mean
# context (like for like).
#
# Each point runs twice after a short warm-up (MAX_TOKENS 4): "cold", the first pass, meets
# decode-graph keys (batch bucket, context bucket) and GEMM batch sizes for the first time and
# pays their tuning and capture mid-run (the stage logs say how long each took); the second pass
# is the figure. Rings, in order: one stage with plan-ahead (STREAMS), the same with
# RINGSERVE_SAMPLING_IN_FLIGHT=0 (HOST_FED=1, the default), 4 stages (8x4, cuda_ipc)
# with plan-ahead (S4_STREAMS) and without (the token check only), then under CUDA MPS 4 stages
# with plan-ahead, 8x4 and split by `--partition auto` (measured layer costs); a ring is skipped
# once BUDGET_S seconds have gone. Results and a table ($OUT/table.md) under $OUT.
# A smoke test without a GPU: SKIP_BENCH=1 DEVICE=cpu CHANNEL=tcp SHAPE=tiny MPS=0
# PARTITIONS="2x1 1x2" STREAMS="1 4" S4_STREAMS=4 MAX_TOKENS=16.
set -uo pipefail
summarize=$(cd "$(dirname "$0")" && pwd)/plan_ahead_summarize.py
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/pa_out}
carry=${CARRY:-.carry/h-serve}
mkdir -p "$out/runs"
[ -d "$carry/bin" ] || tar -xJf "$carry/pack.tar.xz" -C "$carry" || exit 1
carry=$(cd "$carry" && pwd)
nccl_dir=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib
export LD_LIBRARY_PATH="$carry/lib:$nccl_dir:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
bin=$carry/bin
streams=${STREAMS:-1 32 64}
max_tokens=${MAX_TOKENS:-512}
budget=${BUDGET_S:-200}
device=${DEVICE:-cuda:0}
channel=${CHANNEL:-cuda_ipc}
shape=${SHAPE:-llama-3.1-8b}
read -r p1 p4 <<<"${PARTITIONS:-32x1 8x4}"
s4_streams=${S4_STREAMS:-64}
t0=$(date +%s)
ctx=$((128 + max_tokens / 2))
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | tee "$out/gpu.txt"

model=/tmp/rs_bench_$shape
# The model is written (CPU, disk) while stage_bench decodes (GPU, random weights).
( [ -f "$model/config.json" ] || "$bin/make_random_model" --shape "$shape" --out "$model" \
    --dtype bf16 --notokenizer >"$out/model.log" 2>&1 ) &
model_pid=$!
rows=$(for n in $streams; do printf '%s@%s,' "$n" "$ctx"; done)
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  timeout 120 "$bin/stage_bench" --decode_at "${rows%,}" --decode_at_only 2>&1 | grep -v "^\[" \
    >"$out/stage_bench.txt"
  grep -E "@ ctx" "$out/stage_bench.txt" | tail -n 3 | tee -a "$out/table.md"
fi
wait $model_pid || { cat "$out/model.log"; exit 1; }
echo "bench and model: $(( $(date +%s) - t0 )) s" | tee -a "$out/table.md"

port=50251
load() {  # port streams max_tokens seed [json]
  timeout 90 "$bin/ringserve_loadgen" --target 127.0.0.1:$1 --streams "$2" --requests "$2" \
    --prompt_tokens 128 --max_tokens "$3" --seed "$4" --quiet ${5:+--json "$5"} \
    >/tmp/loadgen.txt 2>&1 || { echo "loadgen n=$2 rc=$?"; tail -5 /tmp/loadgen.txt; }
}
run_ring() {  # name partition "coordinator flags" streams...
  local name=$1 partition=$2 flags=$3; shift 3
  if [ $(( $(date +%s) - t0 )) -gt "$budget" ]; then echo "$name: skipped (budget)" | tee -a "$out/table.md"; return; fi
  local log=$out/coord_$name.log
  port=$((port + 1))
  "$bin/coordinator" --model "$model" --partition "$partition" --device "$device" \
    --channel "$channel" $flags --listen 127.0.0.1:$port >"$log" 2>&1 &
  local pid=$!
  local ok=0
  for _ in $(seq 1 480); do
    grep -q "serving" "$log" 2>/dev/null && { ok=1; break; }
    kill -0 $pid 2>/dev/null || break
    sleep 0.25
  done
  if [ $ok != 1 ]; then echo "$name: coordinator did not come up"; tail -20 "$log"; kill $pid; return; fi
  grep -h "partition auto:" "$log" | tail -1 | cut -c1-900 | tee -a "$out/table.md"
  # The same greedy and seeded requests on every ring: their tokens must not differ.
  { "$bin/ringserve_client" --target 127.0.0.1:$port --prompt_ids 5,6,7,8,9,10,11,12 \
      --max_tokens 48 --ignore_eos --print_ids
    "$bin/ringserve_client" --target 127.0.0.1:$port --prompt_ids 9,8,7,6,5 --max_tokens 48 \
      --ignore_eos --print_ids --temperature 0.8 --top_p 0.9 --seed 5; } >"$out/tokens_$name.txt" 2>/dev/null
  for w in "$@"; do load $port "$w" 4 2; done  # warm-up as before: contexts of ~132 only
  for n in "$@"; do
    load $port "$n" "$max_tokens" 1 "$out/runs/${name}-cold_n$n.json"
    python3 "$summarize" "$out/runs" "$name-cold" "$n" | tee -a "$out/table.md"
    load $port "$n" "$max_tokens" 1 "$out/runs/${name}_n$n.json"
    python3 "$summarize" "$out/runs" "$name" "$n" | tee -a "$out/table.md"
  done
  "$bin/ringserve_client" --target 127.0.0.1:$port --stats >"$out/stats_$name.txt" 2>&1
  kill -INT $pid; wait $pid 2>/dev/null
  grep -E "per step|error|failed" "$log" | tail -6
  # Mid-run tuning and captures, and the lm_head's GEMM (per stage process) at 1 row.
  echo "$name: $(grep -c 'decode graph for' "$log") decode graphs captured; lm_head at 1 row: $(grep -h 'decode graph for 1 rows' "$log" | grep -o 'lm_head: .*' | sort -u | tr '\n' ' ')" | tee -a "$out/table.md"
}
echo "| ring | streams | tok/s | decode tok/s (1/ITL) | ITL p50 ms | ITL max ms | busy per stage |" >>"$out/table.md"
echo "| --- | ---: | ---: | ---: | ---: | ---: | --- |" >>"$out/table.md"
run_ring s1_on "$p1" "--plan_ahead=true" $streams
# The same ring with each step's tokens through the host before the next step starts (A/B).
[ "${HOST_FED:-1}" = 1 ] && RINGSERVE_SAMPLING_IN_FLIGHT=0 run_ring s1_hostfed "$p1" "--plan_ahead=true" $streams
run_ring s4_on "$p4" "--plan_ahead=true" $s4_streams
run_ring s4_off "$p4" "--plan_ahead=false"  # the token check only
if [ "${MPS:-1}" = 1 ]; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/rs_mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/rs_mps_log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if nvidia-cuda-mps-control -d; then
    echo "under CUDA MPS from here" | tee -a "$out/table.md"
    run_ring s4_mps "$p4" "--plan_ahead=true" $s4_streams
    run_ring s4_auto_mps auto "--plan_ahead=true --num_stages 4" $s4_streams
    echo quit | nvidia-cuda-mps-control
  fi
fi
for f in "$out"/tokens_*.txt; do
  cmp -s "$f" "$out/tokens_s1_on.txt" && echo "$(basename "$f"): same tokens as s1_on" \
    || echo "$(basename "$f"): DIFFERENT tokens from s1_on"
done | tee -a "$out/table.md"
(cd "$out" && tar -cf runs.tar runs coord_*.log tokens_*.txt stats_*.txt && rm -rf runs coord_*.log tokens_*.txt stats_*.txt)
echo "total $(( $(date +%s) - t0 )) s" | tee -a "$out/table.md"
cat "$out/table.md"
