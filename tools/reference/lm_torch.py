"""lm_torch.py - an independent float64 PyTorch implementation of the linmoe model
(SPEC.md §1; reference notes kda.md §1, moe.md §1/§4.7, attnres.md §5), written from the
math, not from the C code. The C code was consulted only for the names and shapes of the
parameter tensors (src/model/params.c) and for conventions SPEC leaves open (listed in
tests/vectors/MANIFEST.md).

The KDA core is fla's public reference: naive_kda_lowerbound_gate / naive_kda_gate and
naive_recurrent_kda (loaded by fla_ref.py), with fla's in-kernel L2 norm
x·rsqrt(Σx² + 1e-6) and β = sigmoid(b_proj x) applied here.
"""
import math

import torch
import torch.nn.functional as F

import fla_ref

DT = torch.float64


# ---------------------------------------------------------------------------
# parameters: names and shapes as linmoe saves them

def is_mla(cfg, i):
    return cfg["layer_types"][i] == "M"


def is_moe(cfg, i):
    return i >= cfg["first_dense"] and cfg["n_experts"] > 0


def param_shapes(cfg):
    """[(name, shape, kind)] with kind in {matrix, conv, gain, A_log, dt_bias, res_w,
    res_gamma, buffer, embed}."""
    d, out = cfg["d_model"], []

    def add(name, shape, kind="matrix"):
        out.append((name, tuple(shape), kind))

    add("model.embed_tokens.weight", (cfg["vocab"], d), "embed")
    for i in range(cfg["n_layers"]):
        p = f"model.layers.{i}."
        add(p + "input_layernorm.weight", (d,), "gain")
        add(p + "post_attention_layernorm.weight", (d,), "gain")
        if cfg["residual"] != "prenorm":
            add(p + "self_attention_res_proj.weight", (d,), "res_w")
            add(p + "self_attention_res_norm.weight", (d,), "res_gamma")
            add(p + "mlp_res_proj.weight", (d,), "res_w")
            add(p + "mlp_res_norm.weight", (d,), "res_gamma")
        a = p + "self_attn."
        if not is_mla(cfg, i):
            H, K, W = cfg["kda_heads"], cfg["kda_head_dim"], cfg["kda_conv"]
            HK = H * K
            add(a + "q_proj.weight", (HK, d)); add(a + "k_proj.weight", (HK, d)); add(a + "v_proj.weight", (HK, d))
            for x in "qkv":
                add(a + f"{x}_conv1d.weight", (HK, W), "conv")
            add(a + "f_a_proj.weight", (K, d)); add(a + "f_b_proj.weight", (HK, K))
            add(a + "A_log", (H,), "A_log"); add(a + "dt_bias", (HK,), "dt_bias")
            add(a + "b_proj.weight", (H, d))
            if cfg["kda_full_rank_gate"]:
                add(a + "g_proj.weight", (HK, d))
            else:
                add(a + "g_a_proj.weight", (K, d)); add(a + "g_b_proj.weight", (HK, K))
            add(a + "o_norm.weight", (K,), "gain")
            add(a + "o_proj.weight", (d, HK))
        else:
            Hm, Dn, De, Dv, R, Rq = (cfg["mla_heads"], cfg["qk_nope_dim"], cfg["qk_extra_dim"], cfg["v_head_dim"],
                                     cfg["kv_lora_rank"], cfg["q_lora_rank"])
            if Rq > 0:
                add(a + "q_a_proj.weight", (Rq, d)); add(a + "q_a_layernorm.weight", (Rq,), "gain")
                add(a + "q_b_proj.weight", (Hm * (Dn + De), Rq))
            else:
                add(a + "q_proj.weight", (Hm * (Dn + De), d))
            add(a + "kv_a_proj.weight", (R, d))
            if De > 0:
                add(a + "k_pe_proj.weight", (De, d))
            add(a + "kv_a_layernorm.weight", (R,), "gain")
            add(a + "kv_b_proj.weight", (Hm * (Dn + Dv), R))
            if cfg["mla_gated"]:
                add(a + "o_gate_proj.weight", (Hm * Dv, d))
            add(a + "o_proj.weight", (d, Hm * Dv))
        m = p + "mlp."
        if not is_moe(cfg, i):
            Fd = cfg["d_ff_dense"]
            add(m + "gate_proj.weight", (Fd, d)); add(m + "up_proj.weight", (Fd, d)); add(m + "down_proj.weight", (d, Fd))
        else:
            E, Fe = cfg["n_experts"], cfg["d_ff_expert"]
            dl = cfg["moe_latent_dim"] or d
            add(m + "gate.weight", (E, d))
            add(m + "gate.e_score_correction_bias", (E,), "buffer")
            add(m + "experts.gate_proj.weight", (E, Fe, dl)); add(m + "experts.up_proj.weight", (E, Fe, dl))
            add(m + "experts.down_proj.weight", (E, dl, Fe))
            if cfg["n_shared"] > 0:
                Fs = cfg["n_shared"] * Fe
                add(m + "shared_experts.gate_proj.weight", (Fs, d)); add(m + "shared_experts.up_proj.weight", (Fs, d))
                add(m + "shared_experts.down_proj.weight", (d, Fs))
            if cfg["moe_latent_dim"]:
                add(m + "latent_down_proj.weight", (dl, d)); add(m + "latent_norm.weight", (dl,), "gain")
                add(m + "latent_up_proj.weight", (d, dl))
    if cfg["residual"] != "prenorm":
        add("model.output_attn_res_proj.weight", (d,), "res_w")
        add("model.output_attn_res_norm.weight", (d,), "res_gamma")
    add("model.norm.weight", (d,), "gain")
    if not cfg["tie_embeddings"]:
        add("lm_head.weight", (cfg["vocab"], d))
    return out


