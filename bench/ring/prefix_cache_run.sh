#!/usr/bin/env bash
# Issue 26's prefix-caching targets in one call on the GPU machine (binaries as
# bench/ring/plan_ahead_run.sh takes them: $CARRY/{bin,lib} or $CARRY/pack.tar.xz): a
# random-weight Llama-3.1-8B-shaped model (bf16) on one stage, every prompt a shared system
# prompt of PREFIX random ids (`ringserve_loadgen --shared_prefix_tokens`) and 128 ids of its own.
#   TTFT: one request at a time: the first request with a new prefix computes it; later requests
#     (other own ids, the same prefix) find its full KV blocks cached. A warm-up request with
#     another prefix first, so that neither pays first-use costs (GEMM tuning, graph capture).
#   tok/s: STREAMS requests at once (MAX_TOKENS output tokens each, ignore EOS) once the prefix
#     is cached (a request before them computed it, as a deployed system prompt would be),
#     against the same ring with --prefix_caching=false.
# Writes $OUT/prefix.md (and the loadgen JSON under $OUT/prefix_runs).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/pc_out}
carry=${CARRY:-.carry/h-serve}
mkdir -p "$out/prefix_runs"
[ -d "$carry/bin" ] || tar -xJf "$carry/pack.tar.xz" -C "$carry" || exit 1
carry=$(cd "$carry" && pwd)
export LD_LIBRARY_PATH="$carry/lib:/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
bin=$carry/bin
prefix=${PREFIX:-2048}
streams=${STREAMS:-32}
max_tokens=${MAX_TOKENS:-512}
shape=${SHAPE:-llama-3.1-8b}
device=${DEVICE:-cuda:0}
model=/tmp/rs_bench_$shape
[ -f "$model/config.json" ] || "$bin/make_random_model" --shape "$shape" --out "$model" \
  --dtype bf16 --notokenizer >"$out/prefix_model.log" 2>&1 || { cat "$out/prefix_model.log"; exit 1; }
table=$out/prefix.md
field() {  # json python-expression
  python3 -c "import json,sys; r=json.load(open('$1')); print($2)" 2>/dev/null || echo "?"
}
port=50351
for caching in true false; do
  port=$((port + 1))
  log=$out/coord_prefix_$caching.log
  "$bin/coordinator" --model "$model" --partition "${PARTITION:-32x1}" --device "$device" \
    --channel "${CHANNEL:-cuda_ipc}" \
    --prefix_caching=$caching --listen 127.0.0.1:$port >"$log" 2>&1 &
  pid=$!
  for _ in $(seq 1 480); do grep -q serving "$log" 2>/dev/null && break; sleep 0.25; done
  load() {  # name streams requests prefix_seed seed max_tokens
    timeout 120 "$bin/ringserve_loadgen" --target 127.0.0.1:$port --streams "$2" --requests "$3" \
      --prompt_tokens 128 --shared_prefix_tokens "$prefix" --prefix_seed "$4" --seed "$5" \
      --max_tokens "$6" --quiet --json "$out/prefix_runs/$1_$caching.json" >/dev/null 2>&1 \
      || echo "loadgen $1 ($caching) failed"
  }
  load warm 1 1 99 1 8          # first-use costs of these shapes, another prefix
  load first 1 1 7 1 8          # computes prefix 7
  load later 1 8 7 2 8          # finds it cached (with caching on)
  load warm32 "$streams" "$streams" 99 3 8   # the batch shapes of the run below
  load run "$streams" "$streams" 7 4 "$max_tokens"
  kill -INT $pid; wait $pid 2>/dev/null
  r=$out/prefix_runs
  echo "| $caching | $(field $r/first_$caching.json 'round(r["ttft_ms"]["p50"],1)') | $(field $r/later_$caching.json 'round(r["ttft_ms"]["p50"],1)') | $(field $r/later_$caching.json 'r["server"]["prefix_hit_tokens"]') | $(field $r/run_$caching.json 'round(r["output_tokens_per_s"],1)') | $(field $r/run_$caching.json 'round(r["ttft_ms"]["p50"],1)') | $(field $r/run_$caching.json 'r["server"]["prefix_hit_tokens"]') |" >>"$table.rows"
done
{
  echo "shared prefix $prefix ids + 128 own, $streams streams x $max_tokens output tokens"
  echo "| prefix caching | TTFT first ms | TTFT later p50 ms | later: hit tokens | tok/s ($streams streams) | TTFT p50 ms | hit tokens |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
  cat "$table.rows"
} >"$table"
rm -f "$table.rows"
cat "$table"
