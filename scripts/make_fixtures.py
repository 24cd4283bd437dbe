#!/usr/bin/env python3
"""Writes the golden model fixtures (tests/fixtures/models/<arch>/) with Hugging Face transformers.

For each supported architecture: a tiny random-weight model (fp32 safetensors + config.json, as
transformers' save_pretrained writes them), and golden.json + golden.bin with transformers' logits
for every position of a few prompts (each run on its own, no padding) and a 16-token greedy
continuation of each prompt with the logits of every step.

Weights are drawn from a seeded generator (matrices ~ N(0, init_std), norm weights ~ 1 + N(0, 0.1),
biases ~ N(0, 0.1), so norms and biases matter). Seeds are tried in order until every greedy
choice (every prompt's last position and every continuation step) has a top1 - top2 logit margin
of at least MARGIN_REL * max|logit| of its row, so that a conforming implementation cannot flip
a greedy choice through rounding. Runs on CPU in fp32 with eager attention.

Usage: python3 scripts/make_fixtures.py --out DIR   (then copy DIR/* to tests/fixtures/models/)
"""
import argparse
import json
import os
import struct
import sys
import time

import torch
import transformers

MARGIN_REL = 1e-2
GREEDY_STEPS = 16
PROMPT_LENGTHS = [5, 12, 27]
MAX_SEEDS = 4000
SEED_TIME_LIMIT_S = 50.0

ARCHS = {
    # GQA 4:2, llama3 RoPE scaling (small original max so all three frequency bands occur),
    # attention_bias (q/k/v/o bias), 4 layers.
    "llama": dict(
        cls="LlamaForCausalLM", cfg="LlamaConfig",
        kw=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=512,
                max_position_embeddings=256, rms_norm_eps=1e-5, attention_bias=True,
                mlp_bias=False, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2),
        rope=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                  high_freq_factor=4.0, original_max_position_embeddings=32)),
    # MQA (4 heads, 1 kv head), no sliding window; written as 2 shards + index.
    "mistral": dict(
        cls="MistralForCausalLM", cfg="MistralConfig",
        kw=dict(hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=1, head_dim=16, vocab_size=384,
                max_position_embeddings=256, rms_norm_eps=1e-5, sliding_window=None,
                tie_word_embeddings=False, bos_token_id=1, eos_token_id=2),
        rope=dict(rope_type="default", rope_theta=10000.0),
        shards=2),
    # q/k/v bias (always on in Qwen2), GQA 4:2.
    "qwen2": dict(
        cls="Qwen2ForCausalLM", cfg="Qwen2Config",
        kw=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, vocab_size=448,
                max_position_embeddings=256, rms_norm_eps=1e-6, use_sliding_window=False,
                tie_word_embeddings=False, bos_token_id=1, eos_token_id=2),
        rope=dict(rope_type="default", rope_theta=1000000.0)),
    # q/k norm, head_dim 32 != hidden / heads, tied embeddings, eos as a list.
    "qwen3": dict(
        cls="Qwen3ForCausalLM", cfg="Qwen3Config",
        kw=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=512,
                max_position_embeddings=256, rms_norm_eps=1e-6, attention_bias=False,
                use_sliding_window=False, tie_word_embeddings=True, bos_token_id=1,
                eos_token_id=[2, 3]),
        rope=dict(rope_type="default", rope_theta=1000000.0)),
    # Variants (written only when --only names them): sliding windows shorter than the prompts.
    # Mistral-7B-v0.1's kind: every layer slides (window 8), GQA 4:2.
    "mistral_window": dict(
        cls="MistralForCausalLM", cfg="MistralConfig",
        kw=dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=384,
                max_position_embeddings=256, rms_norm_eps=1e-5, sliding_window=8,
                tie_word_embeddings=False, bos_token_id=1, eos_token_id=2),
        rope=dict(rope_type="default", rope_theta=10000.0)),
    # Qwen2 with use_sliding_window: layers from max_window_layers (1) on slide (window 8).
    "qwen2_window": dict(
        cls="Qwen2ForCausalLM", cfg="Qwen2Config",
        kw=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, vocab_size=448,
                max_position_embeddings=256, rms_norm_eps=1e-6, use_sliding_window=True,
                sliding_window=8, max_window_layers=1, tie_word_embeddings=False,
                bos_token_id=1, eos_token_id=2),
        rope=dict(rope_type="default", rope_theta=1000000.0)),
    # Qwen2.5-style YaRN (factor 4 over 16 original positions, prompts past them); factor is not
    # max_position_embeddings / original (256 / 16), so the fixture tells which transformers uses.
    "qwen2_yarn": dict(
        cls="Qwen2ForCausalLM", cfg="Qwen2Config",
        kw=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, vocab_size=320,
                max_position_embeddings=256, rms_norm_eps=1e-6, use_sliding_window=False,
                tie_word_embeddings=False, bos_token_id=1, eos_token_id=2),
        rope=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                  original_max_position_embeddings=16)),
}
VARIANTS = {"mistral_window", "qwen2_window", "qwen2_yarn"}
INIT_STD = 0.08