def init_params(cfg, gen, bias_std=0.25):
    """Random parameters that exercise every path: non-unit gains, non-zero AttnRes
    queries w and γ ≠ 1, a non-zero routing bias, gates spread over their range."""
    P = {}
    std = cfg["init_std"]

    def randn(shape, s=1.0, mean=0.0):
        return mean + s * torch.randn(shape, generator=gen, dtype=DT)

    def unif(shape, lo, hi):
        return lo + (hi - lo) * torch.rand(shape, generator=gen, dtype=DT)

    for name, shape, kind in param_shapes(cfg):
        if kind in ("matrix", "embed"):
            x = randn(shape, std)
        elif kind == "conv":
            w = 1 / math.sqrt(cfg["kda_conv"])
            x = unif(shape, -w, w)
        elif kind == "gain":
            x = randn(shape, 0.2, 1.0)
        elif kind == "res_w":
            x = randn(shape, 0.5)
        elif kind == "res_gamma":
            x = randn(shape, 0.3, 1.0)
        elif kind == "buffer":
            x = randn(shape, bias_std)
        elif kind == "A_log":
            # bounded: around 0 (the init), unbounded: log U[1, 16] (fla's init)
            x = unif(shape, -0.5, 0.5) if cfg["gate_mode"] == "bounded" else torch.log(unif(shape, 1, 16))
        elif kind == "dt_bias":
            # wide, so that the bounded gate reaches close to lb for some channels
            x = randn(shape, 1.5) if cfg["gate_mode"] == "bounded" else randn(shape, 1.0, -1.0)
        else:
            raise ValueError(kind)
        P[name] = x
    return P


# ---------------------------------------------------------------------------
# building blocks (all float64)

def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def l2norm(x):
    # fla's in-kernel L2 norm (l2norm_fwd): x / sqrt(Σx² + 1e-6)
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + 1e-6)


def glu(a, b, act):
    if act == "situ":
        return (4.0 * torch.tanh(a / 4.0) * torch.sigmoid(a)) * (25.0 * torch.tanh(b / 25.0))
    return F.silu(a) * b


