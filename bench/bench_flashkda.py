"""bench_flashkda.py — MoonshotAI/FlashKDA's forward (CUTLASS, bounded gate, K = V = 128) beside
our CUDA KDA forward on the same inputs: first both outputs and final states compared, then
both timed in one harness (triton.testing.do_bench medians, as bench/bench_kda_fla.py).

FlashKDA is not in this tree: build bench/flashkda_shim.cu against a checkout of it (see the
shim's header) and pass the library with --lib (or FLASHKDA_LIB). Ours comes from
build/cuda/libkda_cuda.so (make bench-cuda) through bench/kda_ctypes.py.

Timed per call: FlashKDA as its PyTorch binding runs it (β transposed to [H, T] by a torch
copy, then its two kernels; `fk`) and its kernels alone on a pre-transposed β (`fk kern`);
ours `kda_fwd` (gate, norms, β sigmoid, prep and scan). Initial state in, fp32 final state
out for both; bf16 inputs; gate lb = −5 (FlashKDA's range is [−5, 0]).

    python3 bench/bench_flashkda.py --lib third_party/flashkda/libflashkda.so [--shapes NAMES]
        [--split] [--bwd] [--ref]

--split also times our prep and scan kernels alone, --bwd our forward + backward, --ref holds
both outputs and final states to a token-by-token fp64 recurrence (fixed-length shapes up to
32K tokens). Build of FlashKDA measured here: bench/RESULTS.md, session 39.
"""
import argparse
import ctypes
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kda_ctypes import Kda  # noqa: E402

# (name, B, T, H, sequence lengths or None): the shapes, then FlashKDA's varlen cases
SHAPES = [("B1.T8192.H96", 1, 8192, 96, None), ("B2.T16384.H16", 2, 16384, 16, None),
          ("B4.T2048.H16", 4, 2048, 16, None), ("B4.T4096.H64", 4, 4096, 64, None),
          ("B8.T2048.H32", 8, 2048, 32, None), ("B1.T65536.H32", 1, 65536, 32, None),
          ("varlen6.H96", 1, 8192, 96, [1300, 547, 2048, 963, 271, 3063]),
          ("varlen1024x8.H96", 1, 8192, 96, [1024] * 8), ("B8.T1024.H96", 8, 1024, 96, None),
          ("B1.T1M.H32", 1, 1 << 20, 32, None)]
LB = -5.0


def load_fk(path):
    lib = ctypes.CDLL(path)
    lib.flashkda_workspace_size.restype = ctypes.c_int64
    lib.flashkda_workspace_size.argtypes = [ctypes.c_int64] * 3
    lib.flashkda_fwd.restype = ctypes.c_int
    vp = ctypes.c_void_p
    lib.flashkda_fwd.argtypes = [vp, vp, vp, vp, vp, ctypes.c_float, vp, vp, vp, vp, ctypes.c_float, vp, vp, vp,
                                 ctypes.c_int, ctypes.c_int, ctypes.c_int, vp]
    return lib


def rel_rms(x, ref):
    # in slices of the leading dimension: the 1M-token outputs are 8 GiB each in bf16
    x, ref = x.reshape(-1, x.shape[-1]), ref.reshape(-1, ref.shape[-1])
    num = den = 0.0
    for i in range(0, x.shape[0], 1 << 20):
        a, b = x[i:i + (1 << 20)].float(), ref[i:i + (1 << 20)].float()
        num += (a - b).pow(2).sum().item()
        den += b.pow(2).sum().item()
    return (num / den) ** 0.5


def naive_ref(q, k, v, g, beta, A_log, dt_bias, h0, scale):
    """The recurrence token by token in fp64 (fixed-length batches): S ← Diag(e^g) S; p = Sᵀk̂;
    r = β(v − p); S ← S + k̂ rᵀ; o = Sᵀ(scale·q̂), with g = lb·σ(e^{A_log}(f + dt_bias))."""
    B, T, H, K = q.shape
    d = torch.float64
    S = h0.to(d).clone()
    o = torch.empty(B, T, H, v.shape[-1], dtype=d, device=q.device)
    eA, db = A_log.to(d).exp()[:, None], dt_bias.to(d).view(H, K)
    for t in range(T):
        qt, kt = q[:, t].to(d), k[:, t].to(d)
        qt = qt * torch.rsqrt(qt.pow(2).sum(-1, keepdim=True) + 1e-6)
        kt = kt * torch.rsqrt(kt.pow(2).sum(-1, keepdim=True) + 1e-6)
        gt = LB * torch.sigmoid(eA * (g[:, t].to(d) + db))
        S = S * gt.exp()[..., None]
        r = torch.sigmoid(beta[:, t].to(d))[..., None] * (v[:, t].to(d) - torch.einsum("bhk,bhkv->bhv", kt, S))
        S = S + kt[..., None] * r[..., None, :]
        o[:, t] = scale * torch.einsum("bhk,bhkv->bhv", qt, S)
    return o, S


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, quantiles=[0.5, 0.2, 0.8])


