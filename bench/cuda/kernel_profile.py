#!/usr/bin/env python3
"""Summarizes an Nsight Compute CSV (ncu --csv --page raw --metrics gpu__time_duration.sum) by
kernel: launches, grid, mean and total GPU time, sorted by total. Kernels are told apart by
name and grid size, so a decode step's kernels (small grids) and a prefill's are separate rows.
Usage: kernel_profile.py PROFILE.csv [--per N]   (--per: divide counts and totals by N, e.g. the
number of decode steps profiled, to read the table per step)."""
import argparse
import collections
import csv
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--per", type=float, default=1.0)
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    rows = list(csv.reader(open(args.csv, newline="")))
    header_at = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
    header = rows[header_at]
    name_col = header.index("Kernel Name")
    grid_col = header.index("Grid Size")
    time_col = header.index("gpu__time_duration.sum")
    unit = rows[header_at + 1][time_col] if header_at + 1 < len(rows) else "ns"
    scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}.get(unit, 1e-3)
    stats = collections.defaultdict(lambda: [0, 0.0])
    for r in rows[header_at + 1:]:
        if len(r) <= time_col:
            continue
        try:
            t = float(r[time_col].replace(",", "")) * scale
        except ValueError:
            continue
        name = r[name_col].split("(")[0][:70]
        s = stats[(name, r[grid_col])]
        s[0] += 1
        s[1] += t
    total = sum(s[1] for s in stats.values())
    print(f"{'kernel':70} {'grid':>14} {'count':>8} {'mean us':>9} {'total us':>10} {'share':>6}")
    for (name, grid), (n, t) in sorted(stats.items(), key=lambda kv: -kv[1][1])[: args.top]:
        print(f"{name:70} {grid:>14} {n / args.per:8.1f} {t / n:9.2f} {t / args.per:10.1f} "
              f"{100 * t / total:5.1f}%")
    print(f"total GPU time {total / args.per:.1f} us (per {args.per:g})")


if __name__ == "__main__":
    sys.exit(main())
