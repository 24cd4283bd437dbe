#!/usr/bin/env bash
# One call on the GPU machine (issue 24): speculative decoding against plain decoding on one H200.
# Trains a larger target with scripts/train_small_model.py and the committed tokenizer
# (TARGET_SHAPE, default 48x768: four times the layers of the 12x768 first measured, so that the
# 2-layer draft is relatively cheaper; STEPS of its cosine schedule, default 1000, within TRAIN_S
# seconds, default 150), then serves it from a 1-stage CUDA ring, once per entry of RINGS —
# plain; with the committed draft models/ringserve-tiny-draft on the last stage and the measured
# payoff deciding (spec); the same with speculation forced (spec-forced) — and
# measures 1 and 8 streams (greedy, a KJV prompt, MAX_TOKENS each) with ringserve_loadgen; reads
# the acceptance rate and tokens per verification step from /metrics. Results: $OUT/table.md,
# logs in $OUT.
# Run from the repository root with the carry unpacked or packed (bench/spec/make_carry.sh):
#   bash .carry/h-spec/pack/device_run.sh      (after: tar -xJf .carry/h-spec/pack.tar.xz -C .carry/h-spec)
# Env: TARGET_SHAPE, STEPS, TRAIN_S, DURATION_S (default 6), MAX_TOKENS (default 128),
# RINGS (default "plain spec spec-forced"; also spec-hostfed: the draft's rounds through the host;
# plain2, plain3...: plain again, to see the device's drift between rings),
# K (default 4), SPEC_MAX_SEQS (default 16: no speculation above it; below it the measured
# payoff decides, coordinator/scheduler/speculation_payoff.h), STREAMS ("1 8"),
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
shape=${TARGET_SHAPE:-48x768}
k=${K:-4}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | tee "$out/gpu.txt"
if [ -x "$pack/bin/cuda_model_slice_test" ]; then  # verification chunks in CUDA graphs
  RINGSERVE_SOURCE_DIR=$PWD "$pack/bin/cuda_model_slice_test" \
    --gtest_filter='*Verification*:*MatchesCpuLogitsAndGreedy*:*OneStream*' 2>&1 | tail -15 \
    | tee "$out/gpu_test.txt"
fi

start=$(date +%s)
if [ -n "${TARGET:-}" ]; then
  target=$(realpath "$TARGET")
  echo "target $target (not trained here)" | tee "$out/table.md"
else
  "$py" "$pack/train_small_model.py" --corpus "$pack/corpus" --out /tmp/rs_spec_trained \
  --target-shape "$shape" --tokenizer models/ringserve-tiny/tokenizer.json \
  --max-train-seconds "${TRAIN_S:-150}" --steps "${STEPS:-1000}" --eval-every 100000 >"$out/train.log" 2>&1 \
  || { tail -20 "$out/train.log"; exit 1; }
target=/tmp/rs_spec_trained/ringserve-target-$shape
echo "target $shape trained in $(( $(date +%s) - start )) s: $(grep -E 'best|step .*loss' "$out/train.log" | tail -1)" \
  | tee "$out/table.md"
fi

