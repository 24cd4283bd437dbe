#!/usr/bin/env python3
"""Renders the chat-template golden strings with transformers' apply_chat_template.

Runs on the GPU device (which has transformers); the tokenizers come from
scripts/fetch_npm_assets.sh (.deps/tokenizers/{qwen3,llama3,deepseek_v3}):

    python3 scripts/make_chat_goldens.py --out $OUT/goldens.json

Inputs (committed): tests/fixtures/chat/conversations.json (real templates, plus the Llama
3.1-style template tests/fixtures/chat/llama3_1_chat_template.jinja rendered with the llama3
tokenizer) and tests/fixtures/chat/snippets.json (small templates covering the Jinja features).
Output: tests/fixtures/chat/goldens.json, checked byte for byte by coordinator/chat tests.

--emulate renders with plain jinja2 set up like transformers (for development only; the
committed goldens must come from transformers).
"""
import argparse
import inspect
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "tests", "fixtures", "chat")
TOK_DIR = os.path.join(ROOT, ".deps", "tokenizers")
TEMPLATES = {"qwen3": "qwen3", "llama3": "llama3", "deepseek_v3": "deepseek_v3", "llama3_1": "llama3"}


class EmulatedTokenizer:
    """jinja2 environment as transformers' chat_template_utils builds it."""

    def __init__(self, tok_dir):
        import jinja2
        from jinja2.ext import Extension
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        from datetime import datetime

        cfg = json.load(open(os.path.join(tok_dir, "tokenizer_config.json"), encoding="utf-8"))
        self.template = cfg["chat_template"]
        self.special = {}
        for k in ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                  "mask_token"]:
            v = cfg.get(k)
            if isinstance(v, dict):
                v = v.get("content")
            if v is not None:
                self.special[k] = v

        class Gen(Extension):
            tags = {"generation"}

            def parse(self, parser):
                lineno = next(parser.stream).lineno
                body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
                return jinja2.nodes.CallBlock(self.call_method("_r"), [], [], body).set_lineno(lineno)

            def _r(self, caller):
                return caller()

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                              sort_keys=sort_keys)

        self.env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                 extensions=[Gen, jinja2.ext.loopcontrols])
        self.env.filters["tojson"] = tojson
        self.env.globals["raise_exception"] = raise_exception
        self.env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)

    def apply_chat_template(self, messages, tools=None, chat_template=None, tokenize=False,
                            add_generation_prompt=False, **kwargs):
        t = self.env.from_string(chat_template or self.template)
        return t.render(messages=messages, tools=tools, documents=None,
                        add_generation_prompt=add_generation_prompt, **{**self.special, **kwargs})


def render(tok, messages, tools, gen, kwargs, chat_template=None):
    try:
        extra = {"chat_template": chat_template} if chat_template is not None else {}
        out = tok.apply_chat_template(messages, tools=tools, tokenize=False,
                                      add_generation_prompt=gen, **extra, **kwargs)
        if not isinstance(out, str):
            return {"error": "NotAString", "message": repr(out)[:500]}
        return {"rendered": out}
    except Exception as e:  # the golden records that transformers refuses this input
        return {"error": type(e).__name__, "message": str(e)[:500]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(FIX, "goldens.json"))
    ap.add_argument("--emulate", action="store_true")
    ap.add_argument("--dump_source", default="", help="directory for transformers' source")
    args = ap.parse_args()

    import jinja2
    gen_info = {"jinja2": jinja2.__version__, "python": sys.version.split()[0]}
    if args.emulate:
        load = EmulatedTokenizer
        gen_info["transformers"] = "none (emulated with jinja2; not for committing)"
    else:
        import transformers
        from transformers import AutoTokenizer
        gen_info["transformers"] = transformers.__version__
        load = AutoTokenizer.from_pretrained
        if args.dump_source:
            os.makedirs(args.dump_source, exist_ok=True)
            from transformers.utils import chat_template_utils
            with open(os.path.join(args.dump_source, "chat_template_utils.py"), "w") as f:
                f.write(inspect.getsource(chat_template_utils))
            from transformers import tokenization_utils_base as tub
            with open(os.path.join(args.dump_source, "apply_chat_template.py"), "w") as f:
                f.write(inspect.getsource(tub.PreTrainedTokenizerBase.apply_chat_template))

    tokenizers = {}
    for name in sorted(set(TEMPLATES.values())):
        tokenizers[name] = load(os.path.join(TOK_DIR, name))
    llama31 = open(os.path.join(FIX, "llama3_1_chat_template.jinja"), encoding="utf-8").read()

    conv = json.load(open(os.path.join(FIX, "conversations.json"), encoding="utf-8"))
    result = {"generator": gen_info, "conversations": {}, "snippets": []}
    for tname, tokname in TEMPLATES.items():
        rows = []
        for case in conv["cases"]:
            if tname not in case["templates"]:
                continue
            kwargs = {**conv.get("template_kwargs", {}).get(tname, {}), **case.get("kwargs", {})}
            r = render(tokenizers[tokname], case["messages"], case.get("tools"),
                       case["add_generation_prompt"], kwargs,
                       llama31 if tname == "llama3_1" else None)
            rows.append({"name": case["name"], **r})
        result["conversations"][tname] = rows

    snips = json.load(open(os.path.join(FIX, "snippets.json"), encoding="utf-8"))
    for s in snips["snippets"]:
        r = render(tokenizers["llama3"], s["messages"], None, s["add_generation_prompt"],
                   s.get("kwargs", {}), s["template"])
        result["snippets"].append({"name": s["name"], **r})

    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n_err = sum("error" in r for rows in result["conversations"].values() for r in rows)
    n_err += sum("error" in r for r in result["snippets"])
    print(f"wrote {args.out}: {gen_info}, errors recorded: {n_err}")


if __name__ == "__main__":
    main()
