// kda_layer.c — the KDA token mixer (SPEC §1.1) as a sublayer:
//   xn = RMSNorm(x);  q,k,v = SiLU(conv4(W_{q,k,v} xn));  f = f_b(f_a(xn));  β-logit = b_proj(xn)
//   o = KDA(q, k, v, f, β) (L2 norm, gate activation and sigmoid fused in the op; without a
//   cache the conv too, so that a backend keeps q, k, v and their gradients in its own precision)
//   out = o_proj( RMSNorm_headwise(o) ⊙ sigmoid(g_b(g_a(xn))) )
#include "model/layers.h"

static lm_kda_args kda_args(const lm_step_ctx *s, const lm_layer_params *p, const lm_kda_acts *a) {
    const lm_config *c = s->c;
    lm_kda_args k = {0};
    k.B = s->B; k.T = s->T; k.H = c->kda_heads; k.K = c->kda_head_dim; k.V = c->kda_head_dim;
    k.gate_mode = c->gate_mode; k.lb = c->gate_lb; k.form = c->kda_form; k.chunk = c->kda_chunk;
    k.scale = 1 / sqrt((real)c->kda_head_dim);
    k.saved = s->kda_saved ? s->kda_saved[s->layer] : NULL;
    k.q = a->q; k.k = a->k; k.v = a->v; k.f = a->f; k.beta_logit = a->bl;
    k.A_log = p->A_log; k.dt_bias = p->dt_bias;
    return k;
}
// the op's own conv (lm_kda_args.conv_W): q, k, v from the pre-conv projections
static void kda_args_conv(lm_kda_args *k, const lm_config *c, const lm_layer_params *p, const lm_kda_acts *a) {
    k->conv_W = c->kda_conv;
    k->qkv_pre[0] = a->qp; k->qkv_pre[1] = a->kp; k->qkv_pre[2] = a->vp;
    k->conv_w[0] = p->q_conv; k->conv_w[1] = p->k_conv; k->conv_w[2] = p->v_conv;
    k->qkv_out[0] = a->q; k->qkv_out[1] = a->k; k->qkv_out[2] = a->v;
}

// The projections of xn as one list: the forward's outputs from a, the backward's output
// and weight gradients from da and g (each NULL when not wanted). The backward adds into
// ∂xn in this order.
static lm_linears xn_linears(const lm_config *c, const lm_layer_params *p, lm_kda_acts *a, lm_layer_params *g,
                             const lm_kda_acts *da) {
    const int H = c->kda_heads, K = c->kda_head_dim, HK = H * K;
    lm_linears L = {0};
#define XN_LINEAR(w, oc, t) LM_LINEARS_ADD_NAMED(L, p, a, g, da, w, oc, t)
    if (c->kda_full_rank_gate) XN_LINEAR(g_proj, HK, gz);
    else XN_LINEAR(g_a, K, ga);
    XN_LINEAR(b_proj, H, bl);
    XN_LINEAR(f_a, K, fa);
    XN_LINEAR(q_proj, HK, qp);
    XN_LINEAR(k_proj, HK, kp);
    XN_LINEAR(v_proj, HK, vp);
#undef XN_LINEAR
    return L;
}

