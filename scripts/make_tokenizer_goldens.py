#!/usr/bin/env python3
"""Tokenizer corpus and Hugging Face golden outputs for coordinator/tokenizer's tests.

  scripts/make_tokenizer_goldens.py corpus          # writes tests/fixtures/tokenizers/corpus.json
  scripts/make_tokenizer_goldens.py goldens OUTDIR  # needs `tokenizers`; reads the corpus and
                                                    # .deps/tokenizers/*, writes OUTDIR/golden_*.json

The corpus is deterministic (fixed seed) plus hand-written cases. Goldens come from
`tokenizers.Tokenizer.from_file` (what the C++ tokenizer must match id for id); a few
`transformers.AutoTokenizer` encodings are recorded too, for the tokenizer_config.json BOS rule.
Run the goldens step on the device: run(carry=[".deps/tokenizers"],
  command="python3 scripts/make_tokenizer_goldens.py goldens $OUT").
"""
import json
import os
import random
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "tokenizers")
CORPUS = os.path.join(FIXTURES, "corpus.json")
NAMES = ["qwen3", "llama3", "deepseek_v3"]
SEED = 20261202

HAND_WRITTEN = [
    "",
    " ",
    "Hello, world!",
    "Hello world",
    " Hello world",
    "  leading spaces and trailing   ",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure you're right; they'll see what we've done, and he'd agree it's OK.",
    "I'M SURE YOU'RE RIGHT; THEY'LL SEE WHAT WE'VE DONE. IT'S 'S 'T 'Re 'vE",
    "don\u2019t curly apostrophe \u2018quoted\u2019 \u201cdouble\u201d",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>",
    "<\uff5cbegin\u2581of\u2581sentence\uff5c>You are helpful.<\uff5cUser\uff5c>Hi<\uff5cAssistant\uff5c>",
    "<think>\nLet me reason step by step.\n</think>\n\nThe answer is 42.",
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
    "<|endoftext|><|endoftext|>text<|end_of_text|>",
    "partial specials: <|im_st <|im_end| <|begin_of_text <|eot_id <think <\uff5cUser",
    "nested <<|im_start|>> and <|<|im_end|>|>",
    "<|fim_prefix|>def f(x):<|fim_suffix|>    return x<|fim_middle|>",
    "\t\tindented with tabs\n\t\t\tmore",
    "line1\r\nline2\r\n\r\nline3\rline4\n\n\n",
    " \n \n\t \r\n  \u00a0 \u3000 x",
    "a" * 600,
    "ab" * 300,
    " " * 1000,
    " " * 257 + "x",
    "\n" * 300,
    "\t" * 200 + "end",
    "\r\n" * 100,
    "1234567890",
    "3.14159265358979323846264338327950288419716939937510",
    "1" * 120,
    "Population: 8,045,311,447 (2023); GDP $105.4 trillion; 0.0001%; -273.15\u00b0C",
    "Phone: +1 (555) 123-4567, ext. 89; ISBN 978-3-16-148410-0",
    "\uff11\uff12\uff13 fullwidth digits, \u0663\u0664\u0665 Arabic-Indic, \u0967\u0968\u0969 Devanagari",
    "superscripts x\u00b2+y\u00b3, fractions \u00bd \u00be, roman \u216b \u2167, circled \u2460\u2461",
    "caf\u00e9 cafe\u0301 (NFC vs NFD)",
    "\u1100\u1161\u11a8 decomposed hangul vs \uac01",
    "A\u030a \u212b \u00c5 angstrom forms, \u1e9b\u0323 long s",
    "e\u0301\u0302\u0303\u0304\u0305 stacked combining marks",
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034dA\u036b\u0357\u0334\u0362\u0335\u031c\u0330\u0354L\u0368\u0367\u0369\u0358\u0320G\u0311\u0357\u030e\u0305\u035b\u0341\u0334\u033b\u0348\u034d\u0354\u0339O",
    "\u4eca\u65e5\u306f\u3044\u3044\u5929\u6c17\u3067\u3059\u306d\u3002\u6771\u4eac\u30bf\u30ef\u30fc\u306b\u884c\u304d\u307e\u3057\u3087\u3046\uff01",
    "\u6211\u7231\u5317\u4eac\u5929\u5b89\u95e8\uff0c\u5929\u5b89\u95e8\u4e0a\u592a\u9633\u5347\u3002\u4eba\u5de5\u667a\u80fd\u6b63\u5728\u6539\u53d8\u4e16\u754c\u3002",
    "\ub300\ud55c\ubbfc\uad6d\uc758 \uc218\ub3c4\ub294 \uc11c\uc6b8\uc785\ub2c8\ub2e4. \uc548\ub155\ud558\uc138\uc694!",
    "\u0627\u0644\u0644\u063a\u0629 \u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u062c\u0645\u064a\u0644\u0629 \u062c\u062f\u064b\u0627\u060c \u0623\u0644\u064a\u0633 \u0643\u0630\u0644\u0643\u061f",
    "\u0939\u093f\u0928\u094d\u0926\u0940 \u092d\u093e\u0937\u093e \u092d\u093e\u0930\u0924 \u092e\u0947\u0902 \u092c\u094b\u0932\u0940 \u091c\u093e\u0924\u0940 \u0939\u0948\u0964",
    "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd, \u0417\u0434\u0440\u0430\u0432\u0441\u0442\u0432\u0443\u0439 \u043c\u0438\u0440, \u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5 \u039a\u03cc\u03c3\u03bc\u03b5",
    "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a \u0ba4\u0bae\u0bbf\u0bb4\u0bcd \u1797\u17b6\u179f\u17b6\u1781\u17d2\u1798\u17c2\u179a Ti\u1ebfng Vi\u1ec7t",
    "family \U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 couple \U0001f469\u200d\u2764\ufe0f\u200d\U0001f468 rainbow \U0001f3f3\ufe0f\u200d\U0001f308",
    "thumbs \U0001f44d\U0001f3fb\U0001f44d\U0001f3fc\U0001f44d\U0001f3fd\U0001f44d\U0001f3fe\U0001f44d\U0001f3ff flags \U0001f1ef\U0001f1f5\U0001f1fa\U0001f1f8 keycap 1\ufe0f\u20e3 #\ufe0f\u20e3",
    "\U0001f600\U0001f603\U0001f604\U0001f601\U0001f606\U0001f605\U0001f923\U0001f602\U0001f642\U0001f643\U0001fae0\U0001f609",
    "math \U0001d400\U0001d401\U0001d402 \u2200x\u2208\u211d: x\u00b2 \u2265 0, \u222b\u2080\u00b9 f(x)dx \u2248 \u2211 \u220f \u221e",
    "zero\u200bwidth\u200cnon\u200djoiner\u2060word\ufeffbom",
    "\ufeffBOM at start",
    "controls \x00\x01\x02\x07\x08\x0b\x0c\x1b[31mred\x1b[0m\x7f",
    "odd spaces \u0085nel \u1680ogham \u180emongolian \u2000\u2001\u2002\u2003\u2009\u200a \u2028ls \u2029ps \u202f \u205f",
    "private use \ue000\uf8ff and noncharacters \ufdd0 \ufffe\uffff edge \U0010fffd \U000e0001",
    "replacement char \ufffd in text \ufffd\ufffd",
    "https://example.com/path?query=1&b=two#frag user@example.org ftp://x.y/z",
    "aGVsbG8gd29ybGQhIFRoaXMgaXMgYmFzZTY0IGVuY29kZWQ=/+==",
    "supercalifragilisticexpialidocious antidisestablishmentarianism pneumonoultramicroscopicsilicovolcanoconiosis",
    "CamelCaseIdentifier snake_case_identifier SCREAMING_CASE kebab-case-word __dunder__",
    "$$\\frac{a}{b} + \\sqrt{x^2 + y^2} = \\sum_{i=1}^{n} i$$",
    "| col1 | col2 |\n|------|------|\n| **b** | _i_ |\n\n> quote\n\n- [ ] todo\n```\ncode\n```",
    "!!!???...,,,;;;:::---___===+++***&&&%%%$$$###@@@^^^~~~```",
    "'''\"\"\"'\"'\"",
    "'s's's 't're 'RE 'Ve 'LL 'D 'M",
    "x'sy x'S 123's",
    "emoji\U0001f600text\U0001f600\U0001f600more",
    "mixed\u4e2d\u6587English\u65e5\u672c\u8a9e\ud55c\uad6d\uc5b4123\u0627\u0644\u0639\u0631\u0628\u064a\u0629",
    "\u3042\u3044\u3046\u3048\u304a\u30a2\u30a4\u30a6\u30a8\u30aa\u30fc\u30f4 kana and \u4e00\u9fa5\u9fa6\u9fff edge CJK",
    "\u3400\u4db5 ext-A \U00020000\U0002a6d6 ext-B",
    "\u00a0\u00a0\u00a0nbsp run\u00a0\u00a0",
    "end with newline\n",
    "end with spaces   ",
    "end with tab\t",
    "\n\nstart with newlines",
    "word\n\n\n\n\nword",
    "a \n b \n\n c",
    "   \n   \n",
]