def causal_conv_silu(x, w):
    # x [B,T,C], w [C,W]: y[t,c] = Σ_j w[c,j] x[t-(W-1)+j, c] (zeros before t=0), then SiLU
    B, T, C = x.shape
    W = w.shape[1]
    y = F.conv1d(F.pad(x.transpose(1, 2), (W - 1, 0)), w.unsqueeze(1), groups=C)
    return F.silu(y.transpose(1, 2))


class FlaKDA:
    """The KDA core from fla's references. dtype float64: the float64 run of fla's source
    (see fla_ref.py); float32: fla's functions untouched (their native precision), used
    to measure the float32 rounding floor of each vector."""

    def __init__(self, fla_dir, dtype=DT):
        self.dtype = dtype
        self.f = fla_ref.load(fla_dir, dtype)

    def gate(self, f, A_log, dt_bias, mode, lb):
        if self.dtype != torch.float64:
            if mode == "bounded":
                return self.f["naive_kda_lowerbound_gate"](f, A_log, dt_bias, lower_bound=lb)
            return self.f["naive_kda_gate"](f, A_log, dt_bias)
        with fla_ref.float_is_double():
            if mode == "bounded":
                return self.f["naive_kda_lowerbound_gate"](f, A_log, dt_bias, lower_bound=lb, output_dtype=DT)
            return self.f["naive_kda_gate"](f, A_log, dt_bias, output_dtype=DT)

    def core(self, q, k, v, g, beta, scale, h0=None, final_state=False):
        return self.f["naive_recurrent_kda"](q, k, v, g, beta, scale=scale, initial_state=h0,
                                             output_final_state=final_state)

    def op(self, q, k, v, f, beta_logit, A_log, dt_bias, h0, mode, lb, scale):
        """The fused op linmoe's kda_fwd computes: raw inputs → (o, S_T)."""
        g = self.gate(f, A_log, dt_bias, mode, lb)
        return self.core(l2norm(q), l2norm(k), v, g, torch.sigmoid(beta_logit), scale, h0, True), g


# ---------------------------------------------------------------------------
# sublayers; x [B,T,d]

def kda_layer(cfg, P, p, x, kda):
    B, T, d = x.shape
    H, K = cfg["kda_heads"], cfg["kda_head_dim"]
    xn = rmsnorm(x, P[p + "input_layernorm.weight"], cfg["norm_eps"])
    a = p + "self_attn."
    q = causal_conv_silu(xn @ P[a + "q_proj.weight"].T, P[a + "q_conv1d.weight"]).view(B, T, H, K)
    k = causal_conv_silu(xn @ P[a + "k_proj.weight"].T, P[a + "k_conv1d.weight"]).view(B, T, H, K)
    v = causal_conv_silu(xn @ P[a + "v_proj.weight"].T, P[a + "v_conv1d.weight"]).view(B, T, H, K)
    f = ((xn @ P[a + "f_a_proj.weight"].T) @ P[a + "f_b_proj.weight"].T).view(B, T, H, K)
    bl = xn @ P[a + "b_proj.weight"].T
    (o, _), g = kda.op(q, k, v, f, bl, P[a + "A_log"], P[a + "dt_bias"], None, cfg["gate_mode"], cfg["gate_lb"],
                       K ** -0.5)
    if cfg["kda_full_rank_gate"]:
        z = xn @ P[a + "g_proj.weight"].T
    else:
        z = (xn @ P[a + "g_a_proj.weight"].T) @ P[a + "g_b_proj.weight"].T
    on = rmsnorm(o, P[a + "o_norm.weight"], cfg["norm_eps"]) * torch.sigmoid(z.view(B, T, H, K))
    return on.reshape(B, T, H * K) @ P[a + "o_proj.weight"].T, {"g": g}


