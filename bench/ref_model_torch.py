#!/usr/bin/env python3
"""ref_model_torch.py — linmoe's `small` preset written in PyTorch on top of flash-linear-attention
(fla) Triton kernels: a training-throughput reference to set beside linmoe on one H200.

    PYTHONPATH=third_party/fla python3 bench/ref_model_torch.py --batch 1 --seq 4096 --steps 20 --warmup 5
    ... --modes eager,compile        (several configurations in one process, each reported)
    ... --device cpu --preset tiny --impl ref --steps 2 --warmup 1   (torch-only smoke test, no GPU/fla)

fla: `third_party/fla` holds `git archive` of fla-org/flash-linear-attention (the commit is in
third_party/fla/FLA_COMMIT). The package is imported through a stub `fla` module so that
fla/__init__.py (which imports fla.layers / fla.models and through them `transformers`) is skipped;
einops is taken from the environment, else from third_party/fla/_vendor.

The model (mirrors src/model/{config,params,kda_layer,mla_layer,ffn_layer,model}.c, preset `small`):
  vocab 264, d_model 1024, 16 layers KKKM x4 (layer i is MLA iff (i+1) % 4 == 0 or it is the last),
  untied embedding / lm_head, RMSNorm eps 1e-5, init N(0, 0.02) (res_proj 0, gains 1, A_log 0,
  dt_bias = inverse softplus of dt ~ logU[1e-3, 0.1], conv U(+-1/sqrt(4))).
  KDA sublayer: xn = RMSNorm(x); q,k,v = SiLU(conv4(W_{q,k,v} xn)) (separate 1024->1024 projections,
    depthwise causal conv width 4, no bias: fla ShortConvolution); f = f_b(f_a(xn)) (low rank 128);
    beta-logit = b_proj(xn); o = fla chunk_kda(q, k, v, f, beta, A_log, dt_bias,
    use_qk_l2norm_in_kernel, use_gate_in_kernel, use_beta_sigmoid_in_kernel, safe_gate=True,
    lower_bound=-5) (= linmoe's bounded gate g = lb*sigmoid(exp(A_log)*(f + dt_bias)), scale K^-1/2);
    out = o_proj(RMSNorm_headwise(o) * sigmoid(g_b(g_a(xn)))) (fla FusedRMSNormGated, activation
    sigmoid; low-rank output gate 1024->128->1024, *no* bias, unlike fla's own layer).
  MLA sublayer (gated NoPE, no q LoRA): q = W_q xn [8 x (128+64)]; c = RMSNorm(W_kva xn) [256];
    kpe = W_kpe xn [64], shared by the heads; [k_nope | v] = W_kvb c [8 x (128+128)];
    k = [k_nope, kpe]; o = causal SDPA(q, k, v, scale (192)^-1/2); o *= sigmoid(W_gate xn);
    out = o_proj(o). The SDPA backend is the fastest of the ones that run, probed at start-up.
  FFN: layer 0 dense SwiGLU 4096; layers 1..15 MoE: fp32 router z = W_r xn, s = sigmoid(z),
    top-4 of s + b (b = balancing bias, selection only), gates = s_j / sum(top-4 s), 80 routed SwiGLU
    experts of width 256 + 1 shared expert of width 256. Dropless: tokens sorted by expert, expert
    GEMMs through torch._grouped_mm (bf16; else a per-expert loop — the log says which), combine in
    fp32 with index_add_.
  Residual: Block AttnRes, 4 layers per block (model.c build_plan, Kimi-K3 semantics): each sublayer
    input is the AttnRes mix of [embedding, finished block sums..., current partial sum]; a block
    commits at layers i % 4 == 0; the final hidden state is one more mix. The mix is fla's
    `fused_attnres` (keys RMSNorm(u_j; gamma) . w, softmax over sources, values the raw sources,
    scale 1, eps 1e-5) = linmoe's attnres (q = gamma*w, rho_j = rms(u_j)^-1).
  Loss: cross-entropy over the vocabulary, logits in fp32.

Stand-ins and differences (stated so the comparison stays honest):
  * Quantile Balancing: linmoe histograms the margins alpha_i - s_ij (1024 bins per expert) and sets
    b_j = quantile at rank ceil(k*N/E) minus the mean. Here the same quantile is taken exactly with
    torch.kthvalue over the [N, E] margins (no histogram), on the GPU, inside the forward under
    no_grad, every training step (one micro-batch per step, so "between steps" = same thing).
    No aux loss, no z-loss, no capacity limit (linmoe's small defaults: qb, zloss 0, dropless).
  * Precision: fp32 parameters (= the fp32 master weights; linmoe keeps fp32 params too) and
    torch.autocast(bf16): every linear / grouped GEMM sees bf16 operands with fp32 accumulation, as
    linmoe's bf16 GEMM mode does. The residual stream (embedding, partial sums, AttnRes mixes) is
    fp32 like linmoe's by default; `--stream bf16` keeps it in bf16 (faster, less faithful).
    The router matmul is fp32 (autocast off), as in linmoe.
  * Optimizer: torch.optim.AdamW(fused=True), lr 3e-4, betas (0.9, 0.95), wd 0.1 on matrices and 0 on
    vectors/gains/A_log/dt_bias (linmoe's MATRIX / NODECAY flags), plus clip_grad_norm_(1.0)
    (linmoe reports gnorm). Both are inside the timed step.
  * The same token batch is used every step (random tokens, fixed seed): the loss must go down,
    a cheap check that gradients flow. No data loading is timed.
  * Parameter count: same tensors and shapes as linmoe's layout (params.c); the balancing bias is a
    buffer and not counted. total = every parameter; active = total - embedding - (1 - k/E) of the
    routed-expert weights (lm_config_count_params). linmoe small: 1.045e9 total / 1.481e8 active.
  * FLOPs for MFU: 6 * active * tokens + MLA attention 3 * B * H * T^2 * (Dqk + Dv) per MLA layer
    (causal: half of the 2*T^2*(Dqk+Dv) forward, x3 for forward+backward). KDA's chunked core is not
    counted (it is small next to the GEMMs at T=4096 and not a dense-attention FLOP).
    MFU against the H200 dense bf16 peak 989 TFLOP/s (printed).
  * First steps: a fresh process spends a long time in Triton JIT compilation plus fla's Triton
    autotuning (FLA_CACHE_MODE is `disabled` by default, so every autotuned kernel benchmarks all of
    its configs on first use; fla ships no pre-tuned H200 configs at bc3b101d). On the H200 lease of
    2026-11-30 the first training step had not finished after ~130 s (cold machine, 245 kernels in
    ~/.triton/cache by then) nor after a further ~75 s (warm machine, same cache): give the first run
    a timeout of 10 min and keep TRITON_CACHE_DIR on the same machine for later runs. The first two
    warm-up steps print when their forward / backward finish, to show where that time goes. Only
    steps after --warmup are timed.
  * --compile compiles the MoE / dense FFN and MLA sublayer modules with torch.compile (the fla
    Triton ops — chunk_kda, short conv, gated norm, RMSNorm, AttnRes — stay as they are; they are
    already fused kernels).
"""
import argparse
import math
import os
import statistics
import sys
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_FLA = os.path.normpath(os.path.join(HERE, "..", "third_party", "fla"))
PEAK_BF16 = 989e12  # H200 SXM dense bf16 tensor-core peak, FLOP/s

