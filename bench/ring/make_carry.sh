#!/usr/bin/env bash
# Copies the binaries bench/ring/device_run.sh needs (stripped) from a build tree and the shared
# libraries they need that the GPU machine's image lacks into .carry/ring/{bin,lib}. Skips the
# C/C++ runtime, the CUDA driver, cudart/cuBLAS (present there) and NCCL (taken from the
# machine's torch installation at run time).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
rm -rf .carry/ring
mkdir -p .carry/ring/bin .carry/ring/lib
bins="$build/stage/stage $build/coordinator/coordinator $build/bench/loadgen/ringserve_loadgen
      $build/bench/model/make_random_model $build/kernels/cuda/kernels_cuda_sampling_test
      $build/stage/cuda/stage_cuda_model_slice_test $build/stage/cuda/stage_cuda_gpu_step_timer_test
      $build/tests/ring/ring_gpu_test"
for b in $bins; do
  [ -f "$b" ] || { echo "missing $b" >&2; exit 1; }
  strip -o ".carry/ring/bin/$(basename "$b")" "$b"
done
# Only in builds that found NCCL (bench/ring/multigpu_run.sh runs it).
if [ -f "$build/stage/nccl/nccl_channel_test" ]; then
  strip -o .carry/ring/bin/nccl_channel_test "$build/stage/nccl/nccl_channel_test"
fi
skip='linux-vdso|ld-linux|libc\.so|libm\.so|libstdc\+\+|libgcc_s|libcuda\.so|libnccl|libcudart|libcublas|libpthread|libdl\.so|librt\.so'
for b in .carry/ring/bin/*; do
  ldd "$b" | awk '/=> \//{print $3}' | grep -Ev "$skip" || true
done | sort -u | while read -r lib; do cp -L "$lib" .carry/ring/lib/; done
du -sh .carry/ring/bin .carry/ring/lib
