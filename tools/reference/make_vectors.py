#!/usr/bin/python3
"""make_vectors.py - test vectors for tests/test_reference.c from public reference code
(fla's pure-PyTorch KDA) and an independent PyTorch model of linmoe (lm_torch.py).

    apt-get install -y python3-torch python3-numpy      # Debian's torch (CPU)
    /usr/bin/python3 tools/reference/make_vectors.py [--fla third_party/fla] [--out tests/vectors]

--fla is a fla checkout (or a copy holding at least fla/ops/kda/naive.py and
fla/ops/kda/gate.py, plus a COMMIT file when it is not a git checkout). Writes
<out>/kda_*.safetensors, <out>/model_*.safetensors and <out>/MANIFEST.md.
Deterministic: the same fla commit and torch give the same files.
"""
import argparse
import os
import sys

sys.dont_write_bytecode = True    # no __pycache__ in the source tree

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fla_ref  # noqa: E402
import lm_torch  # noqa: E402
import st_io  # noqa: E402

DT = torch.float64


def np64(t):
    return t.detach().to(DT).contiguous().numpy()


def rel_rms(a, b):
    a, b = a.detach().to(DT), b.detach().to(DT)
    den = b.norm()
    return float((a - b).norm() / den) if den > 0 else float((a - b).norm())


# ---------------------------------------------------------------------------
# (a) fla KDA op vectors

KDA_CASES = [
    # name, B, T, H, K, V, gate mode, lb, seed
    ("kda_b2t19h2k8_bounded", 2, 19, 2, 8, 8, "bounded", -5.0, 1),
    ("kda_b2t19h2k8_unbounded", 2, 19, 2, 8, 8, "unbounded", None, 2),
    ("kda_b1t37h2k16_bounded", 1, 37, 2, 16, 16, "bounded", -5.0, 3),
    ("kda_b1t37h2k16_unbounded", 1, 37, 2, 16, 16, "unbounded", None, 4),
    ("kda_b1t33h2k16v12_bounded_lb3", 1, 33, 2, 16, 12, "bounded", -3.0, 5),
    ("kda_b1t33h2k16v12_unbounded", 1, 33, 2, 16, 12, "unbounded", None, 6),
]


def kda_inputs(B, T, H, K, V, mode, seed):
    g = torch.Generator().manual_seed(1000 + seed)
    r = lambda *s, std=1.0, mean=0.0: mean + std * torch.randn(*s, generator=g, dtype=DT)  # noqa: E731
    u = lambda *s, lo, hi: lo + (hi - lo) * torch.rand(*s, generator=g, dtype=DT)  # noqa: E731
    x = {
        "q": r(B, T, H, K, std=1.5),
        "k": r(B, T, H, K, std=1.5),
        "v": r(B, T, H, V),
        "beta_logit": r(B, T, H, std=1.5),
        "h0": r(B, H, K, V, std=0.5),
    }
    if mode == "bounded":
        # exp(A_log)·(f + dt_bias) spread wide: g covers (lb, 0), many within 1% of lb
        x["f"] = r(B, T, H, K, std=2.0)
        x["A_log"] = u(H, lo=-0.5, hi=1.0)
        x["dt_bias"] = r(H, K, std=1.0)
    else:
        # fla's init ranges widened: exp(A_log) ∈ [1, 16], softplus input N(-1, 2.2):
        # g from ~-1e-3 down to ~-60 in the tails (exercises the exact path)
        x["f"] = r(B, T, H, K, std=2.0)
        x["A_log"] = torch.log(u(H, lo=1.0, hi=16.0))
        x["dt_bias"] = r(H, K, std=1.0, mean=-1.0)
    x["d_o"] = r(B, T, H, V)
    x["dS_out"] = r(B, H, K, V)
    return x