PRESETS = {
    # src/model/config.c lm_config_preset("small")
    "small": dict(vocab=264, d=1024, n_layers=16, kda_heads=8, kda_dim=128, conv=4, gate_lb=-5.0,
                  mla_heads=8, kv_lora=256, qk_nope=128, qk_extra=64, v_dim=128, mla_gated=True,
                  d_ff_dense=4096, first_dense=1, n_experts=80, top_k=4, n_shared=1, d_ff_expert=256,
                  route_scale=1.0, block_layers=4, seq=4096, mla_period=4, mla_last=True),
    # "tiny" (CPU default of linmoe): used here only for the CPU smoke test
    "tiny": dict(vocab=264, d=128, n_layers=4, kda_heads=2, kda_dim=64, conv=4, gate_lb=-5.0,
                 mla_heads=4, kv_lora=64, qk_nope=32, qk_extra=16, v_dim=32, mla_gated=True,
                 d_ff_dense=384, first_dense=1, n_experts=16, top_k=2, n_shared=1, d_ff_expert=64,
                 route_scale=1.0, block_layers=2, seq=256, mla_period=4, mla_last=True),
}
COMMON = dict(eps=1e-5, init_std=0.02, balance="qb")


class Cfg:
    def __init__(self, name):
        self.__dict__.update(COMMON)
        self.__dict__.update(PRESETS[name])
        self.name = name
        self.layer_types = "".join(
            "M" if ((self.mla_period > 0 and (i + 1) % self.mla_period == 0) or (self.mla_last and i == self.n_layers - 1))
            else "K" for i in range(self.n_layers))


# ----------------------------------------------------------------------------------------------
# fla import (stub package: skips fla/__init__.py and its transformers import)

