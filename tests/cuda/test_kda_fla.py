"""test_kda_fla.py — the CUDA KDA kernels against fla (fla-org/flash-linear-attention) on
the GPU machine: fla's `chunk_kda` (gate, L2 norm and β sigmoid in the kernel; safe gate
with lower_bound=-5 for the bounded gate) forward and backward, and fla's fp32
`naive_recurrent_kda` forward, at the production shape B1·T8192·H96·D128 (and a varlen
batch). Tolerances as fla's tests (relative RMS): o, ht 5e-3; dq, dk, dv, dh0 8e-3;
dg (= df), dβ, dA_log, ddt_bias 2e-2.

    PYTHONPATH=<dir holding fla> python3 tests/cuda/test_kda_fla.py [--T 8192 --H 96]
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from kda_ctypes import Kda  # noqa: E402

from fla.ops.kda import chunk_kda  # noqa: E402
from fla.ops.kda.naive import naive_recurrent_kda  # noqa: E402

fails = 0


def rel(a, b):
    a, b = a.double(), b.double()
    den = b.pow(2).sum().sqrt()
    return float((a - b).pow(2).sum().sqrt() / den) if den > 0 else float((a - b).abs().max())


def check(what, err, tol):
    global fails
    ok = err <= tol
    fails += 0 if ok else 1
    print(f"{'ok' if ok else 'FAIL':4s} {what:70s} {err:.3e} (tol {tol:.0e})", flush=True)


def inputs(B, T, H, K, gate, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *s, sd=1.0, m=0.0: (torch.randn(*s, generator=g, device="cuda") * sd + m)
    q, k, v = (r(B, T, H, K).bfloat16() for _ in range(3))
    f = r(B, T, H, K, sd=1.5).bfloat16()
    beta = r(B, T, H).bfloat16()
    if gate == "bounded":
        A_log = (torch.rand(H, generator=g, device="cuda") - 0.5).float()
        dt_bias = r(H * K).float()
    else:
        A_log = (torch.rand(H, generator=g, device="cuda") * 1.79 - 0.69).float()   # exp ∈ [0.5, 3]
        dt_bias = r(H * K, sd=0.5, m=-1.0).float()
    h0 = r(B, H, K, K, sd=0.5).float()
    do = r(B, T, H, K).bfloat16()
    dht = r(B, H, K, K, sd=0.2).float()
    return q, k, v, f, beta, A_log, dt_bias, h0, do, dht


def fla_chunk(q, k, v, f, beta, A_log, dt_bias, h0, do, dht, gate, cu=None):
    xs = [x.clone().requires_grad_(True) for x in (q, k, v, f, beta, A_log, dt_bias, h0)]
    kw = dict(safe_gate=True, lower_bound=-5.0) if gate == "bounded" else {}
    o, ht = chunk_kda(xs[0], xs[1], xs[2], xs[3], xs[4], initial_state=xs[7], output_final_state=True,
                      use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                      A_log=xs[5], dt_bias=xs[6], cu_seqlens=cu, **kw)
    ((o.float() * do.float()).sum() + (ht * dht).sum()).backward()
    return o.detach(), ht.detach(), [x.grad for x in xs]


def naive(q, k, v, f, beta, A_log, dt_bias, h0, gate, lb=-5.0):
    """fp32 reference from the raw inputs: fla's naive_recurrent_kda on activated inputs."""
    K = q.shape[-1]
    l2 = lambda x: x.float() * torch.rsqrt(x.float().pow(2).sum(-1, keepdim=True) + 1e-6)
    x = f.float() + dt_bias.view(-1, K)
    eA = A_log.exp().view(-1, 1)
    g = lb * torch.sigmoid(eA * x) if gate == "bounded" else -eA * torch.nn.functional.softplus(x)
    with torch.no_grad():
        return naive_recurrent_kda(l2(q), l2(k), v.float(), g, torch.sigmoid(beta.float()), initial_state=h0,
                                   output_final_state=True)


def compare(tag, T, H, gate, seed, varlen=None):
    K = 128
    q, k, v, f, beta, A_log, dt_bias, h0, do, dht = inputs(1, T, H, K, gate, seed)
    cu = None
    if varlen:
        cu = torch.tensor([0] + list(torch.tensor(varlen).cumsum(0)), dtype=torch.int32, device="cuda")
        assert int(cu[-1]) == T
        h0 = h0[:1].repeat(len(varlen), 1, 1, 1).contiguous() * torch.linspace(0.5, 1.5, len(varlen), device="cuda").view(-1, 1, 1, 1)
        dht = dht[:1].repeat(len(varlen), 1, 1, 1).contiguous()
    ours = Kda(q, k, v, f, beta, A_log, dt_bias, h0, gate=gate, cu_seqlens=cu)
    o, ht = ours.forward()
    ours.backward(do, dht)
    torch.cuda.synchronize()
    fo, fht, fg = fla_chunk(q, k, v, f, beta, A_log, dt_bias, h0, do, dht, gate, cu.long() if cu is not None else None)
    name = f"{tag} T={T} H={H} {gate}"
    check(f"{name}: o vs fla chunk_kda", rel(o, fo), 5e-3)
    check(f"{name}: ht vs fla chunk_kda", rel(ht, fht), 5e-3)
    for nm, ours_g, fla_g, tol in [("dq", ours.dq, fg[0], 8e-3), ("dk", ours.dk, fg[1], 8e-3), ("dv", ours.dv, fg[2], 8e-3),
                                   ("dh0", ours.dh0, fg[7], 8e-3), ("df (dg)", ours.df, fg[3], 2e-2),
                                   ("dbeta", ours.dbeta, fg[4], 2e-2), ("dA_log", ours.dA_log, fg[5], 2e-2),
                                   ("ddt_bias", ours.ddt_bias, fg[6], 2e-2)]:
        check(f"{name}: {nm} vs fla chunk_kda", rel(ours_g, fla_g), tol)
    if not varlen:
        no, nht = naive(q, k, v, f, beta, A_log, dt_bias, h0, gate)
        check(f"{name}: o vs fla naive_recurrent_kda (fp32)", rel(o, no), 5e-3)
        check(f"{name}: ht vs fla naive_recurrent_kda (fp32)", rel(ht, nht), 5e-3)
        print(f"     (fla chunk_kda vs naive: o {rel(fo, no):.3e}, ht {rel(fht, nht):.3e})", flush=True)
    del ours
    torch.cuda.empty_cache()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("--H", type=int, default=96)
    ap.add_argument("--bench", help="then run bench/bench_kda_fla.py in this process (fla compiles once); "
                                    "the value is our bench_kda output file")
    a = ap.parse_args()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    for gate in ("bounded", "unbounded"):
        compare("prod", a.T, a.H, gate, 1 if gate == "bounded" else 2)
    compare("varlen", 4096, 8, "bounded", 3, varlen=[15, 1, 300, 1000, 63, 2048, 669])
    compare("varlen", 4096, 8, "unbounded", 4, varlen=[15, 1, 300, 1000, 63, 2048, 669])
    print(f"== fla comparison: {fails} failed", flush=True)
    if a.bench:
        from bench_kda_fla import bench_all
        bench_all(a.bench)
    sys.exit(1 if fails else 0)