CODE = [
    "def fibonacci(n: int) -> int:\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "#include <iostream>\n\nint main(int argc, char** argv) {\n  std::cout << \"Hello\" << std::endl;\n  return 0;\n}\n",
    "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}\n",
    "const add = (a, b) => a + b;\nexport default async function handler(req, res) {\n\tawait res.json({ ok: true });\n}\n",
    "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"hi\")\n}\n",
    "SELECT u.id, COUNT(*) AS n FROM users u JOIN orders o ON o.user_id = u.id WHERE o.total > 100 GROUP BY u.id;\n",
    "<!DOCTYPE html>\n<html><head><title>T</title></head><body><div class=\"x\">&amp; &lt;b&gt;</div></body></html>\n",
    "{\"key\": [1, 2.5, -3e10, true, null], \"nested\": {\"a\": \"\\u00e9\\n\"}}\n",
    "#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do\n  echo \"$f\" | sed 's/a/b/g' >> out.log\ndone\n",
    "public class Main {\n    public static void main(String[] args) {\n        System.out.println(\"Hello\");\n    }\n}\n",
    "    indented_code = True\n        deeper = [x for x in range(10) if x % 2 == 0]\n\n\n    back = {}\n",
    "template <typename T>\nstd::vector<T> Filter(const std::vector<T>& v) {\n  return v;  // TODO(me): 0x1F & ~0u\n}\n",
]

