"""bench_moe_torch.py — the MoE layer of bench/bench_moe.cu in PyTorch, same shapes (Kimi-Linear:
d 2304, expert FFN 1024 SwiGLU, 256 experts, top-8, 16384 tokens): sigmoid top-k router with
renormalised gates, sort-by-expert plan, gather, three grouped GEMMs, SiLU GLU, gate-weighted
combine; forward and backward. Expert GEMMs three ways: torch._grouped_mm (bf16), a per-expert
loop of torch.mm (bf16), and dense torch.mm of the same FLOPs. Parameters and activations are
bf16 (torch._grouped_mm takes bf16 only); one extra row times the grouped forward GEMMs with
fp32 master weights cast to bf16 inside the timed region (what the linmoe kernel does on load).
Medians of CUDA-event timings.

    python3 bench/bench_moe_torch.py [--tokens N]
"""
import argparse

import torch
import torch.nn.functional as Fn
from cuda_timing import median_ms   # bench/cuda_timing.py (the script's folder is on sys.path)


def timeit(fn, warm=2, reps=10):
    return median_ms(fn, warm, reps)


def row(what, ms, flop=0.0):
    if flop:
        print(f"  {what:<52} {ms:9.3f} ms  {flop / ms * 1e-9:7.1f} TFLOP/s", flush=True)
    else:
        print(f"  {what:<52} {ms:9.3f} ms", flush=True)


