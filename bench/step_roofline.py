"""step_roofline.py — where one training step's time goes, against each kernel's own floor.

Reads Nsight Compute's raw CSV of one step (`LINMOE_PROFILE_STEP=n` brackets step n):

    LINMOE_PROFILE_STEP=3 ncu --profile-from-start off --clock-control none --cache-control none \
        --csv --page raw --print-units base --metrics gpu__time_duration.sum,dram__bytes_read.sum,\
dram__bytes_write.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed \
        build/cuda/linmoe train --device cuda --preset small --seq 4096 --batch 4 --steps 3 \
        --no-checkpoints > step.csv
    python3 bench/step_roofline.py step.csv --tflop 17.2   # 1.05 GFLOP/token × 16,384 tokens

(a gzipped CSV, as bench/results keeps them, is read as it is). With `--base old.csv` it also
lists what changed from an earlier profile (an A/B of two builds or settings): per family and
per kernel name, launches, ms and DRAM GB before → after, the largest changes first; a kernel
found in one profile only shows 0 launches in the other.

For every kernel: its DRAM bytes at the copy rate (--bw, TB/s) and its tensor-pipe busy time
(the time × the pipe's busy share) are two floors it cannot beat without moving fewer bytes
or doing fewer tensor instructions; the larger is the kernel's floor. The step's floor is
their sum per kernel family, and the model FLOPs over that floor bound the MFU this
decomposition into kernels can reach (the kernels run one after another on one stream).
"""
import argparse
import csv
import gzip
import re
import sys

FAMILIES = [  # first match wins
    ("expert GEMMs", r"wt_gemm_k|wt_dw_k|tc_rows|tc_dw|tc_sched|moe_gemm|grouped"),
    ("cuBLAS dense GEMMs", r"nvjet|cublas|splitKreduce|gemm|sm90_xmma|cutlass"),
    ("KDA", r"kda_|conv_|gated_"),
    ("AttnRes mixers", r"attnres"),
    ("MoE besides the GEMMs", r"route|plan|gather|combine|glu|qb_|moe|expert|balanc"),
    ("MLA attention", r"fa_|mla|attn|split|sgate"),
    ("optimizer and gradient norm", r"adamw|muon|sumsq"),
    ("the rest", r"."),
]
M_TIME, M_RD, M_WR, M_TC = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
                            "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed")


def num(s):
    s = (s or "").replace(",", "").strip()
    return float(s) if s and s not in ("n/a", "N/A") else 0.0


def read(path):
    opener = gzip.open if path.endswith(".gz") else open   # the logs keep them gzipped
    try:
        with opener(path, "rt", newline="") as f:
            lines = [ln for ln in f if ln.startswith('"')]   # ncu's own log lines start with ==
    except (OSError, UnicodeDecodeError) as e:
        sys.exit(f"step_roofline: {path}: {e}")
    rows = list(csv.reader(lines))
    if len(rows) < 3:
        sys.exit(f"step_roofline: {path}: no kernels in the CSV")
    head, units = rows[0], rows[1]
    col = {h: i for i, h in enumerate(head)}
    for m in (M_TIME, M_RD, M_WR, "Kernel Name"):
        if m not in col:
            sys.exit(f"step_roofline: {path}: no column {m}")
    if units[col[M_TIME]] not in ("ns", "nsecond"):
        sys.exit(f"step_roofline: {path}: time in {units[col[M_TIME]]} (run ncu with --print-units base)")
    out = []
    for r in rows[2:]:
        out.append(dict(name=r[col["Kernel Name"]], ns=num(r[col[M_TIME]]),
                        bytes=num(r[col[M_RD]]) + num(r[col[M_WR]]),
                        tc=num(r[col[M_TC]]) if M_TC in col else 0.0))
    return out


def family(name):
    for fam, rx in FAMILIES:
        if re.search(rx, name, re.I):
            return fam
    return "the rest"


def add(sums, k):
    """Adds kernel k's time, bytes and floors into the running sums of a family or a kernel name."""
    for key, val in (("n", 1), ("ms", k["ns"] * 1e-6), ("gb", k["bytes"] * 1e-9), ("mem", k["mem_ms"]),
                     ("tcm", k["tc_ms"]), ("floor", k["floor_ms"])):
        sums[key] = sums.get(key, 0) + val


def totals(ks):
    """Per family and per kernel name (its first 60 characters): launches, ms, DRAM GB."""
    fams, names = {}, {}
    for k in ks:
        for key, d in ((family(k["name"]), fams), (k["name"][:60], names)):
            t = d.setdefault(key, [0, 0.0, 0.0])
            t[0] += 1
            t[1] += k["ns"] * 1e-6
            t[2] += k["bytes"] * 1e-9
    return fams, names