def make_kda(kda, kda32, out_dir, notes):
    files = []
    for name, B, T, H, K, V, mode, lb, seed in KDA_CASES:
        x = kda_inputs(B, T, H, K, V, mode, seed)
        leaves = ["q", "k", "v", "f", "beta_logit", "A_log", "dt_bias", "h0"]
        inp = {n: x[n].clone().requires_grad_(True) for n in leaves}
        scale = K ** -0.5
        (o, S), g = kda.op(inp["q"], inp["k"], inp["v"], inp["f"], inp["beta_logit"], inp["A_log"], inp["dt_bias"],
                           inp["h0"], mode, lb, scale)
        loss = (o * x["d_o"]).sum() + (S * x["dS_out"]).sum()
        grads = torch.autograd.grad(loss, [inp[n] for n in leaves])
        # the same computation by fla's untouched float32 functions: only rounding differs
        (o32, S32), g32 = kda32.op(*(x[n].float() for n in leaves[:5]), x["A_log"].float(), x["dt_bias"].float(),
                                   x["h0"].float(), mode, lb, scale)
        e32 = max(rel_rms(o32, o), rel_rms(S32, S))
        tensors = [(n, np64(x[n])) for n in leaves + ["d_o", "dS_out"]]
        tensors += [("o", np64(o)), ("S_out", np64(S))]
        for n, gr in zip(leaves, grads):
            tensors.append(("d" + n if n != "h0" else "dh0", np64(gr)))
        meta = {"kind": "kda", "gate_mode": mode, "lb": repr(lb if lb is not None else 0.0), "scale": repr(scale),
                "fla_commit": notes["fla_commit"], "torch": torch.__version__}
        path = os.path.join(out_dir, name + ".safetensors")
        st_io.write(path, tensors, meta)
        gmin, gmax = float(g.min()), float(g.max())
        near = float((g < 0.99 * lb).double().mean()) if mode == "bounded" else float((g < -5).double().mean())
        files.append(dict(name=name, B=B, T=T, H=H, K=K, V=V, mode=mode, lb=lb, gmin=gmin, gmax=gmax, near=near,
                          e32=e32, size=os.path.getsize(path)))
        print(f"{name}: g in [{gmin:.3f}, {gmax:.3g}], fp32 fla vs fp64 fla rel rms {e32:.2e}")
    return files


# ---------------------------------------------------------------------------
# (b) whole tiny models

BASE = dict(
    name="", vocab=23, d_model=16, n_layers=5, norm_eps=1e-5, init_std=0.3, tie_embeddings=0, seq_len=19,
    mla_period=4, mla_last=1, layer_types="", first_dense=1,
    kda_heads=2, kda_head_dim=8, kda_conv=4, gate_mode="bounded", gate_lb=-5.0, kda_chunk=16, kda_form="auto",
    kda_full_rank_gate=0,
    mla_heads=2, q_lora_rank=0, kv_lora_rank=8, qk_nope_dim=6, qk_extra_dim=4, v_head_dim=5, mla_gated=1,
    d_ff_dense=24, n_experts=6, top_k=2, n_shared=1, d_ff_expert=8, moe_latent_dim=0, route_scale=1.7,
    expert_act="swiglu",
    balance="qb", qb_bins=1024, balance_rate=1e-3, aux_coef=1e-2, zloss_coef=0.0, capacity_factor=0.0,
    capacity_relax_steps=0, residual="block", block_layers=2,
)

MODEL_CASES = [
    ("model_block_bounded", dict(name="ref_block_bounded", layer_types="KKMKM", n_layers=5), 11,
     "Block AttnRes (S_b = 2: blocks {0,1} {2,3} {4}), bounded gate lb -5, gated MLA with extra dims, "
     "dense layer 0 + MoE 6 experts top-2 + 1 shared, route_scale 1.7, SwiGLU"),
    ("model_full_unbounded", dict(name="ref_full_unbounded", layer_types="KMK", n_layers=3, residual="full",
                                  gate_mode="unbounded", q_lora_rank=6, expert_act="situ", moe_latent_dim=12,
                                  mla_gated=0, tie_embeddings=1), 12,
     "Full AttnRes, unbounded gate, MLA with q-LoRA (ungated), latent MoE (12) with SiTU-GLU, tied embeddings"),
    ("model_prenorm_fullrank", dict(name="ref_prenorm_fullrank", layer_types="MKK", n_layers=3, residual="prenorm",
                                    kda_full_rank_gate=1, gate_lb=-3.0, qk_extra_dim=0, first_dense=0, n_shared=2,
                                    top_k=3, route_scale=1.0, balance="none"), 13,
     "PreNorm residual, bounded gate lb -3, full-rank KDA output gate, MLA without extra dims, "
     "MoE in every layer (top-3, 2 shared)"),
]


def fp32_floor(cfg, P, tokens, targets, names, kda32, ref_logits, ref_loss, ref_grads):
    """The same model run in float32 by PyTorch (fla's untouched float32 KDA): relative
    RMS error against the float64 results per tensor - the rounding floor a float32
    implementation cannot beat (large where a gradient is a sum of cancelling terms)."""
    P32 = {n: v.detach().float().requires_grad_(n in names) for n, v in P.items()}
    logits, _ = lm_torch.forward(cfg, P32, tokens, kda32)
    loss = lm_torch.loss_fn(logits, targets)
    grads = torch.autograd.grad(loss, [P32[n] for n in names], allow_unused=True)
    floor = {"logits": rel_rms(logits, ref_logits), "loss": rel_rms(loss, ref_loss)}
    for n, g, r in zip(names, grads, ref_grads):
        floor["grad." + n] = rel_rms(torch.zeros_like(r) if g is None else g, r)
    return floor


