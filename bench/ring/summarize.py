"""One markdown row of the ring benchmark (bench/ring/device_run.sh) from ringserve_loadgen JSON.

usage: summarize.py RUNS_DIR NAME STREAMS   (reads RUNS_DIR/NAME_nSTREAMS.json; "of 1 stage"
compares with RUNS_DIR/s1_nSTREAMS.json when it exists)
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
    print(f"| {name} | {n} | failed | | | | | |")
    sys.exit(0)
base = load("s1")
tps = run["output_tokens_per_s"]
rel = f"{tps / base['output_tokens_per_s']:.1%}" if base and base["output_tokens_per_s"] else "-"
busy = " ".join(f"{s.get('busy_fraction_run', 0):.2f}" for s in run.get("stages", []))
print(f"| {name} | {n} | {tps:,.1f} | {rel} | {run['ttft_ms'].get('p50', 0):.1f} | "
      f"{run['itl_ms'].get('p50', 0):.2f} | {run['itl_ms'].get('p99', 0):.2f} | {busy} |")
