#!/usr/bin/env python3
"""Trains the demo models of ringserve: a byte-level BPE tokenizer and two small Llama models.

Input: the corpus that scripts/corpus/make_corpus.sh writes (train.txt, heldout.txt, SHA256SUMS).
Output (--out):
  ringserve-tiny/        LlamaForCausalLM, 8 layers, hidden 256, GQA 4:2, tied embeddings, bf16
  ringserve-tiny-draft/  the same shape with 2 layers (a draft for speculative decoding)
      each: config.json, generation_config.json, model.safetensors (bf16), tokenizer.json,
            tokenizer_config.json (bos/eos, a plain chat template), training_log.txt, metrics.json
  goldens/  what the C++ tests and the README compare against, written by transformers from the
            saved bf16 weights (computed in fp32, as the CPU stage does):
      tokenizer_golden.json  token ids of every held-out document and of edge-case strings
      greedy_golden.json     greedy continuations + prompt logprobs of a few prompts (CPU, fp32)
      perplexity.json        held-out perplexity, per window (the same windows as
                             ringserve_perplexity), fp32 and bf16 compute

Reproducible: fixed seeds, the corpus digest is checked against SHA256SUMS and logged, every
hyperparameter and library version is logged. GPU kernels (bf16 matmuls, attention backward) are
not bitwise deterministic, so a rerun matches the logged losses to about 1e-3, not bit for bit.

Perplexity windows (shared with bench/perplexity, ringserve_perplexity): the text is split into
documents at blank lines ("\\n\\n"); each document is encoded with the BOS token prepended and cut into
windows of --window tokens; each window is scored alone, every token but the window's first
given the tokens before it in the window. Perplexity = exp(sum of NLL / scored tokens).

Usage:
  python3 scripts/train_small_model.py --corpus build/corpus --out build/trained \
      [--device cuda] [--steps 2500] [--draft-steps 1500] [--smoke]
"""
import argparse
import contextlib
import copy
import hashlib
import json
import math
import os
import random
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402
import tokenizers  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa

BOS, EOS = "<s>", "</s>"
SPECIAL_TOKENS = [BOS, EOS]
# A plain template for a base model: the messages' contents as consecutive paragraphs.
CHAT_TEMPLATE = ("{{ bos_token }}{% for message in messages %}{{ message['content'] | trim }}"
                 "{% if not loop.last %}\n\n{% endif %}{% endfor %}"
                 "{% if add_generation_prompt %}\n{% endif %}")
MAX_DIR_BYTES = 16 * 1000 * 1000
VAL_EVERY = 20  # every 20th training document (index % 20 == 0) validates (checkpoint choice)

MAIN_SHAPE = dict(hidden_size=256, intermediate_size=768, num_hidden_layers=8,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=64)
DRAFT_SHAPE = dict(MAIN_SHAPE, num_hidden_layers=2)

GREEDY_PROMPTS = [
    "In the beginning",
    "And the LORD said unto Moses,",
    "Blessed are the",
    "CYNIC, n.",
    "The king of Israel",
    "And it came to pass, when",
    "LAWYER, n.",
    "For God so loved the world,",
]
GREEDY_NEW_TOKENS = 24
TOKENIZER_EDGE_CASES = [
    "", " ", "  leading spaces", "trailing spaces   ", "tabs\tand\nnewlines\n\n\nthree",
    "Numbers 12345 and 3.14159, 1,000,000.", "UPPERCASE lowercase MiXeD", "don't won't it's",
    "caf\u00e9 na\u00efve \u00fcber", "\u4f60\u597d\u4e16\u754c", "emoji \U0001F600\U0001F44D\U0001F3FD",
    "<s> not special </s> inline", "a" * 300, "The LORD is my shepherd; I shall not want.",
]