def mla_layer(cfg, P, p, x):
    B, T, d = x.shape
    Hm, Dn, De, Dv, Rq = cfg["mla_heads"], cfg["qk_nope_dim"], cfg["qk_extra_dim"], cfg["v_head_dim"], cfg["q_lora_rank"]
    eps = cfg["norm_eps"]
    xn = rmsnorm(x, P[p + "input_layernorm.weight"], eps)
    a = p + "self_attn."
    if Rq > 0:
        q = rmsnorm(xn @ P[a + "q_a_proj.weight"].T, P[a + "q_a_layernorm.weight"], eps) @ P[a + "q_b_proj.weight"].T
    else:
        q = xn @ P[a + "q_proj.weight"].T
    q = q.view(B, T, Hm, Dn + De)
    c = rmsnorm(xn @ P[a + "kv_a_proj.weight"].T, P[a + "kv_a_layernorm.weight"], eps)
    kv = (c @ P[a + "kv_b_proj.weight"].T).view(B, T, Hm, Dn + Dv)
    k_nope, v = kv[..., :Dn], kv[..., Dn:]
    if De > 0:
        kpe = (xn @ P[a + "k_pe_proj.weight"].T).view(B, T, 1, De).expand(B, T, Hm, De)
        k = torch.cat([k_nope, kpe], -1)      # one set of extra key dims shared by every head, no rotation
    else:
        k = k_nope
    s = torch.einsum("bthd,bshd->bhts", q, k) * (Dn + De) ** -0.5
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    s = s.masked_fill(~mask, float("-inf"))
    o = torch.einsum("bhts,bshd->bthd", torch.softmax(s, -1), v).reshape(B, T, Hm * Dv)
    if cfg["mla_gated"]:
        o = o * torch.sigmoid(xn @ P[a + "o_gate_proj.weight"].T)
    return o @ P[a + "o_proj.weight"].T, {}


def dense_ffn(cfg, P, p, x):
    xn = rmsnorm(x, P[p + "post_attention_layernorm.weight"], cfg["norm_eps"])
    m = p + "mlp."
    h = glu(xn @ P[m + "gate_proj.weight"].T, xn @ P[m + "up_proj.weight"].T, cfg["expert_act"])
    return h @ P[m + "down_proj.weight"].T, {}


def route(z, bias, k, scale):
    """Sigmoid router: selection = top-k of s + bias (ties to the lower expert index),
    gates = s of the chosen experts renormalised to sum 1, times `scale`. Returns idx
    [N,k] (descending biased score), gates [N,k] (differentiable in z), and the gap
    between the k-th and (k+1)-th biased scores per token (selection robustness)."""
    s = torch.sigmoid(z)
    sb = (s + bias).detach()
    N, E = sb.shape
    idx, gaps = [], []
    for i in range(N):
        order = sorted(range(E), key=lambda j: (-float(sb[i, j]), j))
        idx.append(order[:k])
        gaps.append(float(sb[i, order[k - 1]] - sb[i, order[k]]) if k < E else math.inf)
    idx = torch.tensor(idx, dtype=torch.long)
    sel = torch.gather(s, 1, idx)
    return idx, scale * sel / sel.sum(-1, keepdim=True), gaps


def moe_ffn(cfg, P, p, x):
    B, T, d = x.shape
    eps, act, k = cfg["norm_eps"], cfg["expert_act"], cfg["top_k"]
    xn = rmsnorm(x, P[p + "post_attention_layernorm.weight"], eps).reshape(B * T, d)
    m = p + "mlp."
    z = xn @ P[m + "gate.weight"].T
    bias = P[m + "gate.e_score_correction_bias"]
    idx, gates, gaps = route(z, bias, k, cfg["route_scale"])
    idx_nobias, _, _ = route(z, torch.zeros_like(bias), k, cfg["route_scale"])
    xe = xn @ P[m + "latent_down_proj.weight"].T if cfg["moe_latent_dim"] else xn
    W1, W3, W2 = P[m + "experts.gate_proj.weight"], P[m + "experts.up_proj.weight"], P[m + "experts.down_proj.weight"]
    y = torch.zeros_like(xe)
    for slot in range(k):
        e = idx[:, slot]
        h = glu(torch.einsum("nc,nfc->nf", xe, W1[e]), torch.einsum("nc,nfc->nf", xe, W3[e]), act)
        y = y + gates[:, slot:slot + 1] * torch.einsum("nf,ncf->nc", h, W2[e])
    if cfg["moe_latent_dim"]:
        y = rmsnorm(y, P[m + "latent_norm.weight"], eps) @ P[m + "latent_up_proj.weight"].T
    if cfg["n_shared"] > 0:
        sh = m + "shared_experts."
        h = glu(xn @ P[sh + "gate_proj.weight"].T, xn @ P[sh + "up_proj.weight"].T, act)
        y = y + h @ P[sh + "down_proj.weight"].T
    return y.view(B, T, d), {"idx": idx, "idx_nobias": idx_nobias, "gaps": gaps}


