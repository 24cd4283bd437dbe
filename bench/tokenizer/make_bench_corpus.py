#!/usr/bin/env python3
"""Writes the tokenizer benchmark corpus: about 10 MB of mixed text as a JSON list of ~4 KB
documents, built deterministically (fixed seed) from tests/fixtures/tokenizers/corpus.json.

  bench/tokenizer/make_bench_corpus.py OUT.json [MEGABYTES]
"""
import json
import os
import random
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    out = sys.argv[1]
    megabytes = float(sys.argv[2]) if len(sys.argv) > 2 else 10.0
    with open(os.path.join(ROOT, "tests", "fixtures", "tokenizers", "corpus.json"),
              encoding="utf-8") as f:
        texts = [t for t in json.load(f) if t]
    rng = random.Random(1234)
    docs, total = [], 0
    target = int(megabytes * 1e6)
    while total < target:
        parts, size = [], 0
        while size < 4000:
            t = rng.choice(texts)
            parts.append(t)
            size += len(t.encode("utf-8")) + 1
        doc = "\n".join(parts)
        docs.append(doc)
        total += len(doc.encode("utf-8"))
    with open(out, "w", encoding="utf-8") as f:
        json.dump(docs, f, ensure_ascii=False)
    print("wrote %s: %d documents, %.2f MB" % (out, len(docs), total / 1e6))


if __name__ == "__main__":
    main()
