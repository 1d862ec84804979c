"""bench_kda_fla.py — fla's Triton `chunk_kda` (fla-org/flash-linear-attention) timed on the
shapes of bench/bench_kda.cu, and the side-by-side table with our CUDA kernels.

bf16, K = V = 128, gate / L2 norm / β sigmoid inside the kernel, initial state in and final
state out; bounded = safe_gate=True, lower_bound=-5; unbounded = the softplus gate.
fwd: the forward under no_grad; fwdbwd: forward + backward of Σ o·do.
Medians of triton.testing.do_bench (CUDA events; warm-up 25 ms, 100 ms of repetitions).
With --ours FILE (the output of build/cuda/bench_kda) prints both side by side; with
--ctypes also times our kernels through bench/kda_ctypes.py in this same harness.

    PYTHONPATH=<dir holding fla> python3 bench/bench_kda_fla.py --ours ours.txt [--ctypes]
"""
import argparse
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fla.ops.kda import chunk_kda  # noqa: E402

SHAPES = [(1, 8192, 96, True), (2, 16384, 16, True), (4, 2048, 16, True), (4, 4096, 64, True), (8, 2048, 32, True),
          (1, 65536, 32, True), (1, 1048576, 32, False)]


def bench(fn, grad_to_none=None):
    return triton.testing.do_bench(fn, warmup=25, rep=100, quantiles=[0.5, 0.2, 0.8], grad_to_none=grad_to_none)[0]


def run(B, T, H, bwd, gate, use_ctypes):
    K = 128
    res = {}
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, T, H, K, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    f = (torch.randn(B, T, H, K, device="cuda") * 1.5).bfloat16()
    beta = torch.randn(B, T, H, device="cuda", dtype=torch.bfloat16)
    A_log = (torch.rand(H, device="cuda") - 0.5) if gate == "bounded" else torch.rand(H, device="cuda") * 1.79 - 0.69
    dt_bias = torch.randn(H * K, device="cuda") if gate == "bounded" else torch.randn(H * K, device="cuda") * 0.5 - 1
    h0 = torch.randn(B, H, K, K, device="cuda") * 0.5
    kw = dict(safe_gate=True, lower_bound=-5.0) if gate == "bounded" else {}
    xs = [q, k, v, f, beta, A_log, dt_bias, h0]

    def fwd():
        with torch.no_grad():
            return chunk_kda(q, k, v, f, beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
                             use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, A_log=A_log, dt_bias=dt_bias, **kw)

    try:
        res["fla_fwd"] = bench(fwd)
    except torch.OutOfMemoryError:
        res["fla_fwd"] = float("nan")
    torch.cuda.empty_cache()
    if bwd:
        do = torch.randn_like(v)
        for x in xs:
            x.requires_grad_(True)

        def fwdbwd():
            o, ht = chunk_kda(q, k, v, f, beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
                              use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, A_log=A_log, dt_bias=dt_bias, **kw)
            o.backward(do)

        try:
            res["fla_fwdbwd"] = bench(fwdbwd, grad_to_none=xs)
        except torch.OutOfMemoryError:
            res["fla_fwdbwd"] = float("nan")
        for x in xs:
            x.requires_grad_(False)
            x.grad = None
    if use_ctypes:
        from kda_ctypes import Kda
        m = Kda(q, k, v, f, beta, A_log, dt_bias, h0, gate=gate, backward=bwd, save=False)
        res["ours_ct_fwd"] = bench(m.forward)
        if bwd:
            m.p.save = 1
            do = torch.randn_like(v)
            res["ours_ct_fwdbwd"] = bench(lambda: (m.forward(), m.backward(do, saved=1)))
        del m
    del q, k, v, f, beta, xs
    torch.cuda.empty_cache()
    return res


def bench_all(ours_file=None, use_ctypes=False, shapes="all"):
    ours = {}
    if ours_file and os.path.exists(ours_file):
        for line in open(ours_file):
            if line.startswith("RESULT "):
                _, key, val = line.split()
                ours[key] = float(val)
    if shapes not in ("all", "quick") and not shapes.isdigit():   # names, in the order given
        by_name = {f"B{B}.T{T}.H{H}": (B, T, H, bwd) for (B, T, H, bwd) in SHAPES}
        shapes = [by_name[n] for n in shapes.split(",")]
    else:
        shapes = SHAPES if shapes == "all" else SHAPES[:1] if shapes == "quick" else SHAPES[:int(shapes)]
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}", flush=True)
    rows = []
    for (B, T, H, bwd) in shapes:
        for gate in ("bounded", "unbounded"):
            r = run(B, T, H, bwd, gate, use_ctypes)
            name = f"B{B}.T{T}.H{H}"
            o_f, o_fb = ours.get(f"{name}.{gate}.fwd"), ours.get(f"{name}.{gate}.fwdbwd")
            rows.append((name, gate, o_f, r.get("fla_fwd"), o_fb, r.get("fla_fwdbwd"), r.get("ours_ct_fwd"),
                         r.get("ours_ct_fwdbwd")))
            print("RESULT", name, gate, " ".join(f"{k}={v:.4f}" for k, v in r.items()), flush=True)
    fmt = lambda x: f"{x:9.3f}" if x is not None and x == x else "      n/a"
    ratio = lambda a_, b_: f"{b_ / a_:7.2f}x" if a_ and b_ and a_ == a_ and b_ == b_ else "    n/a"
    print("\nms (median)          gate       ours fwd   fla fwd  speedup | ours f+b   fla f+b  speedup | "
          "ctypes fwd  ctypes f+b")
    for (name, gate, of, ff, ofb, ffb, cf, cfb) in rows:
        print(f"{name:20s} {gate:9s} {fmt(of)} {fmt(ff)} {ratio(of, ff)} | {fmt(ofb)} {fmt(ffb)} {ratio(ofb, ffb)} | "
              f"{fmt(cf)}  {fmt(cfb)}")
    for (name, gate, of, ff, ofb, ffb, cf, cfb) in rows:
        if gate == "bounded":
            u = [r for r in rows if r[0] == name and r[1] == "unbounded"][0]
            print(f"{name:20s} unbounded/bounded: ours fwd {ratio(of, u[2])} f+b {ratio(ofb, u[4])}; "
                  f"fla fwd {ratio(ff, u[3])} f+b {ratio(ffb, u[5])}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", help="output of build/cuda/bench_kda")
    ap.add_argument("--ctypes", action="store_true")
    ap.add_argument("--shapes", default="all",
                    help="'all', 'quick', a count of shapes from the top, or names in order (B2.T16384.H16,...)")
    a = ap.parse_args()
    bench_all(a.ours, a.ctypes, a.shapes)


if __name__ == "__main__":
    main()