void lm_kda_layer_fwd(lm_step_ctx *s, const lm_layer_params *p, lm_kda_acts *a, const real *x, real *out,
                      const real *res) {
    const lm_ops *o = s->ops;
    const lm_config *c = s->c;
    const int N = s->N, d = c->d_model, H = c->kda_heads, K = c->kda_head_dim, HK = H * K, W = c->kda_conv;
    lm_linears L = xn_linears(c, p, a, NULL, NULL);   // q, k, v, f_a, β, gate projections
    L.lo = lm_lo(s, LM_LO_ATTN_XN);
    L.lo_filled = 1;   // by the norm
    lm_input_norm_fwd(s, lm_norm_out(s, a->xn, L.lo), a->rstd, x, p->attn_norm, L.lo);   // xn: read as L.lo
    o->linears_fwd(&L, a->xn, N, d);
    lm_linear_fwd(o, a->f, a->fa, p->f_b, N, K, HK, lm_lo(s, LM_LO_ATTN_A), 0);
    lm_kda_args k = kda_args(s, p, a);
    k.o = a->o;
    // with a cache the conv sees the previous W−1 inputs and the core starts from the
    // carried state; both are updated for the next chunk. Without one the op runs the conv.
    lm_cache *kc = s->cache;
    if (kc) {
        real *const *conv = kc->conv[s->layer];
        const real *pre[3] = {a->qp, a->kp, a->vp};
        real *post[3] = {a->q, a->k, a->v};
        const real *w[3] = {p->q_conv, p->k_conv, p->v_conv};
        const int C[3] = {HK, HK, HK};
        if (s->T == 1 && W > 1) {   // one token: the three convs and their cache rolls in one op
            o->conv_step(post, pre, w, conv, C, 3, s->B, W);
        } else {
            for (int j = 0; j < 3; j++) {
                o->conv_silu_fwd(post[j], pre[j], w[j], W > 1 ? conv[j] : NULL, s->B, s->T, C[j], W);
                if (W > 1) o->conv_cache_update(conv[j], pre[j], s->B, s->T, C[j], W);
            }
        }
        // one token: the recurrent step on the cached state (one kernel on the GPU, where the
        // chunked forward runs its prep and scan kernels for a single chunk of one token)
        if (s->T == 1) k.state = kc->kda_state[s->layer];
        else k.S0 = k.S_out = kc->kda_state[s->layer];
    } else {
        kda_args_conv(&k, c, p, a);
    }
    // o in bf16 for the gated norm, in its own fp32 slot (CUDA training)
    k.o_lo = k.state ? NULL : lm_grad_lo_home(s, a->o, N, HK);
    if (k.state) o->kda_decode(&k);
    else o->kda_fwd(&k);
    if (!c->kda_full_rank_gate) lm_linear_fwd(o, a->gz, a->ga, p->g_b, N, K, HK, lm_lo(s, LM_LO_ATTN_B), 0);
    void *on_lo = lm_lo(s, LM_LO_ATTN_OUT);   // written by the gated norm
    o->gated_rmsnorm_fwd(a->on, a->on_rstd, a->o, a->gz, p->o_norm, N, H, K, c->norm_eps, on_lo, k.o_lo);
    lm_linear_res_fwd(o, out, res, a->on, p->o_proj, N, HK, d, on_lo, 1);
}

// The [N, ΣOC] matrix of the xn projections' output gradients in the linears' GEMM precision
// (lm_linears.dout_lo), into whose last three column blocks (q, k, v: xn_linears) the op's conv
// writes its input gradients (lm_kda_args.dqkv_pre_lo), with *q_col the first of them and *soc
// its width. It lives in those gradients' own fp32 slots, da->qp, kp, vp (adjacent in the
// layout, acts.c), which then go unused. NULL where the backend keeps no such copies or the
// matrix does not fit there.
static void *xn_dout_home(const lm_step_ctx *s, const lm_kda_acts *da, const lm_linears *L, int *q_col, int *soc) {
    const lm_ops *o = s->ops;
    const int N = s->N, HK = s->c->kda_heads * s->c->kda_head_dim, n = L->n;
    if (!s->lo || !o->linears_lo_bytes || n < 3) return NULL;
    int w = 0, col = 0;
    for (int i = 0; i < n; i++) {
        if (i == n - 3) col = w;
        w += L->OC[i] > 0 ? L->OC[i] : 0;
    }
    const size_t slot = (size_t)N * HK;
    const size_t bytes = o->linears_lo_bytes(N, w);
    if (!bytes || bytes > 3 * slot * sizeof(real) || da->kp != da->qp + slot || da->vp != da->kp + slot) return NULL;
    // the conv's rows (ops.h): 8-byte aligned, a multiple of 4 elements
    if (w % 4 || col % 4 || L->OC[n - 3] != HK || L->OC[n - 2] != HK || L->OC[n - 1] != HK) return NULL;
    *q_col = col;
    *soc = w;
    return da->qp;
}

