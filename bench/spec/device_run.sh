#!/usr/bin/env bash
# One call on the GPU machine (issue 24): speculative decoding against plain decoding on one H200.
# Trains a larger target with scripts/train_small_model.py and the committed tokenizer
# (TARGET_SHAPE, default 12x768; STEPS of its cosine schedule, default 1000, within TRAIN_S
# seconds, default 60), then serves it from a 1-stage CUDA ring twice —
# plain, and with the committed draft models/ringserve-tiny-draft on the last stage — and
# measures 1 and 8 streams (greedy, a KJV prompt, MAX_TOKENS each) with ringserve_loadgen; reads
# the acceptance rate and tokens per verification step from /metrics. Results: $OUT/table.md,
# logs in $OUT.
# Run from the repository root with the carry unpacked or packed (bench/spec/make_carry.sh):
#   bash .carry/h-spec/pack/device_run.sh      (after: tar -xJf .carry/h-spec/pack.tar.xz -C .carry/h-spec)
# Env: TARGET_SHAPE, STEPS, TRAIN_S, DURATION_S (default 6), MAX_TOKENS (default 128),
# K (default 4), SPEC_MAX_SEQS (default 4: speculation backs off above it), STREAMS ("1 8"),
# DEVICE (cuda:0), TARGET (a model directory: skips training; e.g. models/ringserve-tiny with
# DEVICE=cpu for a smoke test without a GPU).
set -uo pipefail
out=${OUT:-/tmp/rs_spec_out}
mkdir -p "$out"
carry=${CARRY:-.carry/h-spec}
[ -d "$carry/pack" ] || tar -xJf "$carry/pack.tar.xz" -C "$carry" || exit 1
pack=$PWD/$carry/pack
export LD_LIBRARY_PATH="$pack/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
py=${PYTHON:-/opt/torch/.venv/bin/python}
shape=${TARGET_SHAPE:-12x768}
k=${K:-4}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | tee "$out/gpu.txt"

start=$(date +%s)
if [ -n "${TARGET:-}" ]; then
  target=$(realpath "$TARGET")
  echo "target $target (not trained here)" | tee "$out/table.md"
else
  "$py" "$pack/train_small_model.py" --corpus "$pack/corpus" --out /tmp/rs_spec_trained \
  --target-shape "$shape" --tokenizer models/ringserve-tiny/tokenizer.json \
  --max-train-seconds "${TRAIN_S:-60}" --steps "${STEPS:-1000}" --eval-every 100000 >"$out/train.log" 2>&1 \
  || { tail -20 "$out/train.log"; exit 1; }
target=/tmp/rs_spec_trained/ringserve-target-$shape
echo "target $shape trained in $(( $(date +%s) - start )) s: $(grep -E 'best|step .*loss' "$out/train.log" | tail -1)" \
  | tee "$out/table.md"
fi

prompt="And it came to pass, when the king of Israel heard the words of the book of the law, that he rent his clothes. And the king commanded"
port=50350
run_ring() {  # name "coordinator flags"
  local name=$1 flags=$2
  port=$((port + 2))
  local log=$out/coord_$name.log
  pack_bin=$pack/bin
  "$pack_bin/coordinator" --model "$target" --num_stages 1 --device "${DEVICE:-cuda:0}" \
    --stage_binary "$pack_bin/stage" --listen 127.0.0.1:$port --http_listen 127.0.0.1:$((port + 1)) \
    $flags >"$log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 120); do
    grep -q "serving ringserve.v1.Generate" "$log" 2>/dev/null && break
    kill -0 $pid 2>/dev/null || { echo "$name: coordinator exited"; tail -20 "$log"; return; }
    sleep 0.5
  done
  for n in ${STREAMS:-1 8}; do
    "$pack_bin/ringserve_loadgen" --target 127.0.0.1:$port --streams "$n" --requests "$n" \
      --prompt_text "$prompt" --max_tokens 16 --temperature 0 --quiet >/dev/null 2>&1  # warm-up
    timeout 60 "$pack_bin/ringserve_loadgen" --target 127.0.0.1:$port --streams "$n" \
      --prompt_text "$prompt" --max_tokens "${MAX_TOKENS:-128}" --temperature 0 \
      --duration_s "${DURATION_S:-6}" --quiet --json "$out/${name}_n$n.json" >/dev/null 2>&1
    local metrics
    metrics=$("$py" -c "import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:$((port + 1))/metrics').read().decode())" 2>/dev/null \
      | grep -E '^ringserve_speculative_(acceptance_rate|tokens_per_step|draft_tokens_total|accepted_tokens_total)' | tr '\n' ' ')
    "$py" - "$out/${name}_n$n.json" "$name" "$n" "$metrics" <<'PY' | tee -a "$out/table.md"
import json, sys
r = json.load(open(sys.argv[1]))
print(f"| {sys.argv[2]} | {sys.argv[3]} | {r['output_tokens_per_s']:.1f} | {sys.argv[4]} |")
PY
  done
  kill -INT $pid; wait $pid 2>/dev/null
}
echo "| ring | streams | tok/s | speculation (cumulative /metrics) |" >>"$out/table.md"
echo "| --- | ---: | ---: | --- |" >>"$out/table.md"
run_ring plain ""
run_ring spec "--speculative_model $PWD/models/ringserve-tiny-draft --num_speculative_tokens $k --speculative_max_sequences ${SPEC_MAX_SEQS:-4}"
cat "$out/table.md"