def attnres_mix(srcs, w, gamma, eps):
    """s_j = (γ⊙w)·RMSNorm(u_j) (no gain inside, no temperature), α = softmax_j s,
    out = Σ α_j u_j over the raw sources; one source is the identity."""
    if len(srcs) == 1:
        return srcs[0]
    U = torch.stack(srcs, 0)                                   # [n,B,T,d]
    s = (U * torch.rsqrt(U.pow(2).mean(-1, keepdim=True) + eps) * (gamma * w)).sum(-1)
    a = torch.softmax(s, 0)
    return (a.unsqueeze(-1) * U).sum(0)


# ---------------------------------------------------------------------------
# the model

def forward(cfg, P, tokens, kda):
    """tokens [B,T] (long) → logits [B,T,vocab], info (routing per MoE layer)."""
    eps, L = cfg["norm_eps"], cfg["n_layers"]
    info = {}

    def attn(i, x):
        p = f"model.layers.{i}."
        y, inf = mla_layer(cfg, P, p, x) if is_mla(cfg, i) else kda_layer(cfg, P, p, x, kda)
        info[("attn", i)] = inf
        return y

    def ffn(i, x):
        p = f"model.layers.{i}."
        y, inf = moe_ffn(cfg, P, p, x) if is_moe(cfg, i) else dense_ffn(cfg, P, p, x)
        info[("ffn", i)] = inf
        return y

    def mixw(i, which):
        if i < 0:
            return P["model.output_attn_res_proj.weight"], P["model.output_attn_res_norm.weight"]
        p = f"model.layers.{i}." + ("self_attention" if which == 0 else "mlp")
        return P[p + "_res_proj.weight"], P[p + "_res_norm.weight"]

    def mix(srcs, i, which):
        w, g = mixw(i, which)
        return attnres_mix(srcs, w, g, eps)

    e = P["model.embed_tokens.weight"][tokens]
    mode = cfg["residual"]
    if mode == "prenorm":
        h = e
        for i in range(L):
            h = h + attn(i, h)
            h = h + ffn(i, h)
        final = h
    elif mode == "full":
        # every sublayer mixes [embedding, every earlier sublayer output]
        srcs = [e]
        for i in range(L):
            srcs.append(attn(i, mix(srcs, i, 0)))
            srcs.append(ffn(i, mix(srcs, i, 1)))
        final = mix(srcs, -1, 0)
    else:
        # Block AttnRes, Kimi K3 schedule (attnres.md §5): committed blocks + partial sum P
        Sb, blocks, P_ = cfg["block_layers"], [], None
        for i in range(L):
            P_in = e if i == 0 else P_
            x = mix(blocks + [P_in], i, 0) if blocks else P_in
            if i % Sb == 0:
                blocks.append(P_in)      # commits e at i = 0, else the finished block
                P_ = None
            else:
                P_ = P_in
            a = attn(i, x)
            P_ = a if P_ is None else P_ + a
            m = ffn(i, mix(blocks + [P_], i, 1))
            P_ = P_ + m
        final = mix(blocks + [P_], -1, 0)
    head = P["model.embed_tokens.weight"] if cfg["tie_embeddings"] else P["lm_head.weight"]
    logits = rmsnorm(final, P["model.norm.weight"], eps) @ head.T
    return logits, info


def loss_fn(logits, targets):
    """Mean cross-entropy over the tokens whose target is >= 0."""
    V = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), ignore_index=-1, reduction="mean")