class Log:
    def __init__(self):
        self.lines = []

    def __call__(self, msg):
        line = f"[{time.strftime('%H:%M:%S', time.gmtime())}] {msg}"
        print(line, flush=True)
        self.lines.append(line)

    def write(self, path):
        with open(path, "w") as f:
            f.write("\n".join(self.lines) + "\n")


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_documents(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    return [d for d in text.rstrip("\n").split("\n\n") if d]


def seed_everything(seed):
    random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def train_tokenizer(docs, vocab_size, log):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2,
                                  special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    t0 = time.time()
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs))
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)])
    log(f"tokenizer: vocab {tok.get_vocab_size()} trained in {time.time() - t0:.1f} s; "
        f"bos {bos_id} eos {tok.token_to_id(EOS)}")
    return tok


def token_stream(tok, docs):
    """[BOS] doc [EOS] for every document, concatenated."""
    bos, eos = tok.token_to_id(BOS), tok.token_to_id(EOS)
    out = []
    for enc in tok.encode_batch(docs, add_special_tokens=False):
        out.append(bos)
        out.extend(enc.ids)
        out.append(eos)
    return torch.tensor(out, dtype=torch.long)


def make_config(shape, vocab_size, bos_id, eos_id, max_positions):
    cfg = transformers.LlamaConfig(
        vocab_size=vocab_size, max_position_embeddings=max_positions, rms_norm_eps=1e-5,
        attention_bias=False, mlp_bias=False, tie_word_embeddings=True, bos_token_id=bos_id,
        eos_token_id=eos_id, pad_token_id=None, hidden_act="silu", initializer_range=0.02,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0), **shape)
    if not getattr(cfg, "rope_parameters", None):  # transformers 4 spelling
        cfg.rope_theta = 10000.0
    return cfg


@torch.no_grad()
def eval_loss(model, windows, device, batch):
    model.eval()
    total, count = 0.0, 0
    for i in range(0, windows.shape[0], batch):
        x = windows[i:i + batch].to(device)
        with autocast(device):
            logits = model(input_ids=x[:, :-1], use_cache=False).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                               x[:, 1:].reshape(-1), reduction="sum")
        total += loss.item()
        count += x[:, 1:].numel()
    model.train()
    return total / max(count, 1)