def make_config(spec):
    cfg_cls = getattr(transformers, spec["cfg"])
    rope = dict(spec["rope"])
    cfg = cfg_cls(rope_parameters=rope, **spec["kw"])
    if not getattr(cfg, "rope_parameters", None):  # transformers 4 spelling
        cfg.rope_theta = rope["rope_theta"]
        if rope["rope_type"] != "default":
            cfg.rope_scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    return cfg


def build_model(spec, cfg):
    cls = getattr(transformers, spec["cls"])
    model = cls(cfg)
    try:
        model.set_attn_implementation("eager")
    except Exception:  # older transformers
        model.config._attn_implementation = "eager"
    return model.float().eval()


@torch.no_grad()
def set_weights(model, seed):
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
        elif name.endswith("bias"):
            p.copy_(0.1 * torch.randn(p.shape, generator=gen))
        else:
            p.copy_(INIT_STD * torch.randn(p.shape, generator=gen))


def margin_ok(row):
    top = torch.topk(row, 2).values
    margin = (top[0] - top[1]).item()
    scale = row.abs().max().item()
    return margin / scale, margin >= MARGIN_REL * scale


@torch.no_grad()
def run_prompts(model, prompts, stop_early):
    """Returns (prompt_logits, greedy_tokens, greedy_logits, min_rel_margin, ok)."""
    out = []
    min_rel = float("inf")
    ok_all = True
    for ids in prompts:
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
        seq = list(ids)
        toks, rows = [], []
        for step in range(GREEDY_STEPS):
            row = logits[-1] if step == 0 else model(
                input_ids=torch.tensor([seq])).logits[0, -1].float()
            rel, ok = margin_ok(row)
            min_rel = min(min_rel, rel)
            ok_all = ok_all and ok
            if not ok and stop_early:
                return None, min_rel, False
            tok = int(torch.argmax(row).item())
            toks.append(tok)
            rows.append(row.clone())
            seq.append(tok)
        out.append((logits.clone(), toks, torch.stack(rows)))
    return out, min_rel, ok_all


