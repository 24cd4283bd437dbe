#!/usr/bin/env bash
# On the GPU machine (device tool, carry .carry/ppl from make_carry.sh), in the repo root:
#   bash .carry/ppl/gpu_ring_run.sh
# The held-out perplexity of models/ringserve-tiny and models/ringserve-tiny-draft through a
# 2-stage ring with both stages on GPU 0 (cuda_ipc), then the GPU prompt-logprobs tests.
# Writes $OUT/ppl.log, $OUT/gpu_ring_<model>.json, $OUT/coord_<model>.log, $OUT/gpu_test.log.
set -uo pipefail
carry=.carry/ppl
root=/tmp/ringserve_ppl
mkdir -p "$root" && tar -xJf "$carry/bin.tar.xz" -C "$root"
bin=$root/build
export LD_LIBRARY_PATH=$root/lib:${LD_LIBRARY_PATH:-}
export RINGSERVE_SOURCE_DIR=$PWD RINGSERVE_BINARY_DIR=$bin
port=47311
for model in ringserve-tiny ringserve-tiny-draft; do
  port=$((port + 1))
  "$bin/coordinator/coordinator" --model "models/$model" --num_stages 2 --device cuda:0 \
    --channel cuda_ipc --listen "127.0.0.1:$port" --stage_binary "$bin/stage/stage" \
    > "$OUT/coord_$model.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 120); do
    grep -q "serving ringserve" "$OUT/coord_$model.log" && break
    sleep 0.25
  done
  timeout 120 "$bin/bench/perplexity/ringserve_perplexity" --server "127.0.0.1:$port" \
    --file "$carry/heldout.txt" --concurrency 16 --json "$OUT/gpu_ring_$model.json" 2>&1 |
    sed "s/^/$model: /" | tee -a "$OUT/ppl.log"
  kill -TERM "$pid"
  wait "$pid"
done
{
  timeout 120 "$bin/stage/cuda/stage_cuda_model_slice_test" --gtest_filter='*AllTokens*'
  timeout 180 "$bin/tests/ring/ring_gpu_logprobs_test"
} 2>&1 | tail -60 | tee "$OUT/gpu_test.log"
