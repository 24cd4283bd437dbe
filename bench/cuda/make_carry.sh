#!/usr/bin/env bash
# Copies the CUDA test and benchmark binaries (stripped) from build-cuda/ and the shared
# libraries they need that the device image lacks into .carry/cuda/{bin,lib}, for
# run_on_device.sh. Skips the C/C++ runtime, the CUDA driver, cudart/cuBLAS (present there).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-cuda}
rm -rf .carry/cuda
mkdir -p .carry/cuda/bin .carry/cuda/lib
bins="$build/kernels/cuda/kernels_cuda_ops_test $build/kernels/cuda/kernels_cuda_attention_test
      $build/kernels/cuda/kernels_cuda_quant_gemv_test
      $build/stage/cuda/stage_cuda_model_slice_test $build/bench/cuda/stage_bench"
for b in $bins; do
  [ -f "$b" ] || continue
  strip -o ".carry/cuda/bin/$(basename "$b")" "$b"
done
skip='linux-vdso|ld-linux|libc\.so|libm\.so|libstdc\+\+|libgcc_s|libcuda\.so|libnccl|libcudart|libcublas|libpthread|libdl\.so|librt\.so'
for b in .carry/cuda/bin/*; do
  ldd "$b" | awk '/=> \//{print $3}' | grep -Ev "$skip" || true
done | sort -u | while read -r lib; do cp -L "$lib" .carry/cuda/lib/; done
du -sh .carry/cuda