def make_model(kda, kda32, out_dir, notes, B=2, T=19):
    files = []
    for name, over, seed, desc in MODEL_CASES:
        cfg = dict(BASE)
        cfg.update(over)
        # a seed whose routing is robust: every token's k-th and (k+1)-th biased scores
        # apart by > 1e-3 (the fp32 build must select the same experts), and the bias
        # changes some selections
        for attempt in range(200):
            gen = torch.Generator().manual_seed(seed * 1000 + attempt)
            P = lm_torch.init_params(cfg, gen)
            tokens = torch.randint(0, cfg["vocab"], (B, T), generator=gen)
            targets = torch.randint(0, cfg["vocab"], (B, T), generator=gen)
            targets.view(-1)[torch.arange(B * T) % 7 == 3] = -1
            with torch.no_grad():
                logits, info = lm_torch.forward(cfg, P, tokens, kda)
            moe = {k: v for k, v in info.items() if "idx" in v}
            gap = min(min(v["gaps"]) for v in moe.values()) if moe else 1.0
            changed = sum(int((v["idx"].sort(1)[0] != v["idx_nobias"].sort(1)[0]).any(1).sum()) for v in moe.values())
            if gap > 1e-3 and changed > 0:
                break
        else:
            raise RuntimeError(f"{name}: no seed with robust routing")
        trained = {n for n, s, kind in lm_torch.param_shapes(cfg) if kind != "buffer"}
        for n in trained:
            P[n].requires_grad_(True)
        logits, info = lm_torch.forward(cfg, P, tokens, kda)
        loss = lm_torch.loss_fn(logits, targets)
        names = [n for n, s, kind in lm_torch.param_shapes(cfg) if kind != "buffer"]
        # unused parameters (layer 0's pre-attention AttnRes mixer in block mode: one
        # source) get zero gradients
        grads = torch.autograd.grad(loss, [P[n] for n in names], allow_unused=True)
        grads = [torch.zeros_like(P[n]) if g is None else g for n, g in zip(names, grads)]
        floor = fp32_floor(cfg, P, tokens, targets, names, kda32, logits, loss, grads)
        tensors = [(n, np64(P[n])) for n, s, kind in lm_torch.param_shapes(cfg)]
        tensors += [("grad." + n, np64(g)) for n, g in zip(names, grads)]
        tensors += [("tokens", tokens.to(torch.int32).numpy()), ("targets", targets.to(torch.int32).numpy()),
                    ("logits", np64(logits)), ("loss", np64(loss.reshape(1)))]
        for (kind, i), v in sorted(info.items()):
            if "idx" in v:
                tensors.append((f"route.{i}.idx", v["idx"].to(torch.int32).numpy()))
        gs = [v["g"] for v in info.values() if "g" in v]
        meta = {"kind": "model", "config": st_io.config_json(cfg), "fla_commit": notes["fla_commit"],
                "torch": torch.__version__,
                "fp32_floor": "{" + ",".join('"%s":%.3e' % kv for kv in floor.items()) + "}"}
        path = os.path.join(out_dir, name + ".safetensors")
        st_io.write(path, tensors, meta)
        nparam = sum(int(np.prod(s)) for n, s, k in lm_torch.param_shapes(cfg) if k != "buffer")
        files.append(dict(name=name, desc=desc, cfg=cfg, seed=seed * 1000 + attempt, loss=float(loss), gap=gap,
                          changed=changed, ntok=B * T, nmoe=len(moe), nparam=nparam, B=B, T=T,
                          count=int((targets >= 0).sum()), size=os.path.getsize(path),
                          floor=sorted(((v, k) for k, v in floor.items()), reverse=True)[:3],
                          gmin=min(float(g.min()) for g in gs), gmax=max(float(g.max()) for g in gs)))
        print(f"{name}: loss {float(loss):.6f}, min routing gap {gap:.2e}, selections changed by the bias: "
              f"{changed}/{B * T * len(moe)}")
    return files


# ---------------------------------------------------------------------------