def save_sharded(model, d, num_shards):
    total = sum(p.numel() * p.element_size() for p in model.state_dict().values())
    model.save_pretrained(d, max_shard_size=int(total / num_shards * 1.05) + 1)
    index = os.path.join(d, "model.safetensors.index.json")
    if not os.path.exists(index):
        raise RuntimeError("save_pretrained did not shard")
    with open(index) as f:
        files = set(json.load(f)["weight_map"].values())
    return sorted(files)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    torch.manual_seed(0)
    summary = {"transformers": transformers.__version__, "torch": torch.__version__}
    print(f"transformers {transformers.__version__} torch {torch.__version__}")
    for arch, spec in ARCHS.items():
        if (arch not in args.only.split(",")) if args.only else arch in VARIANTS:
            continue
        t0 = time.time()
        cfg = make_config(spec)
        model = build_model(spec, cfg)
        vocab = cfg.vocab_size
        pgen = torch.Generator().manual_seed(1234)
        prompts = [torch.randint(0, vocab, (n,), generator=pgen).tolist() for n in PROMPT_LENGTHS]
        best = (-1.0, None)
        chosen = None
        tried = 0
        for seed in range(MAX_SEEDS):
            tried += 1
            set_weights(model, seed)
            _, min_rel, ok = run_prompts(model, prompts, stop_early=True)
            if ok:
                chosen = seed
                break
            if min_rel > best[0]:
                best = (min_rel, seed)
            if time.time() - t0 > SEED_TIME_LIMIT_S:
                break
        if chosen is None:
            chosen = best[1]
            print(f"{arch}: no seed met margin {MARGIN_REL}; using best seed {chosen}")
        set_weights(model, chosen)
        if cfg.tie_word_embeddings:
            if model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
                model.tie_weights()
            assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
        results, min_rel, ok = run_prompts(model, prompts, stop_early=False)

        d = os.path.join(args.out, arch)
        os.makedirs(d, exist_ok=True)
        if spec.get("shards"):
            files = save_sharded(model, d, spec["shards"])
        else:
            model.save_pretrained(d)
            files = ["model.safetensors"]

        blob = bytearray()
        entries = []
        for ids, (logits, toks, rows) in zip(prompts, results):
            off = len(blob) // 4
            blob += logits.contiguous().numpy().astype("<f4").tobytes()
            goff = len(blob) // 4
            blob += rows.contiguous().numpy().astype("<f4").tobytes()
            entries.append(dict(token_ids=ids, logits_offset=off, logits_rows=len(ids),
                                greedy_token_ids=toks, greedy_logits_offset=goff,
                                greedy_logits_rows=len(toks)))
        with open(os.path.join(d, "golden.bin"), "wb") as f:
            f.write(bytes(blob))
        rotary = getattr(model.model, "rotary_emb", None)
        inv_freq = rotary.inv_freq.tolist() if rotary is not None else None
        golden = dict(
            format="ringserve-golden-1",
            description=("transformers logits (fp32, CPU, eager attention) for each prompt run "
                         "alone; greedy_logits row i is the last-position logits that chose "
                         "greedy_token_ids[i] (row 0 == the prompt's last logits row). "
                         "Offsets/rows index golden.bin as little-endian float32 [rows, vocab]."),
            architecture=spec["cls"], transformers_version=transformers.__version__,
            torch_version=torch.__version__, attn_implementation=model.config._attn_implementation,
            seed=chosen, init_std=INIT_STD, margin_threshold_rel=MARGIN_REL,
            min_relative_margin=min_rel, margin_ok=ok, vocab_size=vocab,
            logits_file="golden.bin", rope_inv_freq=inv_freq, safetensors_files=files,
            prompts=entries)
        with open(os.path.join(d, "golden.json"), "w") as f:
            json.dump(golden, f, indent=1)
        size = sum(os.path.getsize(os.path.join(d, x)) for x in os.listdir(d))
        print(f"{arch}: tried={tried} seed={chosen} min_rel_margin={min_rel:.4f} ok={ok} files={files} "
              f"bytes={size} t={time.time() - t0:.1f}s greedy0={results[0][1]}")
        with open(os.path.join(d, "config.json")) as f:
            c = json.load(f)
        keys = ["architectures", "rope_parameters", "rope_scaling", "rope_theta", "dtype",
                "torch_dtype", "head_dim", "sliding_window", "use_sliding_window", "layer_types",
                "tie_word_embeddings", "eos_token_id", "attention_bias", "mlp_bias"]
        print("  config:", json.dumps({k: c[k] for k in keys if k in c}))
        print("  tensors:", sorted(model.state_dict().keys())[:12], len(model.state_dict()))
        summary[arch] = dict(seed=chosen, min_rel_margin=min_rel, ok=ok, files=files)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