def diff(base, ks, top):
    """What changed from profile `base` to `ks`: families, then the kernels whose time moved most."""
    (fb, nb), (fa, na) = totals(base), totals(ks)
    zero = [0, 0.0, 0.0]
    tb, ta = [sum(t[i] for t in fb.values()) for i in range(3)], [sum(t[i] for t in fa.values()) for i in range(3)]
    print(f"\nagainst the base profile: {tb[0]} → {ta[0]} kernels, {tb[1]:.2f} → {ta[1]:.2f} ms "
          f"({ta[1] - tb[1]:+.2f}), DRAM {tb[2]:.2f} → {ta[2]:.2f} GB ({ta[2] - tb[2]:+.2f})")
    print("| family | launches | ms | Δ ms | DRAM GB |")
    print("|---|---|---|---|---|")
    for fam, _ in FAMILIES:
        b, a = fb.get(fam, zero), fa.get(fam, zero)
        if b[0] or a[0]:
            print(f"| {fam} | {b[0]} → {a[0]} | {b[1]:.2f} → {a[1]:.2f} | {a[1] - b[1]:+.2f} | {b[2]:.2f} → {a[2]:.2f} |")
    print(f"\n| kernel (largest changes in time) | launches | ms | Δ ms | DRAM GB |")
    print("|---|---|---|---|---|")
    keys = sorted(set(nb) | set(na), key=lambda n: -abs(na.get(n, zero)[1] - nb.get(n, zero)[1]))
    for n in keys[:top]:
        b, a = nb.get(n, zero), na.get(n, zero)
        print(f"| {n} | {b[0]} → {a[0]} | {b[1]:.2f} → {a[1]:.2f} | {a[1] - b[1]:+.2f} | {b[2]:.2f} → {a[2]:.2f} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--bw", type=float, default=4.27, help="DRAM floor rate, TB/s (a device copy on the H200)")
    ap.add_argument("--peak", type=float, default=989.0, help="dense bf16 peak, TFLOP/s (H200 SXM)")
    ap.add_argument("--tflop", type=float, default=0.0, help="the step's model TFLOP (linmoe prints GFLOP/token)")
    ap.add_argument("--top", type=int, default=12, help="kernels listed by their distance from their floor")
    ap.add_argument("--base", help="an earlier profile's CSV: also list what changed from it")
    a = ap.parse_args()
    ks = read(a.csv)
    base = read(a.base) if a.base else None
    fams = {}
    for k in ks:
        k["mem_ms"] = k["bytes"] / (a.bw * 1e12) * 1e3
        k["tc_ms"] = k["ns"] * 1e-6 * k["tc"] / 100.0
        k["floor_ms"] = max(k["mem_ms"], k["tc_ms"])
        add(fams.setdefault(family(k["name"]), {}), k)
    tot = {key: sum(f[key] for f in fams.values()) for key in ("n", "ms", "gb", "mem", "tcm", "floor")}
    print(f"{int(tot['n'])} kernels, {tot['ms']:.2f} ms of kernel time; floors: DRAM bytes at {a.bw} TB/s, "
          f"tensor pipe busy time")
    print(f"| family | kernels | ms | share | DRAM GB | TB/s | DRAM floor ms | tensor busy ms | floor ms | ms over floor |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for fam, _ in FAMILIES:
        if fam not in fams:
            continue
        f = fams[fam]
        print(f"| {fam} | {f['n']} | {f['ms']:.2f} | {100 * f['ms'] / tot['ms']:.1f}% | {f['gb']:.2f} | "
              f"{f['gb'] / f['ms']:.2f} | {f['mem']:.2f} | {f['tcm']:.2f} | {f['floor']:.2f} | {f['ms'] - f['floor']:.2f} |")
    print(f"| all | {int(tot['n'])} | {tot['ms']:.2f} | 100% | {tot['gb']:.2f} | {tot['gb'] / tot['ms']:.2f} | "
          f"{tot['mem']:.2f} | {tot['tcm']:.2f} | {tot['floor']:.2f} | {tot['ms'] - tot['floor']:.2f} |")
    if a.tflop > 0:
        mfu = lambda ms: a.tflop * 1e12 / (ms * 1e-3) / (a.peak * 1e12) * 100
        print(f"\nmodel {a.tflop:.2f} TFLOP a step: {mfu(tot['ms']):.1f}% MFU at the kernels' sum, "
              f"{mfu(tot['floor']):.1f}% if every kernel ran at its floor; 40% needs a "
              f"{a.tflop * 1e12 / (0.4 * a.peak * 1e12) * 1e3:.2f} ms step")
    # the kernels (by name) furthest above their floors
    by = {}
    for k in ks:
        add(by.setdefault(k["name"][:60], {}), k)
    print(f"\n| kernel | launches | ms | floor ms | over | DRAM GB | TB/s | tensor busy |")
    print("|---|---|---|---|---|---|---|---|")
    for name, b in sorted(by.items(), key=lambda kv: kv[1]["floor"] - kv[1]["ms"])[:a.top]:
        print(f"| {name} | {b['n']} | {b['ms']:.2f} | {b['floor']:.2f} | {b['ms'] - b['floor']:.2f} | {b['gb']:.2f} | "
              f"{b['gb'] / b['ms']:.2f} | {100 * b['tcm'] / b['ms']:.0f}% |")
    if base is not None:
        diff(base, ks, a.top)


if __name__ == "__main__":
    main()
