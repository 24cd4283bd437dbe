#!/usr/bin/env bash
# One call on the GPU machine, from binaries built elsewhere and carried in .carry/ring/{bin,lib}
# (bench/ring/make_carry.sh): the gpu-labelled tests, then the ring benchmark of issue 6 —
# a random-weight Llama-3.1-8B-shaped model (bf16), 1, 2 and 4 stages on ONE GPU over
# cuda_ipc, at 1/8/32/64 streams (128-token prompts), decode spreading against packing — with
# ringserve_loadgen against the real coordinator. Logs and JSON go to $OUT; a table is printed
# last. Env: DURATION_S (default 3), SKIP_TESTS=1, STREAMS="1 8 32 64".
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/rs_out}
mkdir -p "$out"
nccl_dir=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib
export LD_LIBRARY_PATH="$PWD/.carry/ring/lib:$nccl_dir:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export RINGSERVE_SOURCE_DIR="$PWD" RINGSERVE_BINARY_DIR="$PWD/.carry/ring/tree"
bin=$PWD/.carry/ring/bin
duration=${DURATION_S:-3}
streams=${STREAMS:-1 8 32 64}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"

# The ring tests find the binaries in the build-tree layout.
mkdir -p .carry/ring/tree/stage .carry/ring/tree/coordinator
ln -sf "$bin/stage" .carry/ring/tree/stage/stage
ln -sf "$bin/coordinator" .carry/ring/tree/coordinator/coordinator

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  for t in kernels_cuda_sampling_test stage_cuda_model_slice_test ring_gpu_test; do
    [ -x "$bin/$t" ] || { echo "$t: not carried" | tee -a "$out/tests.txt"; continue; }
    start=$(date +%s)
    timeout 150 "$bin/$t" --gtest_brief=1 >"$out/$t.log" 2>&1
    rc=$?
    echo "$t rc=$rc $(( $(date +%s) - start )) s" | tee -a "$out/tests.txt"
    [ $rc -ne 0 ] && grep -E "Failure|Expected|Which is|error|FAILED|differ" "$out/$t.log" | head -30
  done
fi

model=/tmp/llama8b
start=$(date +%s)
"$bin/make_random_model" --shape llama-3.1-8b --out "$model" --dtype bf16 >"$out/model.log" 2>&1 \
  || { cat "$out/model.log"; exit 1; }
echo "model written in $(( $(date +%s) - start )) s" | tee -a "$out/tests.txt"

port=50151
run_ring() {  # name partition packing streams...
  local name=$1 partition=$2 packing=$3; shift 3
  local log="$out/coord_$name.log"
  port=$((port + 1))
  "$bin/coordinator" --model "$model" --partition "$partition" --device cuda:0 \
    --channel cuda_ipc --packing "$packing" --listen 127.0.0.1:$port >"$log" 2>&1 &
  local pid=$!
  local ok=0
  for _ in $(seq 1 120); do
    grep -q "serving" "$log" 2>/dev/null && { ok=1; break; }
    kill -0 $pid 2>/dev/null || break
    sleep 0.5
  done
  if [ $ok != 1 ]; then echo "$name: coordinator did not come up"; tail -20 "$log"; kill $pid; return; fi
  for n in "$@"; do
    timeout $((duration + 60)) "$bin/ringserve_loadgen" --target 127.0.0.1:$port --streams "$n" \
      --prompt-tokens 128 --max-tokens 96 --duration-s "$duration" --seed 1 --quiet \
      --json "$out/${name}_n$n.json" >"$out/${name}_n$n.txt" 2>&1 || echo "$name n=$n: loadgen rc=$?"
  done
  kill -INT $pid; wait $pid 2>/dev/null
}
run_ring s1 32x1 spread $streams
run_ring s2_spread 16x2 spread $streams
run_ring s4_spread 8x4 spread $streams
run_ring s2_packed 16x2 packed 8 32 64
run_ring s4_packed 8x4 packed 8 32 64

python3 - "$out" <<'PY'
import json, glob, os, sys
out = sys.argv[1]
rows = {}
for f in sorted(glob.glob(os.path.join(out, "*_n*.json"))):
    name, n = os.path.basename(f)[:-5].rsplit("_n", 1)
    j = json.load(open(f))
    busy = [s.get("busy_fraction_run", 0) for s in j.get("stages", [])]
    rows[(name, int(n))] = (j["output_tokens_per_s"], j["ttft_ms"].get("p50", 0),
                            j["itl_ms"].get("p50", 0), j["itl_ms"].get("p99", 0), busy)
base = {n: v[0] for (name, n), v in rows.items() if name == "s1"}
print("| ring | streams | tok/s | of 1 stage | TTFT p50 ms | ITL p50 ms | ITL p99 ms | stage busy (run) |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
for (name, n), (tps, ttft, itl50, itl99, busy) in sorted(rows.items(), key=lambda kv: (kv[0][0], kv[0][1])):
    rel = f"{tps / base[n]:.1%}" if base.get(n) else "-"
    print(f"| {name} | {n} | {tps:,.1f} | {rel} | {ttft:.1f} | {itl50:.2f} | {itl99:.2f} | "
          + " ".join(f"{b:.2f}" for b in busy) + " |")
PY
cat "$out/tests.txt"
