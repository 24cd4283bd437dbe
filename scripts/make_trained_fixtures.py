#!/usr/bin/env python3
"""Copies what the C++ tests need from train_small_model.py's goldens into the repository.

  tests/fixtures/trained/tokenizer_golden.json   6 held-out documents + every edge case
  tests/fixtures/trained/greedy_golden.json      greedy continuations, prompt logprobs
  tests/fixtures/trained/perplexity_golden.json  the first held-out document's windows
  models/<name>/transformers_perplexity.json     every held-out window (fp32 and bf16 compute)

Usage: python3 scripts/make_trained_fixtures.py --goldens OUT/goldens --corpus build/corpus
Standard library only.
"""
import argparse
import json
import os

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), ".."))
TOKENIZER_DOCS = (0, 30, 60, 95, 100, 105)  # KJV chapters and Devil's Dictionary entries
NUM_EDGE_CASES = 14  # train_small_model.TOKENIZER_EDGE_CASES, appended after the documents


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--goldens", required=True)
    ap.add_argument("--corpus", required=True)
    args = ap.parse_args()
    out = os.path.join(ROOT, "tests", "fixtures", "trained")
    os.makedirs(out, exist_ok=True)

    def load(name):
        with open(os.path.join(args.goldens, name), encoding="utf-8") as f:
            return json.load(f)

    def dump(obj, path, indent=None):
        with open(path, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=indent, ensure_ascii=False)
            f.write("\n")

    tok = load("tokenizer_golden.json")
    docs, edge = tok["cases"][:-NUM_EDGE_CASES], tok["cases"][-NUM_EDGE_CASES:]
    dump(dict(tokenizers=tok["tokenizers"],
              source="train_small_model.py goldens/tokenizer_golden.json: held-out documents "
                     f"{list(TOKENIZER_DOCS)} and every edge case",
              cases=[docs[i] for i in TOKENIZER_DOCS] + edge),
         os.path.join(out, "tokenizer_golden.json"))

    dump(load("greedy_ringserve-tiny.json"), os.path.join(out, "greedy_golden.json"), indent=1)

    with open(os.path.join(args.corpus, "heldout.txt"), encoding="utf-8") as f:
        heldout = f.read().rstrip("\n").split("\n\n")
    for name in ("ringserve-tiny", "ringserve-tiny-draft"):
        ppl = load(f"perplexity_{name}.json")
        dump(ppl, os.path.join(ROOT, "models", name, "transformers_perplexity.json"))
        if name == "ringserve-tiny":
            dump(dict(model=name, window=ppl["window"],
                      source="train_small_model.py goldens/perplexity_ringserve-tiny.json "
                             "(fp32 compute on the bf16 weights)",
                      documents=heldout[:1],
                      windows=[w for w in ppl["fp32"]["windows"] if w["doc"] == 0]),
                 os.path.join(out, "perplexity_golden.json"), indent=1)
    for f in sorted(os.listdir(out)):
        print(f, os.path.getsize(os.path.join(out, f)))


if __name__ == "__main__":
    main()