def manifest(out_dir, notes, kfiles, mfiles):
    L = []
    w = L.append
    w("# Reference test vectors (tests/test_reference.c)\n")
    w("Generated by `tools/reference/make_vectors.py`; do not edit. Every float tensor is F64,")
    w("integers are I32; each file carries `linmoe_crc32` and, in its metadata, the fla commit and")
    w("torch version it was made with.\n")
    w(f"- fla (fla-org/flash-linear-attention) commit: `{notes['fla_commit']}`")
    w("  (files used: `fla/ops/kda/naive.py` → `naive_recurrent_kda`; `fla/ops/kda/gate.py` →")
    w("  `naive_kda_gate`, `naive_kda_lowerbound_gate`; loaded by `tools/reference/fla_ref.py` without")
    w("  the package `__init__`, run in float64 — see that file)")
    w(f"- torch {torch.__version__} (Debian `python3-torch`, CPU), numpy {np.__version__}, Python {sys.version.split()[0]}\n")
    w("## Regenerate\n")
    w("```")
    w("apt-get install -y python3-torch python3-numpy")
    w("git clone https://github.com/fla-org/flash-linear-attention third_party/fla")
    w(f"git -C third_party/fla checkout {notes['fla_commit']}")
    w("/usr/bin/python3 tools/reference/make_vectors.py --fla third_party/fla --out tests/vectors")
    w("```")
    w("(`third_party/` is git-ignored; a copy of just the two files plus a `COMMIT` file works too.)\n")
    w("## (a) fla KDA op: `kda_*.safetensors`\n")
    w("Inputs exactly as `lm_kda_args` takes them: `q`, `k` [B,T,H,K] raw (before the L2 norm), `v`")
    w("[B,T,H,V], `f` [B,T,H,K] raw gate input, `beta_logit` [B,T,H], `A_log` [H], `dt_bias` [H,K],")
    w("`h0` [B,H,K,V] initial state; upstream gradients `d_o` [B,T,H,V], `dS_out` [B,H,K,V].")
    w("Reference: `g` = fla `naive_kda_lowerbound_gate(f, A_log, dt_bias, lower_bound=lb)` (bounded:")
    w("lb·sigmoid(exp(A_log)·(f + dt_bias))) or `naive_kda_gate(f, A_log, dt_bias)` (unbounded:")
    w("−exp(A_log)·softplus(f + dt_bias)); q, k L2-normalised as fla's kernels do (x·rsqrt(Σx²+1e-6));")
    w("β = sigmoid(beta_logit); then fla `naive_recurrent_kda(q, k, v, g, β, scale=K^-1/2,")
    w("initial_state=h0, output_final_state=True)` → `o` [B,T,H,V], `S_out` [B,H,K,V]. Gradients by")
    w("autograd of Σ o·d_o + Σ S_out·dS_out: `dq dk dv df dbeta_logit dA_log ddt_bias dh0` (shapes of")
    w("their inputs). Metadata: `gate_mode`, `lb` (0 when unbounded), `scale`.\n")
    w("| file | B | T | H | K | V | gate | lb | g range | share of g near the bound¹ | fp32-fla vs fp64-fla² | bytes |")
    w("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for f in kfiles:
        w(f"| {f['name']} | {f['B']} | {f['T']} | {f['H']} | {f['K']} | {f['V']} | {f['mode']} | "
          f"{f['lb'] if f['lb'] is not None else '–'} | [{f['gmin']:.3f}, {f['gmax']:.2g}] | {f['near']:.1%} | "
          f"{f['e32']:.1e} | {f['size']} |")
    w("\n¹ bounded: g < 0.99·lb; unbounded: g < −5.  ² relative RMS of (o, S_out) between fla's")
    w("untouched float32 functions and the float64 run of the same source: rounding only.\n")
    w("## (b) whole tiny models: `model_*.safetensors`\n")
    w("Metadata `config` = the model config in `lm_config_to_json`'s exact text form (so")
    w("`lm_read_weights_config` / `lm_load_weights` accept the file). Tensors: every parameter")
    w("under its linmoe name and shape (buffers too: `*.mlp.gate.e_score_correction_bias` is the")
    w("routing bias), `tokens`, `targets` [B,T] I32 (−1 = not counted), `logits` [B,T,vocab], `loss`")
    w("[1] (mean cross-entropy over counted tokens), `grad.<name>` = ∂loss/∂param for every trained")
    w("parameter, and `route.<layer>.idx` [B·T, top_k] I32, the experts each token selects (in")
    w("descending biased score) per MoE layer. Computed by `tools/reference/lm_torch.py`, an")
    w("independent float64 PyTorch model (KDA core from fla as in (a)), with autograd.\n")
    w("| file | config | layers | params | B×T (counted) | loss | KDA g range | min top-k gap³ | selections changed by the bias | bytes |")
    w("|---|---|---|---|---|---|---|---|---|---|")
    for f in mfiles:
        w(f"| {f['name']} | {f['desc']} | {f['cfg']['layer_types']} | {f['nparam']} | {f['B']}×{f['T']} ({f['count']}) | "
          f"{f['loss']:.6f} | [{f['gmin']:.2f}, {f['gmax']:.2g}] | {f['gap']:.1e} | {f['changed']}/{f['ntok'] * f['nmoe']} | {f['size']} |")
    w("\n³ smallest difference, over tokens and MoE layers, between the k-th and (k+1)-th biased")
    w("router scores: > 1e-3 so that the float32 build selects the same experts.\n")
    w("Metadata `fp32_floor`: a JSON object {`logits`, `loss`, `grad.<name>`: relative RMS error} of")
    w("the same model run by PyTorch in float32 (fla's untouched float32 functions) against the")
    w("float64 result: the rounding floor of a float32 implementation. The float32 build of")
    w("test_reference.c allows max(1e-5 outputs / 1e-4 gradients, 4 × floor). Largest floors:\n")
    for f in mfiles:
        w(f"- {f['name']}: " + ", ".join(f"`{k}` {v:.1e}" for v, k in f["floor"]))
    w("\n(A large floor is a gradient that is a sum of strongly cancelling terms, e.g. dA_log of the")
    w("unbounded gate, Σ_t,c dg·g, where Σ|terms| / |Σ terms| reaches ~200 in model_full_unbounded.)\n")
    w("Random parameters (seeded): matrices N(0, 0.3²); gains 1 + N(0, 0.2²); AttnRes w ~ N(0, 0.5²),")
    w("γ ~ 1 + N(0, 0.3²); routing bias N(0, 0.25²); conv U(±1/2); bounded gate A_log ~ U(−0.5, 0.5),")
    w("dt_bias ~ N(0, 1.5²); unbounded A_log = log U[1, 16], dt_bias ~ N(−1, 1).\n")
    w("### Conventions taken from the C code where SPEC leaves a choice\n")
    w("- Block AttnRes schedule of attnres.md §5 (the pre-attention mix of a block-start layer sees the")
    w("  finished block in the partial slot; the commit happens after that mix); the mixer's RMSNorm on")
    w("  the key path has no gain of its own and uses eps = norm_eps; one source = identity.")
    w("- MLA keys = [k_nope (per head, from kv_b_proj), k_pe (one k_pe_proj output shared by all heads)];")
    w("  kv_b_proj rows per head = [Dn nope rows, Dv value rows]; softmax scale (Dn+De)^-1/2.")
    w("- Shared expert = one GLU of width n_shared·d_ff_expert; `expert_act` (SwiGLU/SiTU) applies to")
    w("  every GLU: routed experts, shared experts and the dense layer (K3's `hidden_act: situ`).")
    w("- KDA output: gated RMSNorm o·rstd·w·sigmoid(z) per head (w [K] shared by heads), eps = norm_eps.")
    w("- Router: selection by s + bias, ties to the lower index; gates = renormalised s × route_scale;")
    w("  latent MoE: experts on latent_down(xn), then latent_up(RMSNorm(Σ gates·E)) (route_scale before the norm).")
    w("- Conv weights [C, W]: w[c][W−1] multiplies the current token.\n")
    open(os.path.join(out_dir, "MANIFEST.md"), "w").write("\n".join(L))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--fla", default=os.path.join(root, "third_party", "fla"))
    ap.add_argument("--out", default=os.path.join(root, "tests", "vectors"))
    args = ap.parse_args()
    torch.set_num_threads(1)          # fixed reduction order
    os.makedirs(args.out, exist_ok=True)
    notes = {"fla_commit": fla_ref.fla_commit(args.fla)}
    kda = lm_torch.FlaKDA(args.fla)
    kda32 = lm_torch.FlaKDA(args.fla, torch.float32)
    kfiles = make_kda(kda, kda32, args.out, notes)
    mfiles = make_model(kda, kda32, args.out, notes)
    manifest(args.out, notes, kfiles, mfiles)
    total = sum(f["size"] for f in kfiles + mfiles)
    print(f"wrote {len(kfiles) + len(mfiles)} files, {total} bytes, to {args.out}")


if __name__ == "__main__":
    main()
