"""One markdown row of bench/ring/plan_ahead_run.sh from ringserve_loadgen JSON.

usage: plan_ahead_summarize.py RUNS_DIR NAME STREAMS   (reads RUNS_DIR/NAME_nSTREAMS.json)
tok/s: output tokens over the run's wall time (the prefills at its start included); decode
tok/s: streams / mean inter-token gap (the decode phase alone); ITL max: the longest gap (a stall).
"""
import json
import os
import sys

runs, name, n = sys.argv[1], sys.argv[2], sys.argv[3]
path = os.path.join(runs, f"{name}_n{n}.json")
if not os.path.exists(path):
    print(f"| {name} | {n} | failed | | | | |")
    sys.exit(0)
run = json.load(open(path))
itl = run["itl_ms"]
decode = int(n) * 1000.0 / itl["mean"] if itl.get("mean") else 0.0
busy = " ".join(f"{s.get('busy_fraction_run', 0):.3f}" for s in run.get("stages", []))
print(f"| {name} | {n} | {run['output_tokens_per_s']:,.1f} | {decode:,.1f} | "
      f"{itl.get('p50', 0):.2f} | {itl.get('max', 0):.1f} | {busy} |")