// Every gradient of an intermediate below is written by its one producer's backward (the
// ops' assign forms), so none is zeroed first; dx (the residual stream's) and the parameter
// gradients accumulate.
void lm_kda_layer_bwd(lm_step_ctx *s, const lm_layer_params *p, lm_layer_params *g, const lm_kda_acts *a,
                      lm_kda_acts *da, const real *x, const real *dout, real *dx) {
    const lm_ops *o = s->ops;
    const lm_config *c = s->c;
    const int N = s->N, d = c->d_model, H = c->kda_heads, K = c->kda_head_dim, HK = H * K;
    lm_linear_bwd_written(o, da->on, g->o_proj, dout, a->on, p->o_proj, N, HK, d, lm_lo(s, LM_LO_ATTN_OUT), s->dout_lo);
    // d_o for the KDA op and gz's gradient for g_b in bf16 on CUDA (lm_grad_lo_home)
    void *o_lo = lm_grad_lo_home(s, da->o, N, HK);
    void *gz_lo = c->kda_full_rank_gate ? NULL : lm_grad_lo_home(s, da->gz, N, HK);
    // (the forward's bf16 o, kda_fwd's o_lo, where it left it)
    const void *x_lo = lm_grad_lo_home(s, (real *)a->o, N, HK);
    o->gated_rmsnorm_bwd(da->o, da->gz, g->o_norm, da->on, a->o, a->gz, p->o_norm, a->on_rstd, N, H, K, 1, o_lo, gz_lo,
                         x_lo);
    if (!c->kda_full_rank_gate) {
        const lm_linears Lg = {.n = 1, .OC = {HK}, .W = {p->g_b}, .dout = {da->gz}, .dW = {g->g_b}, .dinp_assign = 1,
                               .lo = lm_lo(s, LM_LO_ATTN_B), .dout_lo = gz_lo};
        o->linears_bwd(&Lg, da->ga, a->ga, N, K);
    }
    // the op takes the conv's backward too (the conv cache, inference only, gets no gradient);
    // dq, dk, dv are its work buffers
    lm_kda_args k = kda_args(s, p, a);
    kda_args_conv(&k, c, p, a);
    k.d_o = da->o;
    k.d_o_lo = o_lo;
    k.dq = da->q; k.dk = da->k; k.dv = da->v; k.df = da->f; k.dbeta_logit = da->bl;
    k.dqkv_pre[0] = da->qp; k.dqkv_pre[1] = da->kp; k.dqkv_pre[2] = da->vp;
    k.dconv_w[0] = g->q_conv; k.dconv_w[1] = g->k_conv; k.dconv_w[2] = g->v_conv;
    k.grads_assign = 1;
    k.dA_log = g->A_log; k.ddt_bias = g->dt_bias;
    k.df_lo = lm_grad_lo_home(s, da->f, N, HK);   // df straight to f_b's backward in bf16 (CUDA training)
    lm_linears L = xn_linears(c, p, NULL, g, da);
    L.dinp_assign = 1;
    L.lo = lm_lo(s, LM_LO_ATTN_XN);
    int q_col = 0, soc = 0;   // dq_pre, dk_pre, dv_pre straight into the list's bf16 matrix (CUDA training)
    L.dout_lo = xn_dout_home(s, da, &L, &q_col, &soc);
    if (L.dout_lo) {
        const size_t elem = o->linears_lo_bytes(N, soc) / ((size_t)N * soc);
        L.dout_lo_filled = 7u << (L.n - 3);
        k.dqkv_pre_lo = (char *)L.dout_lo + elem * q_col;
        k.dqkv_pre_ld = soc;
    }
    o->kda_bwd(&k);
    const lm_linears Lf = {.n = 1, .OC = {HK}, .W = {p->f_b}, .dout = {da->f}, .dW = {g->f_b}, .dinp_assign = 1,
                           .lo = lm_lo(s, LM_LO_ATTN_A), .dout_lo = k.df_lo};
    o->linears_bwd(&Lf, da->fa, a->fa, N, K);
    o->linears_bwd(&L, da->xn, a->xn, N, d);
    lm_input_norm_bwd(s, dx, g->attn_norm, da->xn, x, p->attn_norm, a->rstd);
}
