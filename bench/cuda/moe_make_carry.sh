#!/usr/bin/env bash
# Copies the CUDA MoE test and benchmark binaries (stripped, xz-compressed) from a build directory
# and the shared libraries they need that the device image lacks into .carry/h-moe/{bin,lib},
# with moe_run_on_device.sh as .carry/h-moe/run.sh and the transformers comparison script beside
# it. Skips the C/C++ runtime, the CUDA driver, cudart/cuBLAS (present there). Then, on the
# device: bash .carry/h-moe/run.sh. CARRY_NAME=x uses .carry/x instead.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
carry=.carry/${CARRY_NAME:-h-moe}
rm -rf "$carry"
mkdir -p "$carry/bin" "$carry/lib"
for b in stage/cuda/stage_cuda_moe_layer_test stage/cuda/stage_cuda_moe_golden_test \
         stage/cuda/stage_cuda_model_slice_test stage/cuda/stage_cuda_attention_variants_test \
         kernels/cuda/kernels_cuda_attention_test \
         kernels/cuda/kernels_cuda_ops_test bench/cuda/moe_bench; do
  strip -o "$carry/bin/$(basename "$b")" "$build/$b"
done
skip='linux-vdso|ld-linux|libc\.so|libm\.so|libstdc\+\+|libgcc_s|libcuda\.so|libnccl|libcudart|libcublas|libpthread|libdl\.so|librt\.so'
for b in "$carry"/bin/*; do
  ldd "$b" | awk '/=> \//{print $3}' | grep -Ev "$skip" || true
done | sort -u | while read -r lib; do cp -L "$lib" "$carry/lib/"; done
xz -T2 -6 "$carry"/bin/*
cp bench/cuda/moe_run_on_device.sh "$carry/run.sh"
cp bench/cuda/transformers_moe_decode.py "$carry/"
du -sh "$carry"
