#!/usr/bin/env bash
# Packs one combined GPU check (bench/gpu_checks/run.sh) into CARRY (default .carry/gpu): every
# test that ctest labels `gpu` (except the two-rank NCCL test), the stage, coordinator, load
# generator and CUDA benchmarks, all stripped into one xz tarball; the shared libraries they need
# that the GPU machine's image lacks (as bench/ring/make_carry.sh decides); the fixture and
# training scripts and the training corpus (scripts/corpus/make_corpus.sh OUT).
# Usage: bench/gpu_checks/make_carry.sh BUILD_DIR CORPUS_DIR [CARRY]
# Then on the GPU machine (carry [".carry/gpu"]): bash bench/gpu_checks/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
build=$1
corpus=$2
carry=${3:-.carry/gpu}
rm -rf "$carry"
mkdir -p "$carry/pack/bin" "$carry/pack/lib" "$carry/pack/corpus"
tests=$(ctest --test-dir "$build" -L gpu --show-only=json-v1 | python3 -c '
import json, sys
for t in json.load(sys.stdin)["tests"]:
    if t["name"] != "nccl_channel_test":
        print(t["command"][0])')
tools="stage/stage coordinator/coordinator bench/loadgen/ringserve_loadgen bench/cuda/stage_bench
       bench/cuda/moe_bench bench/cuda/mla_slice_bench bench/cuda/mla_decode_bench
       bench/model/make_random_model"
for b in $tests $(for t in $tools; do echo "$build/$t"; done); do
  strip -o "$carry/pack/bin/$(basename "$b")" "$b"
done
skip='linux-vdso|ld-linux|libc\.so|libm\.so|libstdc\+\+|libgcc_s|libcuda\.so|libnccl|libcudart|libcublas|libpthread|libdl\.so|librt\.so'
for b in "$carry"/pack/bin/*; do
  ldd "$b" | awk '/=> \//{print $3}' | grep -Ev "$skip" || true
done | sort -u | while read -r lib; do cp -L "$lib" "$carry/pack/lib/"; done
cp "$corpus"/train.txt "$corpus"/heldout.txt "$corpus"/SHA256SUMS "$carry/pack/corpus/"
cp scripts/make_mla_fixtures.py scripts/make_fixtures.py scripts/train_small_model.py "$carry/pack/"
tar -cf - -C "$carry" pack | xz -T1 --lzma2=preset=6,dict=256MiB > "$carry/pack.tar.xz"
rm -rf "$carry/pack"
du -sh "$carry/pack.tar.xz"
