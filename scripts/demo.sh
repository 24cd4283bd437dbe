#!/usr/bin/env bash
# The main job: builds if needed, starts a coordinator with local stage processes (the embedded
# default: no hosts file) on a small model, generates text through the gRPC API with
# ringserve_client, prints the ring's statistics, and shuts everything down.
#
# Usage: scripts/demo.sh [--num_stages N] [--model DIR] [ringserve_client flags...]
#   e.g. scripts/demo.sh --num_stages 3 --prompt "The ring" --max_tokens 32 --temperature 0.8
# Without --model it uses models/ringserve-tiny: a small Llama trained on the King James Bible
# and The Devil's Dictionary (scripts/train_small_model.py), so the output reads as English.
# RINGSERVE_BUILD_DIR (default build) picks another build tree.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${RINGSERVE_BUILD_DIR:-build}"

num_stages=3
model=""
client_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --num_stages|--num-stages) num_stages="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    *) client_args+=("$1"); shift ;;
  esac
done

if [ ! -x "$build"/coordinator/coordinator ] || [ ! -x "$build"/stage/stage ] ||
   [ ! -x "$build"/coordinator/ringserve_client ]; then
  scripts/install_deps.sh
  if [ "$build" = build ]; then
    scripts/build.sh
  else
    ninja -C "$build" stage coordinator ringserve_client
  fi
fi

work="$(mktemp -d)"
coordinator_pid=""
cleanup() {
  if [ -n "$coordinator_pid" ] && kill -0 "$coordinator_pid" 2>/dev/null; then
    kill -TERM "$coordinator_pid" 2>/dev/null || true
    wait "$coordinator_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

default_prompt=()
if [ -z "$model" ]; then
  model="models/ringserve-tiny"
  default_prompt=(--prompt "And God said unto Moses," --temperature 0.7 --top_p 0.9 --seed 7)
fi
has_prompt=0
for a in "${client_args[@]+"${client_args[@]}"}"; do
  case "$a" in --prompt|--prompt_ids|--prompt-ids|--prompt=*|--prompt_ids=*) has_prompt=1 ;; esac
done
if [ "$has_prompt" = 0 ]; then client_args+=("${default_prompt[@]}"); fi

echo "demo: coordinator with $num_stages local stage processes on $model"
"$build"/coordinator/coordinator --model "$model" --num_stages "$num_stages" \
  --listen 127.0.0.1:0 --ready_fd 3 3>"$work/address" &
coordinator_pid=$!

# Wait (bounded) for the coordinator to write its address once it serves.
for _ in $(seq 1 600); do
  if [ -s "$work/address" ]; then break; fi
  if ! kill -0 "$coordinator_pid" 2>/dev/null; then
    echo "demo: the coordinator exited during start-up" >&2
    exit 1
  fi
  sleep 0.1
done
address="$(head -n1 "$work/address")"
if [ -z "$address" ]; then echo "demo: the coordinator did not start within 60 s" >&2; exit 1; fi

echo "demo: generating through ringserve.v1.Generate on $address"
echo "----"
"$build"/coordinator/ringserve_client --target "$address" --max_tokens 48 "${client_args[@]}"
echo "----"
"$build"/coordinator/ringserve_client --target "$address" --stats

kill -TERM "$coordinator_pid"
wait "$coordinator_pid"
coordinator_pid=""
echo "demo: coordinator and stages shut down"
