#!/usr/bin/env bash
# Packs two builds' binaries for bench/ab/device_run.sh into .carry/ab.tar.xz: OLD (a baseline
# build tree) and NEW (this tree's build), stripped, with the shared libraries the GPU machine
# lacks (as bench/ring/make_carry.sh), plus NEW's gpu test binaries and optionally a second
# NEW build of other CUDA architectures (EXTRA=build80) for its gpu tests.
# Usage: bench/ab/make_carry.sh OLD_BUILD|- NEW_BUILD [EXTRA_BUILD]
set -euo pipefail
cd "$(dirname "$0")/../.."
old=$1 new=$2 extra=${3:-}
rm -rf .carry/ab .carry/ab.tar.xz
mkdir -p .carry/ab/old .carry/ab/new .carry/ab/lib
copy() {  # dest build paths...
  local dest=$1 build=$2; shift 2
  for b in "$@"; do
    [ -f "$build/$b" ] || { echo "missing $build/$b" >&2; exit 1; }
    strip -o "$dest/$(basename "$b")" "$build/$b"
  done
}
run_bins="stage/stage coordinator/coordinator bench/loadgen/ringserve_loadgen
  bench/model/make_random_model bench/cuda/stage_bench"
tests="kernels/cuda/kernels_cuda_ops_test kernels/cuda/kernels_cuda_attention_test
  kernels/cuda/kernels_cuda_sampling_test stage/cuda/stage_cuda_model_slice_test
  stage/cuda/stage_cuda_gpu_step_timer_test tests/ring/ring_gpu_test"
[ "$old" = - ] || copy .carry/ab/old "$old" $run_bins  # "-": the new build's tests only
copy .carry/ab/new "$new" $run_bins $tests
if [ -n "$extra" ]; then
  mkdir -p .carry/ab/extra
  copy .carry/ab/extra "$extra" stage/stage coordinator/coordinator $tests
fi
skip='linux-vdso|ld-linux|libc\.so|libm\.so|libstdc\+\+|libgcc_s|libcuda\.so|libnccl|libcudart|libcublas|libpthread|libdl\.so|librt\.so'
for b in .carry/ab/*/*; do
  ldd "$b" | awk '/=> \//{print $3}' | grep -Ev "$skip" || true
done | sort -u | while read -r lib; do cp -L "$lib" .carry/ab/lib/; done
tar -cJf .carry/ab.tar.xz -C .carry ab
rm -rf .carry/ab
du -sh .carry/ab.tar.xz