prompt="And it came to pass, when the king of Israel heard the words of the book of the law, that he rent his clothes. And the king commanded"
port=50350
metrics() {  # the speculation counters of the ring on $port
  "$py" -c "import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:$((port + 1))/metrics').read().decode())" 2>/dev/null \
    | grep -E '^ringserve_speculative_(verifications|draft_tokens|accepted_tokens)_total'
}
run_ring() {  # name "coordinator flags" ["VAR=value ..." for the coordinator and its stages]
  local name=$1 flags=$2 vars=${3:-}
  port=$((port + 2))
  local log=$out/coord_$name.log
  pack_bin=$pack/bin
  env $vars "$pack_bin/coordinator" --model "$target" --num_stages 1 --device "${DEVICE:-cuda:0}" \
    --stage_binary "$pack_bin/stage" --listen 127.0.0.1:$port --http_listen 127.0.0.1:$((port + 1)) \
    $flags >"$log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 120); do
    grep -q "serving ringserve.v1.Generate" "$log" 2>/dev/null && break
    kill -0 $pid 2>/dev/null || { echo "$name: coordinator exited"; tail -20 "$log"; return; }
    sleep 0.5
  done
  # One greedy completion, to compare the speculating ring's text with the plain ring's.
  "$py" - "http://127.0.0.1:$((port + 1))" "$prompt" >"$out/${name}_greedy.txt" 2>&1 <<'PY'
import json, sys, urllib.request
base, prompt = sys.argv[1], sys.argv[2]
model = json.load(urllib.request.urlopen(base + "/v1/models"))["data"][0]["id"]
body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 128, "temperature": 0}).encode()
req = urllib.request.Request(base + "/v1/completions", body, {"Content-Type": "application/json"})
print(json.load(urllib.request.urlopen(req))["choices"][0]["text"])
PY
  for n in ${STREAMS:-1 8}; do
    "$pack_bin/ringserve_loadgen" --target 127.0.0.1:$port --streams "$n" --requests "$n" \
      --prompt_text "$prompt" --max_tokens 16 --temperature 0 --quiet >/dev/null 2>&1  # warm-up
    # A first pass of the same run meets the verification chunks' graph shapes (GEMM tuning and
    # capture, ~0.1 s each) and the payoff's probing; the second pass is the figure.
    for pass in cold ""; do
    local before
    before=$(metrics)
    timeout 60 "$pack_bin/ringserve_loadgen" --target 127.0.0.1:$port --streams "$n" \
      --prompt_text "$prompt" --max_tokens "${MAX_TOKENS:-128}" --temperature 0 \
      --duration_s "${DURATION_S:-6}" --quiet --json "$out/${name}${pass:+-$pass}_n$n.json" >/dev/null 2>&1
    # The speculation counters of this run alone (the /metrics counters are cumulative).
    "$py" - "$out/${name}${pass:+-$pass}_n$n.json" "$name${pass:+-$pass}" "$n" "$before" "$(metrics)" <<'PY' | tee -a "$out/table.md"
import json, sys
r = json.load(open(sys.argv[1]))
def parse(text):
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and not line.startswith("#"):
            out[parts[0].split("{")[0]] = float(parts[-1])
    return out
b, a = parse(sys.argv[4]), parse(sys.argv[5])
d = {k: a.get(k, 0) - b.get(k, 0) for k in a}
ver = d.get("ringserve_speculative_verifications_total", 0)
drafts = d.get("ringserve_speculative_draft_tokens_total", 0)
acc = d.get("ringserve_speculative_accepted_tokens_total", 0)
spec = (f"{ver:.0f} verifications, {acc:.0f}/{drafts:.0f} drafts accepted"
        f" ({100 * acc / drafts:.1f}%), {(ver + acc) / ver:.2f} tokens/verification" if ver else "none")
print(f"| {sys.argv[2]} | {sys.argv[3]} | {r['output_tokens_per_s']:.1f} | {spec} |")
PY
    done
  done
  kill -INT $pid; wait $pid 2>/dev/null
}
echo "| ring | streams | tok/s | speculation in this run (/metrics deltas) |" >>"$out/table.md"
echo "| --- | ---: | ---: | --- |" >>"$out/table.md"
spec_flags="--speculative_model $PWD/models/ringserve-tiny-draft --num_speculative_tokens $k --speculative_max_sequences ${SPEC_MAX_SEQS:-16}"
for ring in ${RINGS:-plain spec spec-forced}; do
  case $ring in
    plain*) run_ring "$ring" "" ;;  # plain2 ...: plain again, for the device's drift
    spec) run_ring spec "$spec_flags" ;;  # the measured payoff decides
    spec-forced) run_ring spec-forced "$spec_flags --speculative_payoff=false" ;;
    spec-hostfed) run_ring spec-hostfed "$spec_flags" RINGSERVE_DRAFT_FED_ROUNDS=0 ;;
  esac
  # Where a step's time went (the stage's exit log: speculating steps, the turn between steps).
  grep -hE "steps \(|speculating steps|with none in flight" "$out/coord_$ring.log" \
    | sed "s/^/$ring: /" >>"$out/timing.txt"
done
for greedy in "$out"/spec*_greedy.txt; do
  [ -f "$greedy" ] || continue
  if cmp -s "$out/plain_greedy.txt" "$greedy"; then
    echo "greedy 128-token completion: $(basename "$greedy") identical to plain" | tee -a "$out/table.md"
  else
    echo "greedy 128-token completion: $(basename "$greedy") DIFFERS from plain_greedy.txt" | tee -a "$out/table.md"
  fi
done
cat "$out/table.md" "$out/timing.txt"
