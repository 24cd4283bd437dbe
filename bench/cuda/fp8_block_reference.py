#!/usr/bin/env python3
"""The peer row for FP8 block-scaled prefill GEMMs (issue 23): torch's _scaled_mm with DeepSeek's
scales (activations per token and 128 columns, weights per 128x128 block) against torch's bf16
matmul, on the Llama-3.1-8B layer's four GEMMs at M tokens. Prints one line per shape and the
layer's sum, or why torch refused the block-scaled form (its cuBLASLt has no algorithm for it on
this device). Run on the GPU machine: python fp8_block_reference.py [--tokens 8192]."""
import argparse

import torch


def timed(fn, reps=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps * 1000.0  # us


def block_scaled(x8, w8, sx, sw):
    """Tries the spellings torch has had for 1x128 x 128x128 scaling; returns a callable or the
    errors."""
    errors = []
    tries = [("_scaled_mm", lambda: torch._scaled_mm(x8, w8.t(), scale_a=sx, scale_b=sw.t(),
                                                       out_dtype=torch.bfloat16))]
    functional = getattr(torch.nn.functional, "scaled_mm", None)
    if functional is not None and hasattr(torch.nn.functional, "ScalingType"):
        st = torch.nn.functional.ScalingType
        tries.append(("F.scaled_mm", lambda: functional(
            x8, w8.t(), sx, st.BlockWise1x128, sw.t(), st.BlockWise128x128,
            output_dtype=torch.bfloat16)))
    for name, fn in tries:
        try:
            fn()
            torch.cuda.synchronize()
            return name, fn, errors
        except Exception as e:  # noqa: BLE001 - report whatever torch says
            errors.append(f"{name}: {str(e).splitlines()[0][:200]}")
    return None, None, errors


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=8192)
    args = ap.parse_args()
    m = args.tokens
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "cuda", torch.version.cuda,
          "cublas", torch._C._cuda_getCompiledVersion() if hasattr(torch._C, "_cuda_getCompiledVersion") else "")
    shapes = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
    total_bf16 = total_fp8 = 0.0
    for name, (n, k) in shapes.items():
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
        us_bf16 = timed(lambda: x @ w.t())
        x8 = x.to(torch.float8_e4m3fn)
        w8 = w.to(torch.float8_e4m3fn)
        # Activation scales [m, k/128] stored with m fastest; weight scales [n/128, k/128] (128x128).
        sx = torch.rand(k // 128, m, device="cuda").t()
        sw = torch.rand(n // 128, k // 128, device="cuda")
        how, fn, errors = block_scaled(x8, w8, sx, sw)
        if fn is None:
            print(f"{name} n={n} k={k}: bf16 {us_bf16:.0f} us; block-scaled FP8 refused: {errors}")
            continue
        us_fp8 = timed(fn)
        flops = 2.0 * m * n * k
        print(f"{name} n={n} k={k}: bf16 {us_bf16:.0f} us ({flops / us_bf16 / 1e6:.0f} TFLOP/s), "
              f"fp8 1x128x128x128 ({how}) {us_fp8:.0f} us ({flops / us_fp8 / 1e6:.0f} TFLOP/s), "
              f"{us_bf16 / us_fp8:.2f}x")
        total_bf16 += us_bf16
        total_fp8 += us_fp8
    if total_fp8:
        print(f"layer: bf16 {total_bf16:.0f} us, fp8 block-scaled {total_fp8:.0f} us, "
              f"{total_bf16 / total_fp8:.2f}x")


if __name__ == "__main__":
    main()