PROSE = [
    "In the beginning the Universe was created. This has made a lot of people very angry and been widely regarded as a bad move.",
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of foolishness.",
    "Machine learning models are trained on large datasets; tokenization splits text into subword units.",
    "She sells sea-shells on the sea-shore. The shells she sells are sea-shells, I'm sure.",
    "Dr. Smith's lab (est. 1998) publishes ~40 papers/year, e.g. on CRISPR-Cas9 & mRNA vaccines.",
    "\u4eba\u5de5\u667a\u80fd\u662f\u8ba1\u7b97\u673a\u79d1\u5b66\u7684\u4e00\u4e2a\u5206\u652f\uff0c\u5b83\u4f01\u56fe\u4e86\u89e3\u667a\u80fd\u7684\u5b9e\u8d28\u3002",
    "\u543e\u8f29\u306f\u732b\u3067\u3042\u308b\u3002\u540d\u524d\u306f\u307e\u3060\u7121\u3044\u3002\u3069\u3053\u3067\u751f\u308c\u305f\u304b\u3068\u3093\u3068\u898b\u5f53\u304c\u3064\u304b\u306c\u3002",
    "\ubaa8\ub4e0 \uc778\uac04\uc740 \ud0dc\uc5b4\ub0a0 \ub54c\ubd80\ud130 \uc790\uc720\ub85c\uc6b0\uba70 \uadf8 \uc874\uc5c4\uacfc \uad8c\ub9ac\uc5d0 \uc788\uc5b4 \ub3d9\ub4f1\ud558\ub2e4.",
    "\u064a\u0648\u0644\u062f \u062c\u0645\u064a\u0639 \u0627\u0644\u0646\u0627\u0633 \u0623\u062d\u0631\u0627\u0631\u064b\u0627 \u0645\u062a\u0633\u0627\u0648\u064a\u0646 \u0641\u064a \u0627\u0644\u0643\u0631\u0627\u0645\u0629 \u0648\u0627\u0644\u062d\u0642\u0648\u0642.",
    "\u0938\u092d\u0940 \u092e\u0928\u0941\u0937\u094d\u092f\u094b\u0902 \u0915\u094b \u0917\u094c\u0930\u0935 \u0914\u0930 \u0905\u0927\u093f\u0915\u093e\u0930\u094b\u0902 \u0915\u0947 \u092e\u093e\u092e\u0932\u0947 \u092e\u0947\u0902 \u091c\u0928\u094d\u092e\u091c\u093e\u0924 \u0938\u094d\u0935\u0924\u0902\u0924\u094d\u0930\u0924\u093e \u092a\u094d\u0930\u093e\u092a\u094d\u0924 \u0939\u0948\u0964",
    "Der schnelle braune Fuchs springt \u00fcber den faulen Hund. \u00c4rger, \u00d6l, \u00dcbel, Stra\u00dfe.",
    "Le c\u0153ur a ses raisons que la raison ne conna\u00eet point. \u00c7a va? \u00c0 bient\u00f4t!",
    "\u00bfD\u00f3nde est\u00e1 la biblioteca? \u00a1Ma\u00f1ana ser\u00e1 otro d\u00eda!",
]

