#!/usr/bin/env bash
# Packs what bench/perplexity/gpu_ring_run.sh needs for the GPU machine into .carry/ppl/:
# bin.tar.xz (stripped stage, coordinator, ringserve_perplexity, the GPU logprobs tests and the
# shared libraries the machine's image lacks; not the C/C++ runtime, CUDA or NCCL) and the
# held-out text (scripts/corpus/make_corpus.sh).
# Usage: bench/perplexity/make_carry.sh [BUILD_DIR] [CORPUS_DIR]   (build, build/corpus)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
corpus=${2:-build/corpus}
out=.carry/ppl
stage_dir=$(mktemp -d)
trap 'rm -rf "$stage_dir"' EXIT
for b in stage/stage coordinator/coordinator bench/perplexity/ringserve_perplexity \
         tests/ring/ring_gpu_logprobs_test stage/cuda/stage_cuda_model_slice_test; do
  [ -f "$build/$b" ] || { echo "missing $build/$b" >&2; exit 1; }
  mkdir -p "$stage_dir/build/$(dirname "$b")"
  strip -o "$stage_dir/build/$b" "$build/$b"
done
mkdir -p "$stage_dir/lib"
skip='linux-vdso|ld-linux|libc\.so|libm\.so|libstdc\+\+|libgcc_s|libcuda\.so|libnccl|libcudart|libcublas|libpthread|libdl\.so|librt\.so'
find "$stage_dir/build" -type f | while read -r b; do
  ldd "$b" | awk '/=> \//{print $3}' | grep -Ev "$skip" || true
done | sort -u | while read -r lib; do cp -L "$lib" "$stage_dir/lib/"; done
rm -rf "$out" && mkdir -p "$out"
tar -C "$stage_dir" -cf - build lib | xz -T2 -6 > "$out/bin.tar.xz"
cp "$corpus/heldout.txt" bench/perplexity/gpu_ring_run.sh "$out/"
du -sh "$out"
