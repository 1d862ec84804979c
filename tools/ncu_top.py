#!/usr/bin/env python3
"""ncu_top.py — sums an `ncu --csv --metrics gpu__time_duration.sum` log by kernel name.

    ncu --csv --metrics gpu__time_duration.sum <program> > prof.csv
    python3 tools/ncu_top.py prof.csv [top] [--last-step]

Prints the kernels by total time (count, total ms, share), the total kernel time and the
number of launches: the GPU-time breakdown of a run (nsys is not on the GPU machine).
--last-step keeps only the last training step of `linmoe train`: the launches from the last
embed_fwd_k (a step's first kernel) before the last adamw_k through that adamw_k (the
evaluation after training runs forwards only).
"""
import csv
import sys
from collections import defaultdict


def main():
    path = sys.argv[1]
    args = [a for a in sys.argv[2:] if not a.startswith("--")]
    top = int(args[0]) if args else 40
    last_step = "--last-step" in sys.argv
    rows = []
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]   # skip ncu's ==PROF== lines
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        v = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "ns")
        scale = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0}.get(unit, 1e-6)
        name = r["Kernel Name"].split("(")[0].split("<")[0]
        rows.append((name, v * scale))
    if last_step:
        opt = [i for i, (n, _) in enumerate(rows) if n == "adamw_k"]
        starts = [i for i, (n, _) in enumerate(rows) if n == "embed_fwd_k" and opt and i < opt[-1]]
        if not starts:
            sys.exit("ncu_top: --last-step: no embed_fwd_k ... adamw_k step in the log")
        rows = rows[starts[-1]:opt[-1] + 1]
    tot = defaultdict(float)
    cnt = defaultdict(int)
    for n, ms in rows:
        tot[n] += ms
        cnt[n] += 1
    all_ms = sum(tot.values())
    print(f"{len(rows)} kernel launches, {all_ms:.2f} ms of kernel time")
    print(f"{'kernel':60s} {'count':>6s} {'ms':>9s} {'share':>6s}")
    for n, ms in sorted(tot.items(), key=lambda x: -x[1])[:top]:
        print(f"{n[:60]:60s} {cnt[n]:6d} {ms:9.3f} {100 * ms / all_ms:5.1f}%")


if __name__ == "__main__":
    main()