def autocast(device):
    if device.startswith("cuda"):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def train_model(name, cfg, train_ids, val_windows, args, steps, log):
    seed_everything(args.seed)
    device = args.device
    model = transformers.LlamaForCausalLM(cfg).to(device).float()
    if model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
        model.tie_weights()
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    params = sum(p.numel() for p in model.parameters())
    log(f"{name}: {params} parameters ({params * 2 / 1e6:.2f} MB in bf16); config "
        f"{json.dumps({k: getattr(cfg, k) for k in MAIN_SHAPE})}")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    warmup = min(args.warmup, max(steps // 10, 1))

    def lr_at(step):
        if step < warmup:
            return args.lr * (step + 1) / warmup
        progress = (step - warmup) / max(steps - warmup, 1)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    gen = torch.Generator().manual_seed(args.seed + 1)
    seq = args.seq_len
    train_ids_dev = train_ids.to(device)
    best = (float("inf"), -1, None)
    t0 = time.time()
    model.train()
    budget_s = args.max_train_seconds * (0.4 if name == "ringserve-tiny-draft" else 1.0)
    for step in range(steps):
        if time.time() - t0 > budget_s:
            log(f"{name}: stopping at step {step} of {steps}: the time budget of {budget_s:.0f} s "
                f"is spent (the cosine schedule was planned for {steps} steps)")
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        starts = torch.randint(0, train_ids.numel() - seq - 1, (args.batch,), generator=gen)
        idx = starts[:, None] + torch.arange(seq + 1)[None, :]
        xy = train_ids_dev[idx.to(device)]
        with autocast(device):
            logits = model(input_ids=xy[:, :-1], use_cache=False).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), xy[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if (step + 1) % args.eval_every == 0 or step + 1 == steps:
            val = eval_loss(model, val_windows, device, args.batch)
            marker = ""
            if val < best[0]:
                best = (val, step + 1, copy.deepcopy({k: v.detach().cpu().clone()
                                                      for k, v in model.state_dict().items()}))
                marker = " *"
            log(f"{name}: step {step + 1}/{steps} lr {lr_at(step):.2e} train {loss.item():.4f} "
                f"gnorm {gnorm.item():.2f} val {val:.4f} (ppl {math.exp(val):.2f}) "
                f"{time.time() - t0:.1f} s{marker}")
    if best[2] is None:
        val = eval_loss(model, val_windows, device, args.batch)
        best = (val, step, {k: v.detach().cpu().clone() for k, v in model.state_dict().items()})
    log(f"{name}: best validation loss {best[0]:.4f} at step {best[1]}; "
        f"{time.time() - t0:.1f} s for {steps} steps")
    model.load_state_dict(best[2])
    return model, dict(parameters=params, steps=steps, best_step=best[1], best_val_loss=best[0],
                       train_seconds=round(time.time() - t0, 1))


def write_tokenizer_files(tok, d, max_positions):
    tok.save(os.path.join(d, "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS, "eos_token": EOS, "pad_token": EOS,
        "model_max_length": max_positions, "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(d, "special_tokens_map.json"), "w") as f:
        json.dump({"bos_token": BOS, "eos_token": EOS, "pad_token": EOS}, f, indent=2)


def load_saved(d, device):
    try:
        m = transformers.LlamaForCausalLM.from_pretrained(d, dtype=torch.bfloat16)
    except TypeError:
        m = transformers.LlamaForCausalLM.from_pretrained(d, torch_dtype=torch.bfloat16)
    first = next(m.parameters())
    assert first.dtype == torch.bfloat16, first.dtype
    return m.to(device).eval()


def perplexity_windows(tok, docs, window):
    out = []
    for di, enc in enumerate(tok.encode_batch(docs, add_special_tokens=True)):
        ids = enc.ids
        for start in range(0, len(ids), window):
            w = ids[start:start + window]
            if len(w) >= 2:
                out.append((di, start, w))
    return out


@torch.no_grad()
def score_windows(model, windows, device, bf16):
    rows = []
    total, count = 0.0, 0
    for di, start, w in windows:
        x = torch.tensor([w], device=device)
        ctx = torch.autocast("cuda", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        with ctx:
            logits = model(input_ids=x, use_cache=False).logits[0].float()
        lp = torch.log_softmax(logits[:-1], dim=-1)
        nll = -lp.gather(1, x[0, 1:, None]).sum().item()
        rows.append(dict(doc=di, start=start, scored=len(w) - 1, nll=nll))
        total += nll
        count += len(w) - 1
    return dict(nll=total, tokens=count, perplexity=math.exp(total / count), windows=rows)


@torch.no_grad()
def greedy_golden(model, tok, log):
    """Greedy continuation on the CPU in fp32 (eager attention), full recompute each step."""
    out = []
    for prompt in GREEDY_PROMPTS:
        ids = tok.encode(prompt, add_special_tokens=True).ids
        seq = list(ids)
        logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()
        lp = torch.log_softmax(logits, dim=-1)
        prompt_logprobs = [lp[i, ids[i + 1]].item() for i in range(len(ids) - 1)]
        margins = []
        new = []
        for _ in range(GREEDY_NEW_TOKENS):
            row = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1].float()
            top = torch.topk(row, 2)
            margins.append((top.values[0] - top.values[1]).item())
            t = int(top.indices[0].item())
            new.append(t)
            seq.append(t)
        text = tok.decode(new, skip_special_tokens=False)
        log(f"greedy: {prompt!r} -> {text!r} (min margin {min(margins):.4f})")
        out.append(dict(prompt=prompt, prompt_ids=ids, prompt_logprobs=prompt_logprobs,
                        greedy_ids=new, greedy_text=text, min_margin=min(margins),
                        margins=margins))
    return out


def dir_bytes(d):
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=20)
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--steps", type=int, default=1100)
    ap.add_argument("--draft-steps", type=int, default=1500)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--max-train-seconds", type=float, default=170.0,
                    help="wall-time guard for the main model (the draft gets 40%%)")
    ap.add_argument("--window", type=int, default=512, help="perplexity window (tokens)")
    ap.add_argument("--max-positions", type=int, default=1024)
    ap.add_argument("--smoke", action="store_true",
                    help="a quick check of the whole script: few steps, small evaluations")
    ap.add_argument("--target-shape", default="",
                    help="LAYERSxHIDDEN (e.g. 12x768): train only a target of that shape into "
                         "OUT/ringserve-target-LAYERSxHIDDEN, without draft, goldens or "
                         "perplexity (a larger target for speculative-decoding benchmarks)")
    ap.add_argument("--tokenizer", default="",
                    help="a tokenizer.json to use instead of training one (e.g. the committed "
                         "models/ringserve-tiny/tokenizer.json, so drafts and targets share it)")
    args = ap.parse_args()
    if args.smoke:
        args.steps, args.draft_steps, args.eval_every = 6, 4, 3
    log = Log()
    os.makedirs(args.out, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    log(f"python {sys.version.split()[0]} torch {torch.__version__} transformers "
        f"{transformers.__version__} tokenizers {tokenizers.__version__} device {args.device}"
        + (f" ({torch.cuda.get_device_name()})" if args.device.startswith("cuda") else ""))
    log(f"arguments: {json.dumps(vars(args), sort_keys=True)}")

    # The corpus, checked against its digests.
    digests = {}
    with open(os.path.join(args.corpus, "SHA256SUMS")) as f:
        for line in f:
            h, name = line.split()
            digests[name] = h
    for name in ("train.txt", "heldout.txt"):
        got = sha256(os.path.join(args.corpus, name))
        if got != digests.get(name):
            raise SystemExit(f"{name}: sha256 {got} does not match SHA256SUMS")
        log(f"corpus {name}: sha256 {got}")
    train_docs_all = read_documents(os.path.join(args.corpus, "train.txt"))
    heldout_docs = read_documents(os.path.join(args.corpus, "heldout.txt"))
    train_docs = [d for i, d in enumerate(train_docs_all) if i % VAL_EVERY != 0]
    val_docs = [d for i, d in enumerate(train_docs_all) if i % VAL_EVERY == 0]
    log(f"documents: train {len(train_docs)} validation {len(val_docs)} held-out "
        f"{len(heldout_docs)}")

    seed_everything(args.seed)
    if args.tokenizer:
        tok = Tokenizer.from_file(args.tokenizer)
        log(f"tokenizer: {args.tokenizer} ({tok.get_vocab_size()} ids)")
    else:
        tok = train_tokenizer(train_docs_all, args.vocab_size, log)
    bos_id, eos_id = tok.token_to_id(BOS), tok.token_to_id(EOS)
    train_ids = token_stream(tok, train_docs)
    val_ids = token_stream(tok, val_docs)
    n_val = val_ids.numel() // (args.seq_len + 1)
    val_windows = val_ids[:n_val * (args.seq_len + 1)].view(n_val, args.seq_len + 1)
    if args.smoke:
        val_windows = val_windows[:4]
    log(f"tokens: train {train_ids.numel()} validation {val_ids.numel()} "
        f"({len(''.join(train_docs)) / train_ids.numel():.2f} characters a token)")

    results = {}
    golden_dir = os.path.join(args.out, "goldens")
    os.makedirs(golden_dir, exist_ok=True)
    heldout = heldout_docs[:3] if args.smoke else heldout_docs
    windows = perplexity_windows(tok, heldout, args.window)
    plan = (("ringserve-tiny", MAIN_SHAPE, args.steps),
            ("ringserve-tiny-draft", DRAFT_SHAPE, args.draft_steps))
    if args.target_shape:
        layers, hidden = (int(v) for v in args.target_shape.split("x"))
        heads = hidden // 64
        shape = dict(MAIN_SHAPE, hidden_size=hidden, intermediate_size=3 * hidden,
                     num_hidden_layers=layers, num_attention_heads=heads,
                     num_key_value_heads=max(1, heads // 2))
        plan = ((f"ringserve-target-{args.target_shape}", shape, args.steps),)
    for name, shape, steps in plan:
        cfg = make_config(shape, tok.get_vocab_size(), bos_id, eos_id, args.max_positions)
        model, info = train_model(name, cfg, train_ids, val_windows, args, steps, log)
        d = os.path.join(args.out, name)
        os.makedirs(d, exist_ok=True)
        model.to(torch.bfloat16).save_pretrained(d)
        write_tokenizer_files(tok, d, args.max_positions)
        del model
        if args.target_shape:
            log(f"{name}: saved to {d} (no evaluation with --target-shape)")
            continue
        # Held-out perplexity from the saved bf16 weights, computed in fp32 and in bf16.
        saved = load_saved(d, args.device)
        ppl_bf16 = score_windows(saved, windows, args.device, bf16=args.device.startswith("cuda"))
        saved = saved.float()
        ppl_fp32 = score_windows(saved, windows, args.device, bf16=False)
        log(f"{name}: held-out perplexity {ppl_fp32['perplexity']:.4f} (fp32 compute on the "
            f"bf16 weights; {ppl_fp32['tokens']} tokens in {len(windows)} windows of <= "
            f"{args.window}), {ppl_bf16['perplexity']:.4f} with bf16 compute")
        info.update(heldout_perplexity_fp32=ppl_fp32["perplexity"],
                    heldout_perplexity_bf16=ppl_bf16["perplexity"],
                    heldout_tokens=ppl_fp32["tokens"], window=args.window)
        with open(os.path.join(golden_dir, f"perplexity_{name}.json"), "w") as f:
            json.dump(dict(model=name, window=args.window, fp32=ppl_fp32, bf16_compute=ppl_bf16),
                      f)
        cpu = saved.cpu()
        try:
            cpu.set_attn_implementation("eager")
        except Exception:
            cpu.config._attn_implementation = "eager"
        greedy = greedy_golden(cpu, tok, log)
        with open(os.path.join(golden_dir, f"greedy_{name}.json"), "w") as f:
            json.dump(dict(model=name, transformers=transformers.__version__,
                           torch=torch.__version__, compute="fp32 on CPU from the bf16 weights",
                           new_tokens=GREEDY_NEW_TOKENS, prompts=greedy), f, indent=1)
        del saved, cpu
        size = dir_bytes(d)
        info["dir_bytes"] = size
        log(f"{name}: {d} holds {size} bytes: {sorted(os.listdir(d))}")
        if size > MAX_DIR_BYTES:
            raise SystemExit(f"{name}: {size} bytes exceed {MAX_DIR_BYTES}")
        results[name] = info
        with open(os.path.join(d, "metrics.json"), "w") as f:
            json.dump(dict(info, corpus_sha256=digests, seed=args.seed), f, indent=2)

    if args.target_shape:
        return
    # Tokenizer goldens: every held-out document and the edge cases, with and without BOS.
    texts = heldout_docs + TOKENIZER_EDGE_CASES
    golden = dict(tokenizers=tokenizers.__version__, cases=[
        dict(text=t, ids=tok.encode(t, add_special_tokens=False).ids,
             ids_with_bos=tok.encode(t, add_special_tokens=True).ids) for t in texts])
    with open(os.path.join(golden_dir, "tokenizer_golden.json"), "w") as f:
        json.dump(golden, f)
    # Does transformers read the tokenizer files (chat template included)?
    try:
        at = transformers.AutoTokenizer.from_pretrained(os.path.join(args.out, "ringserve-tiny"))
        ids = at("In the beginning")["input_ids"]
        chat = at.apply_chat_template([{"role": "user", "content": "Hello there"}],
                                      tokenize=False, add_generation_prompt=True)
        log(f"AutoTokenizer: {type(at).__name__} ids {ids} chat template -> {chat!r}")
    except Exception as e:  # informative only
        log(f"AutoTokenizer check failed: {type(e).__name__}: {e}")
    log(f"results: {json.dumps(results)}")
    for name in results:
        log.write(os.path.join(args.out, name, "training_log.txt"))
    log.write(os.path.join(args.out, "training_log.txt"))


if __name__ == "__main__":
    main()