def result(key, v):
    print(f"RESULT {key} {v:.4f}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=16384)
    args = ap.parse_args()
    N, d, F, E, k = args.tokens, 2304, 1024, 256, 8
    R = N * k
    gemm1 = 2.0 * R * d * F
    dev, bf = "cuda", torch.bfloat16
    torch.manual_seed(0)
    print(f"== PyTorch {torch.__version__}, {torch.cuda.get_device_name()}: tokens {N}, d {d}, ffn {F}, E {E}, "
          f"top-{k}, bf16", flush=True)

    x = torch.randn(N, d, device=dev, dtype=bf)
    Wr = (0.02 * torch.randn(E, d, device=dev)).to(bf)
    w1 = (0.02 * torch.randn(E, F, d, device=dev)).to(bf)   # [E, OC, C] as linmoe stores them
    w3 = (0.02 * torch.randn(E, F, d, device=dev)).to(bf)
    w2 = (0.02 * torch.randn(E, d, F, device=dev)).to(bf)

    def router(x, Wr):
        z = (x @ Wr.t()).float()
        s = torch.sigmoid(z)
        sv, idx = torch.topk(s, k, dim=1)
        gate = sv / sv.sum(1, keepdim=True)
        return idx, gate

    def plan(idx):
        flat = idx.reshape(-1)
        order = torch.argsort(flat, stable=True)          # rows grouped by expert, tokens increasing
        counts = torch.bincount(flat, minlength=E)
        offs = torch.cumsum(counts, 0, dtype=torch.int32)  # group end offsets
        return order, offs

    def gmm(a, w, offs):   # a [R, C], w [E, OC, C] -> [R, OC]
        return torch._grouped_mm(a, w.transpose(-2, -1), offs=offs)

    def experts(xs, offs, w1, w3, w2):
        return gmm(Fn.silu(gmm(xs, w1, offs)) * gmm(xs, w3, offs), w2, offs)

    def layer(x, Wr, w1, w3, w2):
        idx, gate = router(x, Wr)
        order, offs = plan(idx)
        tok = order // k
        xs = x[tok]
        ys = experts(xs, offs, w1, w3, w2)
        g = gate.reshape(-1)[order].to(bf)
        y = torch.zeros_like(x).index_add_(0, tok, ys * g[:, None])
        return y

    with torch.no_grad():
        idx, gate = router(x, Wr)
        order, offs = plan(idx)
        tok = order // k
        xs = x[tok]
        cnt = torch.diff(offs, prepend=offs.new_zeros(1))
        print(f"  routing: {R} rows, rows per expert min {int(cnt.min())} max {int(cnt.max())}", flush=True)
        print("-- forward", flush=True)
        t = timeit(lambda: router(x, Wr)); row("router (x Wr^T, sigmoid, top-k, renorm)", t); result("torch_router_ms", t)
        t = timeit(lambda: plan(idx)); row("plan (stable argsort, bincount, cumsum)", t); result("torch_plan_ms", t)
        t = timeit(lambda: x[tok]); row("gather (x[tok])", t); result("torch_gather_ms", t)
        h = Fn.silu(gmm(xs, w1, offs)) * gmm(xs, w3, offs)
        t = timeit(lambda: (gmm(xs, w1, offs), gmm(xs, w3, offs), gmm(h, w2, offs)))
        row("expert GEMMs torch._grouped_mm (x3)", t, 3 * gemm1); result("torch_grouped_fwd_tflops", 3 * gemm1 / t * 1e-9)
        t = timeit(lambda: experts(xs, offs, w1, w3, w2))
        row("expert FFN (3 GEMMs + SiLU GLU, on gathered rows)", t, 3 * gemm1)
        result("torch_ffn_tflops", 3 * gemm1 / t * 1e-9)
        ys = gmm(h, w2, offs)
        g = gate.reshape(-1)[order].to(bf)
        t = timeit(lambda: torch.zeros_like(x).index_add_(0, tok, ys * g[:, None]))
        row("combine (gate * rows, index_add_)", t); result("torch_combine_ms", t)
        t = timeit(lambda: layer(x, Wr, w1, w3, w2)); row("layer forward total", t); result("torch_fwd_total_ms", t)
        # fp32 masters cast to bf16 inside the timed region
        m1, m3, m2 = w1.float(), w3.float(), w2.float()
        t = timeit(lambda: (gmm(xs, m1.to(bf), offs), gmm(xs, m3.to(bf), offs), gmm(h, m2.to(bf), offs)))
        row("expert GEMMs _grouped_mm x3, fp32 weights cast each call", t, 3 * gemm1)
        result("torch_grouped_fwd_castw_tflops", 3 * gemm1 / t * 1e-9)
        del m1, m3, m2
        # per-expert loop (host offsets: one sync to read them, outside the timed region)
        bounds = [0] + offs.tolist()

        def loop():
            o1 = torch.empty(R, F, device=dev, dtype=bf)
            o3 = torch.empty(R, F, device=dev, dtype=bf)
            o2 = torch.empty(R, d, device=dev, dtype=bf)
            for e in range(E):
                a, b = bounds[e], bounds[e + 1]
                if a == b:
                    continue
                torch.mm(xs[a:b], w1[e].t(), out=o1[a:b])
                torch.mm(xs[a:b], w3[e].t(), out=o3[a:b])
                torch.mm(h[a:b], w2[e].t(), out=o2[a:b])
        t = timeit(loop, 1, 5); row("expert GEMMs per-expert torch.mm loop (x3)", t, 3 * gemm1)
        result("torch_loop_fwd_tflops", 3 * gemm1 / t * 1e-9)
        # dense reference: one GEMM of one expert GEMM's FLOPs
        Wd = w1[0:1].reshape(F, d)
        t = timeit(lambda: xs @ Wd.t()); row("dense torch.mm bf16 131072x2304 -> 1024", t, gemm1)
        result("torch_dense_tflops", gemm1 / t * 1e-9)

    print("-- backward", flush=True)
    dy = torch.randn(N, d, device=dev, dtype=bf)
    # expert GEMMs alone: dinp = dO·W (2d x 3d), dW = dOᵀ·A per group (2d x 2d with offsets)
    with torch.no_grad():
        da = gmm(xs, w1, offs)
        dh = torch.randn(R, d, device=dev, dtype=bf)

        def bwd_gemms():
            for (A, W, dO) in ((h, w2, dh), (xs, w1, da), (xs, w3, da)):
                torch._grouped_mm(dO, W, offs=offs)                       # dinp [R, C]
                torch._grouped_mm(dO.t(), A, offs=offs)                   # dW [E, OC, C]
        try:
            t = timeit(bwd_gemms); row("expert GEMMs bwd _grouped_mm (dinp + dW, x3)", t, 6 * gemm1)
            result("torch_grouped_bwd_tflops", 6 * gemm1 / t * 1e-9)
            t = timeit(lambda: [torch._grouped_mm(dO, W, offs=offs) for (W, dO) in ((w2, dh), (w1, da), (w3, da))])
            row("  of which dinp only (x3)", t, 3 * gemm1); result("torch_grouped_bwd_dinp_tflops", 3 * gemm1 / t * 1e-9)
            t = timeit(lambda: [torch._grouped_mm(dO.t(), A, offs=offs) for (A, dO) in ((h, dh), (xs, da), (xs, da))])
            row("  of which dW only (x3)", t, 3 * gemm1); result("torch_grouped_bwd_dw_tflops", 3 * gemm1 / t * 1e-9)
        except Exception as ex:   # older torch without the 2d x 2d form
            print(f"  explicit backward grouped GEMMs failed: {ex}", flush=True)
    # the whole layer through autograd
    ps = [t.clone().requires_grad_(True) for t in (x, Wr, w1, w3, w2)]

    def fwd_bwd():
        y = layer(*ps)
        y.backward(dy)
    for p in ps:
        p.grad = None
    t_fb = timeit(fwd_bwd)
    with torch.no_grad():
        t_f = timeit(lambda: layer(*ps))
    row("layer forward + backward (autograd)", t_fb); row("layer backward total (fwd+bwd - fwd)", t_fb - t_f)
    result("torch_bwd_total_ms", t_fb - t_f)
    # autograd of the expert part alone (includes the GLU backward)
    xs_g = xs.clone().requires_grad_(True)
    wg = [w.clone().requires_grad_(True) for w in (w1, w3, w2)]
    dys = torch.randn(R, d, device=dev, dtype=bf)

    def exp_bwd():
        out = experts(xs_g, offs, *wg)
        torch.autograd.grad(out, [xs_g, *wg], dys)
    t = timeit(exp_bwd)
    with torch.no_grad():
        t0 = timeit(lambda: experts(xs_g, offs, *wg))
    row("expert part autograd bwd (fwd+bwd - fwd, incl. GLU)", t - t0, 6 * gemm1)

    # skewed routing: logits + 4 e/E
    with torch.no_grad():
        z = (x @ Wr.t()).float() + 4.0 * torch.arange(E, device=dev).float() / E
        sv, idx2 = torch.topk(torch.sigmoid(z), k, dim=1)
        order2, offs2 = plan(idx2)
        xs2 = x[order2 // k]
        cnt = torch.diff(offs2, prepend=offs2.new_zeros(1))
        print(f"-- skewed routing (logits + 4 e/E): rows per expert min {int(cnt.min())} max {int(cnt.max())}",
              flush=True)
        h2 = Fn.silu(gmm(xs2, w1, offs2)) * gmm(xs2, w3, offs2)
        t = timeit(lambda: (gmm(xs2, w1, offs2), gmm(xs2, w3, offs2), gmm(h2, w2, offs2)))
        row("expert GEMMs _grouped_mm fwd (x3), skewed", t, 3 * gemm1)
        result("torch_skew_grouped_fwd_tflops", 3 * gemm1 / t * 1e-9)


if __name__ == "__main__":
    main()