def run(fk, name, B, T, H, lens, split, bwd, ref):
    K = 128
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, T, H, K, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    g = (torch.randn(B, T, H, K, device="cuda") * 1.5).bfloat16()
    beta = torch.randn(B, T, H, device="cuda", dtype=torch.bfloat16)
    A_log = torch.rand(H, device="cuda") - 0.5
    dt_bias = torch.randn(H * K, device="cuda")
    N = len(lens) if lens else B
    h0 = torch.randn(N, H, K, K, device="cuda") * 0.5              # ours: [N, H, K, V]
    cu32 = cu64 = None
    if lens:
        cu = torch.tensor([0] + lens, device="cuda").cumsum(0)
        cu32, cu64 = cu.int().contiguous(), cu.long().contiguous()
    scale = K ** -0.5
    res = {}

    # FlashKDA: states [N, H, V, K]; β as [H, T_total]
    Tt = B * T
    h0_fk = h0.transpose(-1, -2).contiguous()
    ht_fk = torch.empty_like(h0_fk)
    o_fk = torch.empty_like(v)
    ws = torch.empty(fk.flashkda_workspace_size(Tt, H, N), dtype=torch.uint8, device="cuda")
    P = lambda t: ctypes.c_void_p(t.data_ptr()) if t is not None else None
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

    def fk_call(beta_t):
        err = fk.flashkda_fwd(P(q), P(k), P(v), P(g), P(beta_t), scale, P(o_fk), P(ws), P(A_log), P(dt_bias), LB,
                              P(h0_fk), P(ht_fk), P(cu64), Tt, H, N, stream)
        if err:
            raise RuntimeError(f"flashkda_fwd: cuda error {err}")

    beta_t = beta.reshape(Tt, H).t().contiguous()
    fk_call(beta_t)
    torch.cuda.synchronize()
    res["fk"] = bench(lambda: fk_call(beta.reshape(Tt, H).t().contiguous()))
    res["fk_kern"] = bench(lambda: fk_call(beta_t))
    del ws, beta_t
    torch.cuda.empty_cache()

    m = Kda(q, k, v, g, beta, A_log, dt_bias, h0, gate="bounded", lb=LB, scale=scale, cu_seqlens=cu32,
            backward=False, save=False)
    o, ht = m.forward()
    torch.cuda.synchronize()
    res["o_rel"] = rel_rms(o_fk, o)
    res["S_rel"] = rel_rms(ht_fk.transpose(-1, -2), ht)
    if ref and not lens and B * T <= 32768:   # both against the fp64 recurrence
        o_r, S_r = naive_ref(q, k, v, g, beta, A_log, dt_bias, h0, scale)
        res["ref"] = (rel_rms(o, o_r), rel_rms(ht, S_r), rel_rms(o_fk, o_r), rel_rms(ht_fk.transpose(-1, -2), S_r))
        del o_r, S_r
    res["ours"] = bench(m.forward)
    if split:   # its two stages: the chunk-parallel prep (intra-chunk), the serial scan (inter-chunk)
        res["prep"] = bench(lambda: m._call("kda_fwd_prep"))
        res["scan"] = bench(lambda: m._call("kda_fwd_scan"))
    del m, o, ht
    if bwd:   # ours forward + backward (FlashKDA has no backward): the saving forward, then kda_bwd
        m = Kda(q, k, v, g, beta, A_log, dt_bias, h0, gate="bounded", lb=LB, scale=scale, cu_seqlens=cu32)
        do = torch.randn_like(v)
        res["fb"] = bench(lambda: (m.forward(), m.backward(do, saved=1)))
        del m
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default=os.environ.get("FLASHKDA_LIB", "third_party/flashkda/libflashkda.so"))
    ap.add_argument("--shapes", default="all", help="'all' or names in order (B1.T8192.H96,varlen6.H96,...)")
    ap.add_argument("--split", action="store_true", help="also time our prep and scan kernels alone")
    ap.add_argument("--bwd", action="store_true", help="also time our forward + backward")
    ap.add_argument("--ref", action="store_true",
                    help="also both against an fp64 token-by-token recurrence (fixed-length shapes up to 32K tokens)")
    a = ap.parse_args()
    if not os.path.exists(a.lib):
        sys.exit(f"bench_flashkda: error: {a.lib} not found (build bench/flashkda_shim.cu; see its header)")
    fk = load_fk(a.lib)
    names = [s[0] for s in SHAPES]
    want = names if a.shapes == "all" else a.shapes.split(",")
    for w in want:
        if w not in names:
            sys.exit(f"bench_flashkda: error: unknown shape '{w}' (known: {', '.join(names)})")
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}", flush=True)
    print("ms: median [20%, 80%] of do_bench; o_rel, S_rel: FlashKDA's o and final state against ours (relative RMS)")
    print(f"{'shape':18s} {'ours':>24s} {'fk (binding)':>24s} {'fk kernels':>24s} {'fk/ours':>8s} {'o_rel':>9s} {'S_rel':>9s}")
    for (name, B, T, H, lens) in SHAPES:
        if name not in want:
            continue
        r = run(fk, name, B, T, H, lens, a.split, a.bwd, a.ref)
        f = lambda x: f"{x[0]:8.3f} [{x[1]:6.3f},{x[2]:6.3f}]"
        print(f"{name:18s} {f(r['ours']):>24s} {f(r['fk']):>24s} {f(r['fk_kern']):>24s} "
              f"{r['fk'][0] / r['ours'][0]:7.2f}x {r['o_rel']:9.2e} {r['S_rel']:9.2e}"
              + (f"  ours prep {r['prep'][0]:.3f} scan {r['scan'][0]:.3f}" if a.split else "")
              + (f"  ours fwd+bwd {r['fb'][0]:.3f}" if a.bwd else "")
              + ("  vs fp64: ours o {:.2e} S {:.2e}, FlashKDA o {:.2e} S {:.2e}".format(*r["ref"]) if "ref" in r else ""),
              flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
