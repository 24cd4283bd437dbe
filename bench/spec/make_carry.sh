#!/usr/bin/env bash
# Packs what bench/spec/device_run.sh needs into CARRY (default /work/main/.carry/h-spec):
# stage, coordinator and ringserve_loadgen from a CUDA build tree (stripped, xz), the shared
# libraries they need that the GPU machine lacks (as bench/ring/make_carry.sh decides), the
# training corpus (scripts/corpus/make_corpus.sh) and this directory's scripts; and
# stage/cuda/stage_cuda_model_slice_test when that build tree has it. The draft and the
# tokenizer come from models/ in the shipped tree.
# Usage: bench/spec/make_carry.sh BUILD_DIR CORPUS_DIR [CARRY]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=$1
corpus=$2
carry=${3:-/work/main/.carry/h-spec}
rm -rf "$carry"
mkdir -p "$carry/pack/bin" "$carry/pack/lib" "$carry/pack/corpus"
for b in stage/stage coordinator/coordinator bench/loadgen/ringserve_loadgen; do
  strip -o "$carry/pack/bin/$(basename "$b")" "$build/$b"
done
# The CUDA slice's GPU test, when built: device_run.sh runs its verification-chunk cases first.
if [ -x "$build/stage/cuda/stage_cuda_model_slice_test" ]; then
  strip -o "$carry/pack/bin/cuda_model_slice_test" "$build/stage/cuda/stage_cuda_model_slice_test"
fi
skip='linux-vdso|ld-linux|libc\.so|libm\.so|libstdc\+\+|libgcc_s|libcuda\.so|libnccl|libcudart|libcublas|libpthread|libdl\.so|librt\.so'
for b in "$carry"/pack/bin/*; do
  ldd "$b" | awk '/=> \//{print $3}' | grep -Ev "$skip" || true
done | sort -u | while read -r lib; do cp -L "$lib" "$carry/pack/lib/"; done
cp "$corpus"/train.txt "$corpus"/heldout.txt "$corpus"/SHA256SUMS "$carry/pack/corpus/"
cp scripts/train_small_model.py bench/spec/device_run.sh "$carry/pack/"
tar -cJf "$carry/pack.tar.xz" -C "$carry" pack
rm -rf "$carry/pack"
du -sh "$carry/pack.tar.xz"
