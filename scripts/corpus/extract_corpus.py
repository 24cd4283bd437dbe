#!/usr/bin/env python3
"""Turns the raw text of the corpus packages into train.txt and heldout.txt (see make_corpus.sh).

Documents: one KJV chapter ("Genesis 1" then one verse a line, without verse numbers), one
Devil's Dictionary entry (prose paragraphs joined into lines, verse kept line by line). Documents
are separated by one blank line. Every 20th document of each source (index % 20 == 10) goes to the
held-out split. Python standard library only; deterministic.
"""
import argparse
import os
import re

HELDOUT_EVERY = 20
HELDOUT_PHASE = 10
# Documents of the 1911 text that use racial slurs are left out of the training split (the
# split is assigned first, so the held-out documents do not move). A demo model should not
# repeat them.
EXCLUDED_WORDS = re.compile(r"\b(nigger|negro)\b", re.IGNORECASE)
B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def kjv_chapters(path):
    """Yields one document per chapter from `bible -l 100000` output."""
    heading, verses = None, []
    verse_re = re.compile(r"^\s+\d+ (.*)$")
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line.strip():
                continue
            m = verse_re.match(line)
            if m:
                verses.append(m.group(1).strip())
                continue
            if heading is not None and verses:
                yield heading + "\n" + "\n".join(verses)
            heading, verses = line.strip(), []
    if heading is not None and verses:
        yield heading + "\n" + "\n".join(verses)


def dict_decode(s):
    value = 0
    for ch in s:
        value = value * 64 + B64.index(ch)
    return value


def reflow(entry):
    """Joins each prose paragraph into one line; keeps indented verse lines as they are."""
    paragraphs = []
    for para in re.split(r"\n\s*\n", entry.strip("\n")):
        lines = [l for l in para.split("\n") if l.strip()]
        if not lines:
            continue
        if len(lines) > 1 and all(l.startswith("    ") for l in lines[1:]) and \
                lines[0].startswith("    "):
            paragraphs.append("\n".join(l.strip() for l in lines))
        else:
            paragraphs.append(" ".join(l.strip() for l in lines))
    return "\n".join(paragraphs)


def devil_entries(dict_path, index_path):
    """Yields one document per dictionary entry, in file order, via the dictd index."""
    with open(dict_path, "rb") as f:
        data = f.read()
    spans = set()
    with open(index_path, encoding="utf-8") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 3 or parts[0].startswith("00database"):
                continue
            spans.add((dict_decode(parts[1]), dict_decode(parts[2])))
    for offset, length in sorted(spans):
        text = reflow(data[offset:offset + length].decode("utf-8", errors="strict"))
        if text:
            yield text


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--kjv", required=True, help="output of `bible -l 100000 gen1:1-rev22:21`")
    ap.add_argument("--devil", required=True, help="devil.dict, uncompressed")
    ap.add_argument("--devil-index", default="/usr/share/dictd/devil.index")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    train, heldout = [], []
    counts = {}
    for name, docs in (("kjv", kjv_chapters(args.kjv)),
                       ("devil", devil_entries(args.devil, args.devil_index))):
        n = 0
        for i, doc in enumerate(docs):
            doc = doc.replace("\t", " ").replace("\r", "")
            n += 1
            if i % HELDOUT_EVERY == HELDOUT_PHASE:
                heldout.append(doc)
            elif EXCLUDED_WORDS.search(doc):
                counts["excluded"] = counts.get("excluded", 0) + 1
            else:
                train.append(doc)
        counts[name] = n
    if counts["kjv"] < 1000 or counts["devil"] < 500:
        raise SystemExit(f"too few documents: {counts} (is the input complete?)")
    os.makedirs(args.out, exist_ok=True)
    for name, docs in (("train.txt", train), ("heldout.txt", heldout)):
        with open(os.path.join(args.out, name), "w", encoding="utf-8", newline="\n") as f:
            f.write("\n\n".join(docs) + "\n")
    print(f"documents: {counts}; train {len(train)}, held-out {len(heldout)}")


if __name__ == "__main__":
    main()
