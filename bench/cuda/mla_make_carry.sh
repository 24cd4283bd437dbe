#!/usr/bin/env bash
# Copies the DeepSeek/MLA CUDA tests and benchmarks (stripped, xz-compressed) from a build
# directory, the shared libraries they need that the device image lacks, and the fixture scripts
# into .carry/mla/{bin,lib,scripts}, with mla_run_on_device.sh as .carry/mla/run.sh. Skips the
# C/C++ runtime, the CUDA driver, cudart/cuBLAS (present there).
# Then, on the device (carry [".carry/mla"]): bash .carry/mla/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-cuda}
carry=.carry/mla
rm -rf "$carry"
mkdir -p "$carry/bin" "$carry/lib" "$carry/scripts"
for b in kernels/cuda/kernels_cuda_mla_decode_test kernels/cuda/kernels_cuda_mla_prepare_test \
         stage/cuda/stage_cuda_mla_attention_test stage/cuda/stage_cuda_mla_golden_test \
         stage/cuda/stage_cuda_mla_slice_test stage/cuda/stage_cuda_moe_golden_test \
         bench/cuda/mla_slice_bench bench/cuda/mla_decode_bench; do
  strip -o "$carry/bin/$(basename "$b")" "$build/$b"
done
skip='linux-vdso|ld-linux|libc\.so|libm\.so|libstdc\+\+|libgcc_s|libcuda\.so|libnccl|libcudart|libcublas|libpthread|libdl\.so|librt\.so'
for b in "$carry"/bin/*; do
  ldd "$b" | awk '/=> \//{print $3}' | grep -Ev "$skip" || true
done | sort -u | while read -r lib; do cp -L "$lib" "$carry/lib/"; done
xz -T2 -6 "$carry"/bin/*
cp scripts/make_mla_fixtures.py scripts/make_fixtures.py "$carry/scripts/"
cp bench/cuda/mla_run_on_device.sh "$carry/run.sh"
du -sh "$carry"