FRAGMENTS = (
    CODE + PROSE
    + ["<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|eot_id|>", "<think>", "</think>",
       "<\uff5cbegin\u2581of\u2581sentence\uff5c>", "<\uff5cend\u2581of\u2581sentence\uff5c>",
       "<|endoftext|>", "<tool_call>", "<|reserved_special_token_5|>"]
    + ["\U0001f468\u200d\U0001f469\u200d\U0001f467", "\U0001f44b\U0001f3fe", "\U0001f1e9\U0001f1ea",
       "\u2764\ufe0f", "\U0001f9d1\U0001f3fd\u200d\U0001f4bb", "\u2603"]
    + ["42", "007", "1000000", "12345678901234567890", "3.5e-10", "0xDEADBEEF", "2026-12-02T15:32:53Z",
       "\uff19\uff18", "\u0661\u0662"]
    + ["e\u0301", "n\u0303", "\u1100\u1161", "\u0915\u094d\u0937", "\u0627\u064b"]
)
SEPARATORS = [" ", "  ", "\n", "\n\n", "\t", " \t ", "\r\n", "", "   \n", "\u00a0", "\u3000", " " * 17]


def make_corpus():
    rng = random.Random(SEED)
    texts = list(HAND_WRITTEN) + CODE + PROSE
    # Random mixes of fragments and separators.
    while len(texts) < 330:
        parts = []
        for _ in range(rng.randint(1, 7)):
            frag = rng.choice(FRAGMENTS)
            mode = rng.random()
            if mode < 0.15:
                # A random slice on code-point boundaries.
                a = rng.randint(0, len(frag))
                b = rng.randint(a, len(frag))
                frag = frag[a:b]
            elif mode < 0.25:
                frag = frag.upper()
            elif mode < 0.3:
                frag = frag * rng.randint(2, 5)
            parts.append(frag)
            parts.append(rng.choice(SEPARATORS))
        texts.append("".join(parts))
    # Random code points from many blocks (never surrogates).
    blocks = [(0x20, 0x7E), (0xA0, 0x24F), (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x4FF),
              (0x590, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F), (0x1100, 0x11FF), (0x2000, 0x206F),
              (0x2100, 0x22FF), (0x3000, 0x30FF), (0x4E00, 0x9FFF), (0xAC00, 0xD7A3),
              (0xFF00, 0xFFEF), (0x1F300, 0x1FAFF), (0x1D400, 0x1D7FF)]
    for _ in range(30):
        chars = []
        for _ in range(rng.randint(5, 60)):
            lo, hi = rng.choice(blocks)
            chars.append(chr(rng.randint(lo, hi)))
            if rng.random() < 0.2:
                chars.append(rng.choice([" ", "\n", "  ", "\t"]))
        texts.append("".join(chars))
    # Random printable ASCII soup (punctuation, digit and apostrophe edge cases).
    alphabet = "abcXYZ019 '\"!?.,;:-_()[]{}<>|/\\\t\n\r@#$%^&*+=~`"
    for _ in range(20):
        texts.append("".join(rng.choice(alphabet) for _ in range(rng.randint(10, 120))))
    return texts


