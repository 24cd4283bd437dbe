#!/usr/bin/env python3
"""Transformers' decode speed on the Qwen3-30B-A3B shape (random bf16 weights on the GPU): the
comparison row of issue 21, run in the same device call as moe_bench so the ratio is like for
like.

Each (mode, streams) row: `streams` sequences of --prompt random tokens prefilled in one batch,
then --warmup untimed and --steps timed greedy decode steps (one token per sequence per step,
the KV cache growing), CUDA-synchronized; prints tok/s = streams * steps / seconds. Modes:
  eager:<experts>    dynamic cache (transformers' default), experts backend <experts>
                     ("eager": a loop over the chosen experts; "grouped_mm": one grouped GEMM)
  static:<experts>   StaticCache (fixed shapes)
  compile:<experts>  StaticCache and torch.compile of the forward (slow to build: opt-in)
The last line names the fastest mode per stream count.

  python3 bench/cuda/transformers_moe_decode.py [--layers 48] [--streams 32,64]
      [--modes eager:eager,eager:grouped_mm,static:grouped_mm] [--steps 8] [--prompt 128]
"""
import argparse
import gc
import sys
import time

import torch
import transformers
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM


def make_model(layers, experts_impl):
    config = Qwen3MoeConfig(
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=6144,
        moe_intermediate_size=768,
        num_hidden_layers=layers,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        num_experts=128,
        num_experts_per_tok=8,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )
    config._attn_implementation = "sdpa"
    try:
        config._experts_implementation = experts_impl
    except Exception as e:  # older transformers: one experts path only
        print(f"note: experts implementation not settable ({e})", flush=True)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = Qwen3MoeForCausalLM(config)
    torch.set_default_dtype(torch.float32)
    with torch.no_grad():  # uniform random weights (no NaNs from uninitialized memory)
        for p in model.parameters():
            p.uniform_(-0.035, 0.035)
    if hasattr(model, "set_experts_implementation"):
        try:
            model.set_experts_implementation(experts_impl)
        except Exception as e:
            print(f"note: set_experts_implementation({experts_impl}) failed: {e}", flush=True)
    model.eval()
    return model, config


def run_row(model, config, cache_kind, compiled, streams, prompt, warmup, steps):
    vocab = config.vocab_size
    ids = torch.randint(3, vocab, (streams, prompt), device="cuda")
    total = prompt + warmup + steps + 1
    cache = None
    if cache_kind == "static":
        from transformers import StaticCache

        cache = StaticCache(config=config, max_batch_size=streams, max_cache_len=total,
                            device="cuda", dtype=torch.bfloat16) if _static_takes_batch() else \
            StaticCache(config=config, max_cache_len=total)
    else:
        from transformers import DynamicCache

        cache = DynamicCache(config=config) if _dynamic_takes_config() else DynamicCache()
    forward = model.forward
    if compiled:
        forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=False)
    with torch.inference_mode():
        out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1,
                    cache_position=torch.arange(prompt, device="cuda"))
        nxt = out.logits[:, -1:].argmax(-1)
        pos = prompt
        t0 = None
        for i in range(warmup + steps):
            if i == warmup:
                torch.cuda.synchronize()
                t0 = time.perf_counter()
            out = forward(input_ids=nxt, past_key_values=cache, use_cache=True, logits_to_keep=1,
                          cache_position=torch.tensor([pos], device="cuda"))
            nxt = out.logits[:, -1:].argmax(-1)
            pos += 1
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
    return streams * steps / seconds, seconds / steps


def _static_takes_batch():
    import inspect

    from transformers import StaticCache

    return "max_batch_size" in inspect.signature(StaticCache.__init__).parameters


def _dynamic_takes_config():
    import inspect

    from transformers import DynamicCache

    return "config" in inspect.signature(DynamicCache.__init__).parameters


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--streams", default="32,64")
    ap.add_argument("--modes", default="eager:eager,eager:grouped_mm,static:grouped_mm")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--budget_s", type=float, default=240, help="skip rows after this long")
    args = ap.parse_args()
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()}, Qwen3-30B-A3B shape with {args.layers} layers",
          flush=True)
    start = time.time()
    best = {}
    model, config, model_experts = None, None, None
    for mode in args.modes.split(","):
        cache_kind, experts = mode.split(":")
        if experts != model_experts:
            model, config = None, None  # one model on the GPU at a time
            gc.collect()
            torch.cuda.empty_cache()
            model, config = make_model(args.layers, experts)
            model_experts = experts
        for streams in [int(s) for s in args.streams.split(",")]:
            if time.time() - start > args.budget_s:
                print(f"transformers {mode} {streams} streams: skipped (budget)", flush=True)
                continue
            try:
                tps, step = run_row(model, config, "static" if cache_kind != "eager" else "dynamic",
                                    cache_kind == "compile", streams, args.prompt, args.warmup,
                                    args.steps)
            except Exception as e:  # report and go on with the other modes
                print(f"transformers {mode} {streams} streams: failed: {type(e).__name__}: "
                      f"{str(e)[:300]}", flush=True)
                continue
            print(f"transformers {mode} {streams} streams: {tps:.1f} tok/s "
                  f"({step * 1e3:.2f} ms/step)", flush=True)
            if tps > best.get(streams, (0, ""))[0]:
                best[streams] = (tps, mode)
    for streams, (tps, mode) in sorted(best.items()):
        print(f"transformers fastest at {streams} streams: {mode} {tps:.1f} tok/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