def import_fla(path):
    pkg_dir = os.path.join(path, "fla")
    if not os.path.isdir(pkg_dir):
        raise ImportError(f"no fla package at {pkg_dir}")
    try:
        import einops  # noqa: F401
    except ImportError:
        sys.path.append(os.path.join(path, "_vendor"))
    if "fla" not in sys.modules:
        stub = types.ModuleType("fla")
        stub.__path__ = [pkg_dir]
        stub.__version__ = "0.5.2"
        stub.__file__ = os.path.join(pkg_dir, "__init__.py")
        sys.modules["fla"] = stub
    from fla.ops.kda import chunk_kda
    from fla.modules.conv.short_conv import ShortConvolution
    from fla.modules.fused_norm_gate import rms_norm_gated
    from fla.modules.layernorm import rms_norm
    from fla.ops.attnres import fused_attnres
    return types.SimpleNamespace(chunk_kda=chunk_kda, ShortConvolution=ShortConvolution,
                                 rms_norm_gated=rms_norm_gated, rms_norm=rms_norm, fused_attnres=fused_attnres)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="small", choices=sorted(PRESETS))
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=0, help="0 = the preset's (4096 for small)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--modes", default="eager",
                    help="comma list of eager, compile, each optionally :bf16 or :fp32 (residual stream), run in order "
                         "in one process, e.g. eager,compile,eager:bf16")
    ap.add_argument("--compile", action="store_true", help="same as --modes compile")
    ap.add_argument("--stream", default="fp32", choices=["fp32", "bf16"], help="residual stream dtype")
    ap.add_argument("--experts", default="auto", choices=["auto", "grouped_mm", "loop"])
    ap.add_argument("--attn", default="probe", help="probe | auto | flash_padv | cudnn | efficient | math")
    ap.add_argument("--impl", default="fla", choices=["fla", "ref"], help="ref: torch-only (CPU smoke test)")
    ap.add_argument("--fla", default=os.environ.get("FLA_DIR", DEFAULT_FLA))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--deadline", type=float, default=0, help="seconds from start: stop timing loops after it")
    ap.add_argument("--count-only", action="store_true", help="print the parameter counts (meta device) and exit")
    args = ap.parse_args()
    if args.compile:
        args.modes = "compile"

    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    T0 = time.time()
    cfg = Cfg(args.preset)
    T = args.seq or cfg.seq
    B = args.batch
    dev = torch.device(args.device)
    on_cuda = dev.type == "cuda"
    fla = None
    if args.impl == "fla" and not args.count_only:
        fla = import_fla(args.fla)
    amp_dtype = torch.bfloat16
    use_amp = True  # bf16 autocast (also on the CPU smoke test)

    def log(*a):
        print(*a, flush=True)

    # ------------------------------------------------------------------------------------------
    # building blocks (fla kernels on the GPU path, plain torch on the ref path)

    def torch_rms(x, w, eps):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()
        return y.to(x.dtype)

    class Norm(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(n))

        def forward(self, x):
            if fla is not None:
                return fla.rms_norm(x, self.weight, None, eps=cfg.eps)
            return torch_rms(x, self.weight, cfg.eps)

    class GatedNorm(nn.Module):
        """per-head RMSNorm(o) * w * sigmoid(z) (linmoe gated_rmsnorm, fla FusedRMSNormGated 'sigmoid')"""

        def __init__(self, n):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(n))

        def forward(self, x, z):
            if fla is not None:
                return fla.rms_norm_gated(x, z, self.weight, None, "sigmoid", eps=cfg.eps)
            return (torch_rms(x, self.weight, cfg.eps).float() * torch.sigmoid(z.float())).to(x.dtype)

    def make_conv(n, w):
        if fla is not None:
            return fla.ShortConvolution(n, w, bias=False, activation="silu")
        return nn.Conv1d(n, n, w, groups=n, padding=w - 1, bias=False)

    def run_conv(conv, x):  # x [B,T,C] -> SiLU(causal depthwise conv)
        if fla is not None:
            return conv(x)[0]
        y = conv(x.transpose(1, 2))[..., : x.shape[1]].transpose(1, 2)
        return F.silu(y)

    def naive_kda(q, k, v, f, bl, A_log, dt_bias, lb):
        """token-by-token KDA recurrence (ref path only): bounded gate, L2-normed q/k, beta = sigmoid"""
        Bq, Tq, H, K = q.shape
        V = v.shape[-1]
        q = F.normalize(q.float(), dim=-1) * K ** -0.5
        k = F.normalize(k.float(), dim=-1)
        v = v.float()
        g = lb * torch.sigmoid(A_log.float().exp().view(1, 1, H, 1) * (f.float() + dt_bias.float().view(1, 1, H, K)))
        beta = torch.sigmoid(bl.float())
        S = q.new_zeros(Bq, H, K, V)
        out = []
        for t in range(Tq):
            S = S * g[:, t].exp().unsqueeze(-1)
            kt, vt = k[:, t], v[:, t]
            pred = torch.einsum("bhk,bhkv->bhv", kt, S)
            S = S + torch.einsum("bhk,bhv->bhkv", kt, beta[:, t].unsqueeze(-1) * (vt - pred))
            out.append(torch.einsum("bhk,bhkv->bhv", q[:, t], S))
        return torch.stack(out, 1).to(v.dtype)

    def Lin(i, o):
        return nn.Linear(i, o, bias=False)

    # attention backend (set after probing; see probe_attention)
    attn_state = {"name": "auto", "padv": False}

    def attention(q, k, v, scale):  # [B,H,T,D]
        if not hasattr(F, "scaled_dot_product_attention"):  # torch < 2.0 (ref path)
            s = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
            Tq = q.shape[-2]
            mask = torch.ones(Tq, Tq, dtype=torch.bool, device=q.device).triu(1)
            return torch.matmul(s.masked_fill(mask, float("-inf")).softmax(-1), v.float()).to(q.dtype)
        if attn_state["padv"]:
            Dv = v.shape[-1]
            v = F.pad(v, (0, q.shape[-1] - Dv))
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)[..., :Dv]
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)

    class KDA(nn.Module):
        def __init__(self):
            super().__init__()
            d, H, K, W = cfg.d, cfg.kda_heads, cfg.kda_dim, cfg.conv
            HK = H * K
            self.attn_norm = Norm(d)
            self.q_proj, self.k_proj, self.v_proj = Lin(d, HK), Lin(d, HK), Lin(d, HK)
            self.q_conv1d, self.k_conv1d, self.v_conv1d = make_conv(HK, W), make_conv(HK, W), make_conv(HK, W)
            self.f_a_proj, self.f_b_proj = Lin(d, K), Lin(K, HK)
            self.A_log = nn.Parameter(torch.zeros(H))  # bounded gate: A_log = 0
            dt = torch.exp(torch.rand(HK) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3)).clamp(min=1e-4)
            self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
            self.b_proj = Lin(d, H)
            self.g_a_proj, self.g_b_proj = Lin(d, K), Lin(K, HK)
            self.o_norm = GatedNorm(K)
            self.o_proj = Lin(HK, d)

        def forward(self, x):
            Bx, Tx, _ = x.shape
            H, K = cfg.kda_heads, cfg.kda_dim
            xn = self.attn_norm(x)
            q = run_conv(self.q_conv1d, self.q_proj(xn)).reshape(Bx, Tx, H, K)
            k = run_conv(self.k_conv1d, self.k_proj(xn)).reshape(Bx, Tx, H, K)
            v = run_conv(self.v_conv1d, self.v_proj(xn)).reshape(Bx, Tx, H, K)
            f = self.f_b_proj(self.f_a_proj(xn)).reshape(Bx, Tx, H, K)
            bl = self.b_proj(xn)
            if fla is not None:
                o, _ = fla.chunk_kda(q, k, v, f, bl, A_log=self.A_log, dt_bias=self.dt_bias,
                                     use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                                     use_beta_sigmoid_in_kernel=True, safe_gate=True, lower_bound=cfg.gate_lb)
            else:
                o = naive_kda(q, k, v, f, bl, self.A_log, self.dt_bias, cfg.gate_lb)
            gz = self.g_b_proj(self.g_a_proj(xn)).reshape(Bx, Tx, H, K)
            o = self.o_norm(o, gz)
            return self.o_proj(o.reshape(Bx, Tx, H * K))

    class MLA(nn.Module):
        def __init__(self):
            super().__init__()
            d, H = cfg.d, cfg.mla_heads
            Dqk, Dv, R = cfg.qk_nope + cfg.qk_extra, cfg.v_dim, cfg.kv_lora
            self.attn_norm = Norm(d)
            self.q_proj = Lin(d, H * Dqk)
            self.kv_a_proj = Lin(d, R)
            self.k_pe_proj = Lin(d, cfg.qk_extra)
            self.kv_a_layernorm = Norm(R)
            self.kv_b_proj = Lin(R, H * (cfg.qk_nope + Dv))
            self.o_gate_proj = Lin(d, H * Dv) if cfg.mla_gated else None
            self.o_proj = Lin(H * Dv, d)

        def forward(self, x):
            Bx, Tx, _ = x.shape
            H, Dn, De, Dv = cfg.mla_heads, cfg.qk_nope, cfg.qk_extra, cfg.v_dim
            xn = self.attn_norm(x)
            q = self.q_proj(xn).view(Bx, Tx, H, Dn + De).transpose(1, 2)
            c = self.kv_a_layernorm(self.kv_a_proj(xn))
            kpe = self.k_pe_proj(xn)
            kv = self.kv_b_proj(c).view(Bx, Tx, H, Dn + Dv)
            k_nope, v = kv.split([Dn, Dv], dim=-1)
            k = torch.cat([k_nope, kpe.unsqueeze(2).expand(Bx, Tx, H, De).to(k_nope.dtype)], -1).transpose(1, 2)
            v = v.transpose(1, 2)
            q = q.to(k.dtype)
            o = attention(q, k, v, (Dn + De) ** -0.5).transpose(1, 2).reshape(Bx, Tx, H * Dv)
            if self.o_gate_proj is not None:
                o = o * torch.sigmoid(self.o_gate_proj(xn))
            return self.o_proj(o)

    class Dense(nn.Module):
        def __init__(self):
            super().__init__()
            d, Fd = cfg.d, cfg.d_ff_dense
            self.ffn_norm = Norm(d)
            self.gate_proj, self.up_proj, self.down_proj = Lin(d, Fd), Lin(d, Fd), Lin(Fd, d)

        def forward(self, x):
            xn = self.ffn_norm(x)
            return self.down_proj(F.silu(self.gate_proj(xn)) * self.up_proj(xn))

    expert_state = {"impl": "loop"}

    def expert_ffn(xp, offs, counts, w1, w3, w2):
        """xp [M, d] sorted by expert; offs int32 [E] cumulative ends; returns [M, d]"""
        if expert_state["impl"] == "grouped_mm":
            w1b, w3b, w2b = (w.to(torch.bfloat16).transpose(-2, -1) for w in (w1, w3, w2))
            xb = xp.to(torch.bfloat16)
            a = torch._grouped_mm(xb, w1b, offs=offs)
            b = torch._grouped_mm(xb, w3b, offs=offs)
            return torch._grouped_mm(F.silu(a) * b, w2b, offs=offs)
        outs = []
        start = 0
        for e, n in enumerate(counts.tolist()):  # host sync: the loop fallback only
            if n:
                xe = xp[start:start + n]
                outs.append(F.linear(F.silu(F.linear(xe, w1[e])) * F.linear(xe, w3[e]), w2[e]))
            start += n
        return torch.cat(outs, 0)

    class MoE(nn.Module):
        def __init__(self):
            super().__init__()
            d, E, Fe = cfg.d, cfg.n_experts, cfg.d_ff_expert
            self.ffn_norm = Norm(d)
            self.router = nn.Parameter(torch.empty(E, d))
            self.register_buffer("route_bias", torch.zeros(E))  # e_score_correction_bias (QB), not a parameter
            self.exp_w1 = nn.Parameter(torch.empty(E, Fe, d))  # gate_proj  [E, F, d]
            self.exp_w3 = nn.Parameter(torch.empty(E, Fe, d))  # up_proj    [E, F, d]
            self.exp_w2 = nn.Parameter(torch.empty(E, d, Fe))  # down_proj  [E, d, F]
            Fs = cfg.n_shared * Fe
            self.sh_gate, self.sh_up, self.sh_down = Lin(d, Fs), Lin(d, Fs), Lin(Fs, d)

        def forward(self, x):
            Bx, Tx, d = x.shape
            E, k = cfg.n_experts, cfg.top_k
            N = Bx * Tx
            xn = self.ffn_norm(x).reshape(N, d)
            with torch.autocast(device_type=dev.type, enabled=False):
                z = F.linear(xn.float(), self.router)  # fp32 router
            s = torch.sigmoid(z)
            m = k + 1 if k < E else k
            vals, idx = torch.topk(s.detach() + self.route_bias, m, dim=-1)
            sel = idx[:, :k]
            sg = s.gather(1, sel)
            gate = cfg.route_scale * sg / sg.sum(-1, keepdim=True)
            if self.training and cfg.balance == "qb" and k < E:
                with torch.no_grad():  # QB stand-in: exact per-expert quantile of the margins alpha_i - s_ij
                    margins = vals[:, k:k + 1] - s.detach()
                    target = min(N, -(-k * N // E))
                    qv = torch.kthvalue(margins, target, dim=0).values
                    self.route_bias.copy_(qv - qv.mean())
            flat = sel.reshape(-1)
            sorted_e, order = torch.sort(flat, stable=True)
            offs = torch.searchsorted(sorted_e, torch.arange(1, E + 1, device=flat.device, dtype=sorted_e.dtype))
            counts = torch.diff(offs, prepend=offs.new_zeros(1))
            tok = order // k
            xp = xn[tok]
            yp = expert_ffn(xp, offs.to(torch.int32), counts, self.exp_w1, self.exp_w3, self.exp_w2)
            yp = yp.float() * gate.reshape(-1)[order].unsqueeze(-1)
            y = torch.zeros(N, d, device=x.device, dtype=torch.float32).index_add_(0, tok, yp)
            y = y + self.sh_down(F.silu(self.sh_gate(xn)) * self.sh_up(xn)).float()
            return y.view(Bx, Tx, d)

    class Mix(nn.Module):
        """AttnRes mixer: res_proj (pseudo-query w, init 0) and res_norm (key RMSNorm gain)"""

        def __init__(self):
            super().__init__()
            self.res_proj = nn.Parameter(torch.zeros(cfg.d))
            self.res_norm = nn.Parameter(torch.ones(cfg.d))

        def forward(self, srcs):
            if len(srcs) == 1:
                return srcs[0]
            if fla is not None:
                return fla.fused_attnres(self.res_proj, srcs, self.res_norm, rms_eps=cfg.eps, scale=1.0)
            u = torch.stack([t.float() for t in srcs], 0)
            keys = u * torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + cfg.eps) * self.res_norm
            a = (keys * self.res_proj).sum(-1).softmax(0)
            return (a.unsqueeze(-1) * u).sum(0).to(srcs[0].dtype)

    class Layer(nn.Module):
        def __init__(self, i):
            super().__init__()
            self.attn = MLA() if cfg.layer_types[i] == "M" else KDA()
            self.ffn = Dense() if i < cfg.first_dense else MoE()
            self.mix_attn, self.mix_ffn = Mix(), Mix()

    class Model(nn.Module):
        def __init__(self, stream_dtype):
            super().__init__()
            self.embed = nn.Embedding(cfg.vocab, cfg.d)
            self.layers = nn.ModuleList(Layer(i) for i in range(cfg.n_layers))
            self.mix_out = Mix()
            self.final_norm = Norm(cfg.d)
            self.lm_head = Lin(cfg.d, cfg.vocab)
            self.stream_dtype = stream_dtype
            self.init_weights()

        @torch.no_grad()
        def init_weights(self):
            for name, p in self.named_parameters():
                if name.endswith(("A_log", "dt_bias", "res_proj", "res_norm")) or p.dim() == 1:
                    continue  # set in the constructors
                if "conv1d" in name:
                    p.uniform_(-cfg.conv ** -0.5, cfg.conv ** -0.5)
                else:
                    p.normal_(0, cfg.init_std)

        def forward(self, tokens, targets):
            sd = self.stream_dtype
            h = self.embed(tokens).to(sd)
            src, P = [], h
            for i, L in enumerate(self.layers):
                x1 = L.mix_attn(src + [P])
                if i % cfg.block_layers == 0:
                    src.append(P)
                    P = None
                a = L.attn(x1).to(sd)
                hm = a if P is None else P + a
                x2 = L.mix_ffn(src + [hm])
                f = L.ffn(x2).to(sd)
                P = hm + f
            hf = self.mix_out(src + [P])
            logits = self.lm_head(self.final_norm(hf)).float()
            return F.cross_entropy(logits.view(-1, cfg.vocab), targets.view(-1))

    def count_params(model):
        tot = sum(p.numel() for p in model.parameters())
        emb = model.embed.weight.numel()
        exp = sum(p.numel() for n, p in model.named_parameters() if ".exp_w" in n)
        act = tot - emb - exp * (1 - cfg.top_k / cfg.n_experts)
        return tot, act

    def flops_per_step(active):
        n_mla = cfg.layer_types.count("M")
        attn = 3 * B * cfg.mla_heads * T * T * (cfg.qk_nope + cfg.qk_extra + cfg.v_dim) * n_mla
        return 6 * active * B * T, attn

    log(f"config {cfg.name}: {cfg.n_layers} layers [{cfg.layer_types}], d {cfg.d}, vocab {cfg.vocab}; "
        f"KDA {cfg.kda_heads}x{cfg.kda_dim} conv {cfg.conv} bounded lb {cfg.gate_lb}; MLA {cfg.mla_heads} heads "
        f"kv_lora {cfg.kv_lora} qk {cfg.qk_nope}+{cfg.qk_extra} v {cfg.v_dim} gated; FFN {cfg.first_dense} dense "
        f"({cfg.d_ff_dense}), MoE {cfg.n_experts} experts top-{cfg.top_k} + {cfg.n_shared} shared (ff "
        f"{cfg.d_ff_expert}); AttnRes block {cfg.block_layers}; B {B} T {T}")

    if args.count_only:
        with torch.device("meta") if hasattr(torch, "device") and hasattr(torch.device, "__enter__") else _null():
            m = Model(torch.float32)
        tot, act = count_params(m)
        log(f"parameters: {tot:.6g} total ({tot:.4g}), {act:.6g} active ({act:.4g})   [linmoe small: 1.045e+09 / 1.481e+08]")
        return

    # ------------------------------------------------------------------------------------------
    # environment and probes

    if on_cuda:
        import triton
        log(f"torch {torch.__version__}, triton {triton.__version__}, GPU {torch.cuda.get_device_name()}, "
            f"fla {open(os.path.join(args.fla, 'FLA_COMMIT')).read().split()[0][:10] if os.path.exists(os.path.join(args.fla, 'FLA_COMMIT')) else '?'}")
    else:
        log(f"torch {torch.__version__} on {dev}")

    # experts: torch._grouped_mm if it runs (fwd + bwd, unaligned group sizes, checked against a loop)
    want = args.experts
    if want in ("auto", "grouped_mm") and on_cuda and hasattr(torch, "_grouped_mm"):
        try:
            g = torch.Generator(device=dev).manual_seed(0)
            E_, d_, F_ = 8, 256, 128
            counts_ = torch.tensor([37, 0, 5, 100, 1, 64, 17, 31], device=dev)
            M_ = int(counts_.sum())
            xs = torch.randn(M_, d_, device=dev, generator=g).requires_grad_()
            ws = [(torch.randn(E_, F_, d_, device=dev, generator=g) * 0.05).requires_grad_(),
                  (torch.randn(E_, F_, d_, device=dev, generator=g) * 0.05).requires_grad_(),
                  (torch.randn(E_, d_, F_, device=dev, generator=g) * 0.05).requires_grad_()]
            offs_ = torch.cumsum(counts_, 0).to(torch.int32)
            expert_state["impl"] = "grouped_mm"
            y1 = expert_ffn(xs, offs_, counts_, *ws)
            gr1 = torch.autograd.grad(y1.float().square().sum(), [xs] + ws)
            expert_state["impl"] = "loop"
            xb = xs.detach().bfloat16().float().requires_grad_()
            wb = [w.detach().bfloat16().float().requires_grad_() for w in ws]
            y2 = expert_ffn(xb, offs_, counts_, *wb)
            gr2 = torch.autograd.grad(y2.square().sum(), [xb] + wb)
            errs = [float((a.detach().float() - b).norm() / b.norm().clamp_min(1e-30))
                    for a, b in zip((y1,) + gr1, (y2,) + gr2)]
            ok = max(errs) < 3e-2
            log(f"experts: torch._grouped_mm self-test vs loop rel.err y/dx/dw1/dw3/dw2 = "
                + " ".join(f"{e:.1e}" for e in errs) + (" ok" if ok else " FAILED"))
            expert_state["impl"] = "grouped_mm" if ok else "loop"
        except Exception as ex:  # noqa: BLE001
            log(f"experts: torch._grouped_mm unusable ({type(ex).__name__}: {str(ex)[:200]})")
            expert_state["impl"] = "loop"
    else:
        expert_state["impl"] = "loop"
    log(f"experts: using {expert_state['impl']}")

    def set_sdpa(name):
        attn_state["padv"] = name == "flash_padv"
        if not on_cuda:
            return
        bk = torch.backends.cuda
        flags = dict(flash=name in ("flash_padv", "flash"), efficient=name == "efficient",
                     cudnn=name == "cudnn", math=name == "math")
        if name == "auto":
            flags = dict(flash=True, efficient=True, cudnn=True, math=True)
        bk.enable_flash_sdp(flags["flash"])
        bk.enable_mem_efficient_sdp(flags["efficient"])
        if hasattr(bk, "enable_cudnn_sdp"):
            bk.enable_cudnn_sdp(flags["cudnn"])
        bk.enable_math_sdp(flags["math"])

    if on_cuda and args.attn == "probe":
        H, Dqk, Dv = cfg.mla_heads, cfg.qk_nope + cfg.qk_extra, cfg.v_dim
        q = torch.randn(B, H, T, Dqk, device=dev, dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(B, H, T, Dqk, device=dev, dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(B, H, T, Dv, device=dev, dtype=torch.bfloat16, requires_grad=True)
        do = torch.randn(B, H, T, Dv, device=dev, dtype=torch.bfloat16)
        res = {}
        ref = None
        for name in ("cudnn", "flash_padv", "efficient", "auto"):
            try:
                set_sdpa(name)
                ts = []
                for it in range(4):
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    o = attention(q, k, v, Dqk ** -0.5)
                    gq = torch.autograd.grad(o, (q,), do)[0]
                    torch.cuda.synchronize()
                    ts.append(time.perf_counter() - t0)
                if ref is None:
                    ref = (o.float(), gq.float())
                err = float((o.float() - ref[0]).norm() / ref[0].norm()) + float((gq.float() - ref[1]).norm() / ref[1].norm())
                res[name] = min(ts[1:])
                log(f"sdpa probe {name:10s}: fwd+bwd {res[name] * 1e3:.3f} ms (err vs first {err:.1e})")
            except Exception as ex:  # noqa: BLE001
                log(f"sdpa probe {name:10s}: unusable ({type(ex).__name__}: {str(ex).splitlines()[0][:150]})")
        best = min(res, key=res.get) if res else "auto"
        set_sdpa(best)
        attn_state["name"] = best
        del q, k, v, do, ref
    elif on_cuda:
        set_sdpa(args.attn)
        attn_state["name"] = args.attn
    log(f"attention: SDPA backend {attn_state['name']}")

    # ------------------------------------------------------------------------------------------
    # one configuration: build, train steps, report

    def run_mode(mode):
        # mode: eager | compile, optionally ":bf16" / ":fp32" for the residual stream dtype
        mode, _, stream = mode.partition(":")
        if mode not in ("eager", "compile") or stream not in ("", "fp32", "bf16"):
            raise ValueError(f"unknown mode '{mode}:{stream}' (eager|compile[:fp32|:bf16])")
        stream = stream or args.stream
        torch.manual_seed(0)
        stream_dtype = torch.bfloat16 if stream == "bf16" else torch.float32
        mode_tag = mode if stream == args.stream else f"{mode}:{stream}"
        model = Model(stream_dtype).to(dev)
        model.train()
        tot, act = count_params(model)
        lin_flops, attn_flops = flops_per_step(act)
        step_flops = lin_flops + attn_flops
        decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "conv1d" not in n and not n.endswith("router")]
        ids = {id(p) for p in decay}
        no_decay = [p for p in model.parameters() if id(p) not in ids]
        kw = dict(fused=True) if on_cuda else {}
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                lr=args.lr, betas=(0.9, 0.95), eps=1e-8, **kw)
        if mode == "compile":
            import torch._dynamo as dyn
            for key in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit", "accumulated_recompile_limit"):
                if hasattr(dyn.config, key):
                    setattr(dyn.config, key, 256)
            for L in model.layers:
                L.ffn = torch.compile(L.ffn)
                if isinstance(L.attn, MLA):
                    L.attn = torch.compile(L.attn)
        g = torch.Generator().manual_seed(1234)
        tokens = torch.randint(0, cfg.vocab, (B, T + 1), generator=g).to(dev)
        x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

        def sync():
            if on_cuda:
                torch.cuda.synchronize()

        def step(trace=None):
            with torch.autocast(device_type=dev.type, dtype=amp_dtype, enabled=use_amp):
                loss = model(x, y)
            if trace:  # warm-up only: where the first steps' Triton JIT / autotune time goes
                sync()
                log(f"[{mode_tag}]   {trace}: forward done at {time.time() - T0:.1f} s")
            loss.backward()
            if trace:
                sync()
                log(f"[{mode_tag}]   {trace}: backward done at {time.time() - T0:.1f} s")
            gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, **({"foreach": True} if on_cuda else {}))
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss, gn

        log(f"[{mode_tag}] parameters: {tot:.4g} total, {act:.4g} active per token "
            f"(linmoe small: 1.045e+09 / 1.481e+08); stream {stream}; params fp32 + autocast bf16; "
            f"AdamW fused={on_cuda}; experts {expert_state['impl']}; attention {attn_state['name']}")
        times, losses = [], []
        t_build = time.time()
        for it in range(args.warmup + args.steps):
            if on_cuda and it == args.warmup:
                torch.cuda.reset_peak_memory_stats()
            sync()
            t0 = time.perf_counter()
            loss, gn = step(f"warm-up {it + 1}" if it < min(args.warmup, 2) else None)
            sync()
            dt = time.perf_counter() - t0
            lv = float(loss)
            losses.append(lv)
            if it < args.warmup:
                log(f"[{mode_tag}] warm-up {it + 1}/{args.warmup}: {dt * 1e3:.1f} ms, loss {lv:.4f}, gnorm {float(gn):.3f}")
            else:
                times.append(dt)
            if args.deadline and time.time() - T0 > args.deadline and it >= args.warmup:
                log(f"[{mode_tag}] deadline reached after {len(times)} timed steps")
                break
        if not times:
            log(f"[{mode_tag}] no timed steps")
            return
        med = statistics.median(times)
        tps = B * T / med
        peak = torch.cuda.max_memory_allocated() / 2 ** 30 if on_cuda else float("nan")
        mfu = step_flops / med / PEAK_BF16
        log(f"[{mode_tag}] loss {losses[0]:.4f} -> {losses[-1]:.4f} over {len(losses)} steps (same batch)")
        log(f"[{mode_tag}] RESULT steps {len(times)} median {med * 1e3:.2f} ms/step (min {min(times) * 1e3:.2f}, max "
            f"{max(times) * 1e3:.2f}) | {tps:,.0f} tok/s | peak mem {peak:.2f} GiB")
        log(f"[{mode_tag}] RESULT FLOP/step {step_flops:.4e} = 6*active*tokens {lin_flops:.4e} + MLA attn {attn_flops:.4e} "
            f"| {step_flops / med / 1e12:.1f} TFLOP/s | MFU {100 * mfu:.2f}% of {PEAK_BF16 / 1e12:.0f} TFLOP/s bf16 dense peak "
            f"| wall incl. build/warm-up {time.time() - t_build:.1f} s")
        del model, opt
        if on_cuda:
            torch.cuda.empty_cache()

    for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
        if args.deadline and time.time() - T0 > args.deadline:
            log(f"[{mode}] skipped: deadline")
            continue
        try:
            run_mode(mode)
        except Exception as ex:  # noqa: BLE001
            import traceback
            traceback.print_exc()
            log(f"[{mode}] FAILED: {type(ex).__name__}: {str(ex)[:300]}")
            if on_cuda:
                torch.cuda.empty_cache()
    log(f"total wall {time.time() - T0:.1f} s")


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


if __name__ == "__main__":
    main()
