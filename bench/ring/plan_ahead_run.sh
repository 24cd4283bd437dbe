#!/usr/bin/env bash
# Issue 26's speed targets in one call on the GPU machine (binaries as bench/ring/make_carry.sh
# collects them, in $CARRY/{bin,lib} or packed as $CARRY/pack.tar.xz; CARRY defaults to
# .carry/h-ahead): a random-weight
# Llama-3.1-8B-shaped model (bf16) on one GPU, `ringserve_loadgen` against the real coordinator
# with every request at once (STREAMS requests of 128 prompt tokens and MAX_TOKENS output
# tokens, ignore EOS: mean decode context 128 + MAX_TOKENS / 2), and `stage_bench --decode_at`
# rows at those batch sizes and that mean context (like for like). Rings, in order: one stage
# with plan-ahead on and off at each of STREAMS, then 4 stages (8x4, cuda_ipc) at 64 streams
# with plan-ahead on and off; a ring is skipped once BUDGET_S seconds have gone. Results and a
# table ($OUT/table.md) under $OUT. A smoke test without a GPU: SKIP_BENCH=1 DEVICE=cpu
# CHANNEL=tcp SHAPE=tiny PARTITIONS="2x1 1x2" STREAMS="1 4" S4_STREAMS=4 MAX_TOKENS=16.
set -uo pipefail
summarize=$(cd "$(dirname "$0")" && pwd)/plan_ahead_summarize.py
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/pa_out}
carry=${CARRY:-.carry/h-ahead}
mkdir -p "$out/runs"
[ -d "$carry/bin" ] || tar -xJf "$carry/pack.tar.xz" -C "$carry" || exit 1
carry=$(cd "$carry" && pwd)
nccl_dir=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib
export LD_LIBRARY_PATH="$carry/lib:$nccl_dir:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
bin=$carry/bin
streams=${STREAMS:-1 32 64}
max_tokens=${MAX_TOKENS:-512}
budget=${BUDGET_S:-170}
device=${DEVICE:-cuda:0}
channel=${CHANNEL:-cuda_ipc}
shape=${SHAPE:-llama-3.1-8b}
read -r p1 p4 <<<"${PARTITIONS:-32x1 8x4}"
s4_streams=${S4_STREAMS:-64}
t0=$(date +%s)
ctx=$((128 + max_tokens / 2))
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"

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
run_ring() {  # name partition "coordinator flags" streams...
  local name=$1 partition=$2 flags=$3; shift 3
  if [ $(( $(date +%s) - t0 )) -gt "$budget" ]; then echo "$name: skipped (budget)" | tee -a "$out/table.md"; return; fi
  local log=$out/coord_$name.log
  port=$((port + 1))
  "$bin/coordinator" --model "$model" --partition "$partition" --device "$device" \
    --channel "$channel" $flags --listen 127.0.0.1:$port >"$log" 2>&1 &
  local pid=$!
  local ok=0
  for _ in $(seq 1 240); do
    grep -q "serving" "$log" 2>/dev/null && { ok=1; break; }
    kill -0 $pid 2>/dev/null || break
    sleep 0.25
  done
  if [ $ok != 1 ]; then echo "$name: coordinator did not come up"; tail -20 "$log"; kill $pid; return; fi
  # The same greedy and seeded requests on every ring: their tokens must not differ.
  { "$bin/ringserve_client" --target 127.0.0.1:$port --prompt_ids 5,6,7,8,9,10,11,12 \
      --max_tokens 48 --ignore_eos --print_ids
    "$bin/ringserve_client" --target 127.0.0.1:$port --prompt_ids 9,8,7,6,5 --max_tokens 48 \
      --ignore_eos --print_ids --temperature 0.8 --top_p 0.9 --seed 5; } >"$out/tokens_$name.txt" 2>/dev/null
  for w in "$@"; do  # warm-up: decode graphs of the batch sizes, cuBLAS heuristics
    timeout 60 "$bin/ringserve_loadgen" --target 127.0.0.1:$port --streams "$w" --requests "$w" \
      --prompt_tokens 128 --max_tokens 4 --seed 2 --quiet >/dev/null 2>&1
  done
  for n in "$@"; do
    timeout 60 "$bin/ringserve_loadgen" --target 127.0.0.1:$port --streams "$n" --requests "$n" \
      --prompt_tokens 128 --max_tokens "$max_tokens" --seed 1 --quiet \
      --json "$out/runs/${name}_n$n.json" >/tmp/loadgen.txt 2>&1 || { echo "$name n=$n: loadgen rc=$?"; tail -5 /tmp/loadgen.txt; }
    python3 "$summarize" "$out/runs" "$name" "$n" | tee -a "$out/table.md"
  done
  "$bin/ringserve_client" --target 127.0.0.1:$port --stats >"$out/stats_$name.txt" 2>&1
  kill -INT $pid; wait $pid 2>/dev/null
  grep -E "per step|error|failed" "$log" | tail -6
}
echo "| ring | streams | tok/s | decode tok/s (1/ITL) | ITL p50 ms | busy per stage |" >>"$out/table.md"
echo "| --- | ---: | ---: | ---: | ---: | --- |" >>"$out/table.md"
run_ring s1_on "$p1" "--plan_ahead=true" $streams
run_ring s1_off "$p1" "--plan_ahead=false" $streams
run_ring s4_on "$p4" "--plan_ahead=true" $s4_streams
run_ring s4_off "$p4" "--plan_ahead=false" $s4_streams
for f in "$out"/tokens_*.txt; do
  cmp -s "$f" "$out/tokens_s1_off.txt" && echo "$(basename "$f"): same tokens as s1_off" \
    || echo "$(basename "$f"): DIFFERENT tokens from s1_off"
done | tee -a "$out/table.md"
(cd "$out" && tar -cf runs.tar runs coord_*.log tokens_*.txt stats_*.txt && rm -rf runs coord_*.log tokens_*.txt stats_*.txt)
echo "total $(( $(date +%s) - t0 )) s" | tee -a "$out/table.md"
cat "$out/table.md"
