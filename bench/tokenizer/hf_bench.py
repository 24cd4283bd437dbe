#!/usr/bin/env python3
"""Hugging Face `tokenizers` on the tokenizer benchmark corpus, one thread, one `encode` call per
document (no encode_batch), add_special_tokens=False — the same work tokenizer_bench does.

  RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false \
    bench/tokenizer/hf_bench.py CORPUS.json DIR_WITH_tokenizer.json [NAME]
"""
import json
import os
import sys
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import tokenizers  # noqa: E402


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        docs = json.load(f)
    directory = sys.argv[2]
    name = sys.argv[3] if len(sys.argv) > 3 else os.path.basename(directory.rstrip("/"))
    tok = tokenizers.Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
    total_bytes = sum(len(d.encode("utf-8")) for d in docs)
    for d in docs[:50]:  # warm-up, as the C++ benchmark does
        tok.encode(d, add_special_tokens=False)
    best = None
    for _ in range(2):
        tokens = 0
        start = time.perf_counter()
        for d in docs:
            tokens += len(tok.encode(d, add_special_tokens=False).ids)
        elapsed = time.perf_counter() - start
        best = elapsed if best is None else min(best, elapsed)
    print("hf_tokenizers %s %s: %.2f MB in %.3f s: %.2f MB/s, %.0f tokens/s (%d tokens)" %
          (tokenizers.__version__, name, total_bytes / 1e6, best, total_bytes / 1e6 / best,
           tokens / best, tokens))


if __name__ == "__main__":
    main()
