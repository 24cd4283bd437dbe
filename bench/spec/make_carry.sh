#!/usr/bin/env bash
# Packs what bench/spec/device_run.sh needs into CARRY (default /work/main/.carry/h-spec):
# stage, coordinator and ringserve_loadgen from a CUDA build tree (stripped, xz), the shared
# libraries they need that the GPU machine lacks (as bench/ring/make_carry.sh decides), the
# training corpus (scripts/corpus/make_corpus.sh) and this directory's scripts; and the test
# binaries named in EXTRA_BINS. The draft and the tokenizer come from models/ in the shipped
# tree.
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
# Test binaries named in EXTRA_BINS (paths in the build tree), e.g.
# tests/ring/speculative_gpu_ring_test. Each CUDA binary is ~7 MB packed: the tree and the carry
# together must stay within the device's 64 MiB. stage/cuda/stage_cuda_model_slice_test, named
# there, is run by device_run.sh (its verification-chunk cases) under the name
# cuda_model_slice_test.
for b in ${EXTRA_BINS:-}; do
  name=$(basename "$b")
  [ "$name" = stage_cuda_model_slice_test ] && name=cuda_model_slice_test
  strip -o "$carry/pack/bin/$name" "$build/$b"
done
# Not packed: what the GPU machine's Ubuntu 24.04 and CUDA have (the second line was seen absent
# from a carry that ran there, 2026-12-07).
skip='linux-vdso|ld-linux|libc\.so|libm\.so|libstdc\+\+|libgcc_s|libcuda\.so|libnccl|libcudart|libcublas|libpthread|libdl\.so|librt\.so'
skip="$skip|libcrypto|libssl|libz\.so|libzstd|liblzma|liblz4|libsystemd|libcap\.so|libgcrypt|libgpg-error|libpcre2"

for b in "$carry"/pack/bin/*; do
  ldd "$b" | awk '/=> \//{print $3}' | grep -Ev "$skip" || true
done | sort -u | while read -r lib; do cp -L "$lib" "$carry/pack/lib/"; done
cp "$corpus"/train.txt "$corpus"/heldout.txt "$corpus"/SHA256SUMS "$carry/pack/corpus/"
cp scripts/train_small_model.py bench/spec/device_run.sh "$carry/pack/"
# The tree and the carry together must stay within 64 MiB: the strongest xz preset, with the
# x86 filter for the machine code (about 2% smaller).
tar -cf - -C "$carry" pack | xz -T1 --x86 --lzma2=preset=9e,dict=128MiB >"$carry/pack.tar.xz"
rm -rf "$carry/pack"
du -sh "$carry/pack.tar.xz"