def load_corpus():
    with open(CORPUS, encoding="utf-8") as f:
        return json.load(f)


def make_goldens(out_dir):
    import tokenizers
    texts = load_corpus()
    rng = random.Random(SEED + 1)
    os.makedirs(out_dir, exist_ok=True)
    for name in NAMES:
        directory = os.path.join(ROOT, ".deps", "tokenizers", name)
        tok = tokenizers.Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
        cases = []
        for text in texts:
            ids = tok.encode(text, add_special_tokens=False).ids
            with_special = tok.encode(text, add_special_tokens=True).ids
            decoded = tok.decode(ids, skip_special_tokens=False)
            decoded_skip = tok.decode(ids, skip_special_tokens=True)
            case = {"ids": ids, "roundtrip": decoded == text}
            if with_special != ids:
                case["with_special"] = with_special
            if decoded != text:
                case["decoded"] = decoded
            if decoded_skip != decoded:
                case["decoded_skip"] = decoded_skip
            cases.append(case)
        # Decoding of arbitrary id sequences: random ids (special ones included) and byte-split
        # characters, to pin down U+FFFD placement and skip_special_tokens.
        size = tok.get_vocab_size(with_added_tokens=True)
        specials = [t.content for t in tok.get_added_tokens_decoder().values() if t.special]
        special_ids = [tok.token_to_id(s) for s in specials][:20]
        decode_cases = []
        for _ in range(60):
            seq = [rng.randrange(size) for _ in range(rng.randint(1, 12))]
            if rng.random() < 0.5 and special_ids:
                seq.insert(rng.randrange(len(seq) + 1), rng.choice(special_ids))
            decode_cases.append(seq)
        for text in ["\u00e9", "\u4e2d\u6587", "\U0001f600", "\U0001f468\u200d\U0001f469"]:
            ids = tok.encode(text, add_special_tokens=False).ids
            for cut in range(1, len(ids)):
                decode_cases.append(ids[:cut])
                if special_ids:
                    decode_cases.append(ids[:cut] + [special_ids[0]] + ids[cut:])
        decodes = [{"ids": seq, "text": tok.decode(seq, skip_special_tokens=False),
                    "skip": tok.decode(seq, skip_special_tokens=True)} for seq in decode_cases]
        transformers_cases = []
        try:
            import transformers
            auto = transformers.AutoTokenizer.from_pretrained(directory)
            for text in texts[:40]:
                transformers_cases.append({"text_index": texts.index(text),
                                           "ids": auto(text, add_special_tokens=True)["input_ids"]})
            transformers_version = transformers.__version__
        except Exception as e:  # Recorded, not fatal: the goldens are from `tokenizers`.
            transformers_version = "unavailable: %r" % (e,)
        golden = {"tokenizer": name, "tokenizers_version": tokenizers.__version__,
                  "transformers_version": transformers_version,
                  "num_texts": len(texts), "cases": cases, "decodes": decodes,
                  "transformers_with_special": transformers_cases}
        with open(os.path.join(out_dir, "golden_%s.json" % name), "w", encoding="utf-8") as f:
            json.dump(golden, f, ensure_ascii=False, separators=(",", ":"))
        print(name, "cases", len(cases), "roundtrip", sum(c["roundtrip"] for c in cases),
              "with_special differs", sum("with_special" in c for c in cases))


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "corpus":
        texts = make_corpus()
        os.makedirs(FIXTURES, exist_ok=True)
        with open(CORPUS, "w", encoding="utf-8") as f:
            json.dump(texts, f, ensure_ascii=False, indent=0)
            f.write("\n")
        print("wrote", CORPUS, len(texts), "texts")
    elif len(sys.argv) >= 3 and sys.argv[1] == "goldens":
        make_goldens(sys.argv[2])
    else:
        print(__doc__)
        sys.exit(2)


if __name__ == "__main__":
    main()
