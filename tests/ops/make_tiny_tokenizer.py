#!/usr/bin/env python3
"""Writes tests/ops/tiny_tokenizer/{tokenizer.json,tokenizer_config.json}: a byte-level BPE
tokenizer with exactly 512 ids (256 bytes, 253 merges learned from a small English text, 3
special tokens) and a ChatML chat template. It pairs with the random-weight fixture models of
vocab size 512 (tests/fixtures/models/llama) so that the ops tests can send text and chat
requests through the real tokenizer and chat-template code. Deterministic; no dependencies.
Usage: python3 tests/ops/make_tiny_tokenizer.py
"""
import collections
import json
import os
import re

VOCAB_SIZE = 512
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
CORPUS = """
The ring of stages passes activations from one stage to the next, and the last stage samples
the next token and sends it back to the first stage. Every stage holds a slice of the layers of
the model and its own cache of keys and values. The coordinator plans micro-batches so that
every stage has work at every step: this is how pipeline parallelism keeps the GPUs busy. You
are a helpful assistant. Name a prime number. What is the capital of France? Tell me a story
about a quick brown fox that jumps over the lazy dog. Hello, world! How are you today? I am
fine, thank you. Please answer in one short sentence. The quick brown fox jumps over the lazy
dog again and again, while the operators watch the dashboard and the metrics.
"""


def bytes_to_unicode():
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) +
          list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def main():
    byte_map = bytes_to_unicode()
    vocab = {byte_map[b]: b for b in range(256)}
    # Pre-tokens without \p classes (Python's re lacks them): letters, digits, others, spaces.
    words = re.findall(r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+",
                       CORPUS)
    counts = collections.Counter("".join(byte_map[b] for b in w.encode()) for w in words)
    splits = {w: list(w) for w in counts}
    merges = []
    num_merges = VOCAB_SIZE - 256 - len(SPECIALS)
    while len(merges) < num_merges:
        pairs = collections.Counter()
        for w, c in counts.items():
            s = splits[w]
            for a, b in zip(s, s[1:]):
                pairs[(a, b)] += c
        if not pairs:
            break
        # Most frequent, ties broken by the pair itself: deterministic.
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        merges.append(f"{a} {b}")
        vocab[a + b] = len(vocab)
        for w in splits:
            s, out, i = splits[w], [], 0
            while i < len(s):
                if i + 1 < len(s) and s[i] == a and s[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            splits[w] = out
    assert len(merges) == num_merges, f"corpus too small: {len(merges)} merges"
    added = []
    for token in SPECIALS:
        vocab[token] = len(vocab)
        added.append({"id": vocab[token], "content": token, "single_word": False, "lstrip": False,
                      "rstrip": False, "normalized": False, "special": True})
    assert len(vocab) == VOCAB_SIZE
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "add_bos_token": False,
        "add_eos_token": False,
        "model_max_length": 256,
        "chat_template": (
            "{% for message in messages %}"
            "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
            "{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"),
    }
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tiny_tokenizer")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(tokenizer, f, ensure_ascii=False, indent=1)
        f.write("\n")
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
        f.write("\n")
    print(f"wrote {out}: {len(vocab)} ids, {len(merges)} merges")


if __name__ == "__main__":
    main()
