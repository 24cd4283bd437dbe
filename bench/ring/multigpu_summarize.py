"""One markdown row of the multi-GPU ring benchmark (bench/ring/multigpu_run.sh) from
ringserve_loadgen JSON: the columns of bench/ring/MULTIGPU_PREDICTION.md's tables plus the hop
bytes a step (each sending stage's bytes_sent / steps, as its own counters report them).

usage: multigpu_summarize.py RUNS_DIR NAME STREAMS   (reads RUNS_DIR/NAME_nSTREAMS.json; "of 1 GPU"
compares with RUNS_DIR/g1_nSTREAMS.json when it exists)
"""
import json
import os
import sys

runs, name, n = sys.argv[1], sys.argv[2], sys.argv[3]


def load(ring):
    path = os.path.join(runs, f"{ring}_n{n}.json")
    return json.load(open(path)) if os.path.exists(path) else None


run = load(name)
if run is None:
    print(f"| {name} | {n} | failed | | | | | | |")
    sys.exit(0)
base = load("g1")
tps = run["output_tokens_per_s"]
rel = f"{tps / base['output_tokens_per_s']:.2f}x" if base and base["output_tokens_per_s"] else "-"
stages = run.get("stages", [])
busy = " ".join(f"{s.get('busy_fraction_run', 0):.2f}" for s in stages)
# The stages' counters over this point's run (loadgen: end - start).
hop = " ".join(f"{s['bytes_sent'] / s['steps'] / 1024:.0f}" for s in stages[:-1]
               if s.get("steps"))
print(f"| {name} | {n} | {tps:,.1f} | {rel} | {run['ttft_ms'].get('p50', 0):.1f} | "
      f"{run['itl_ms'].get('p50', 0):.2f} | {run['itl_ms'].get('p99', 0):.2f} | {busy} | {hop} |")
