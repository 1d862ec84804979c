// kda_layer.c — the KDA token mixer (SPEC §1.1) as a sublayer:
//   xn = RMSNorm(x);  q,k,v = SiLU(conv4(W_{q,k,v} xn));  f = f_b(f_a(xn));  β-logit = b_proj(xn)
//   o = KDA(q, k, v, f, β) (L2 norm, gate activation and sigmoid fused in the op)
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

void lm_kda_layer_fwd(lm_step_ctx *s, const lm_layer_params *p, lm_kda_acts *a, const real *x, real *out) {
    const lm_ops *o = s->ops;
    const lm_config *c = s->c;
    const int N = s->N, d = c->d_model, H = c->kda_heads, K = c->kda_head_dim, HK = H * K, W = c->kda_conv;
    o->rmsnorm_fwd(a->xn, a->rstd, x, p->attn_norm, N, d, c->norm_eps);
    o->matmul_fwd(a->qp, a->xn, p->q_proj, NULL, N, d, HK);
    o->matmul_fwd(a->kp, a->xn, p->k_proj, NULL, N, d, HK);
    o->matmul_fwd(a->vp, a->xn, p->v_proj, NULL, N, d, HK);
    // with a cache the conv sees the previous W−1 inputs and the core starts from the
    // carried state; both are updated for the next chunk
    lm_cache *kc = s->cache;
    real *const *conv = kc ? kc->conv[s->layer] : NULL;
    const real *pre[3] = {a->qp, a->kp, a->vp};
    real *post[3] = {a->q, a->k, a->v};
    const real *w[3] = {p->q_conv, p->k_conv, p->v_conv};
    for (int j = 0; j < 3; j++) {
        o->conv_silu_fwd(post[j], pre[j], w[j], conv && W > 1 ? conv[j] : NULL, s->B, s->T, HK, W);
        if (conv && W > 1) o->conv_cache_update(conv[j], pre[j], s->B, s->T, HK, W);
    }
    o->matmul_fwd(a->fa, a->xn, p->f_a, NULL, N, d, K);
    o->matmul_fwd(a->f, a->fa, p->f_b, NULL, N, K, HK);
    o->matmul_fwd(a->bl, a->xn, p->b_proj, NULL, N, d, H);
    lm_kda_args k = kda_args(s, p, a);
    k.o = a->o;
    if (kc) k.S0 = k.S_out = kc->kda_state[s->layer];
    o->kda_fwd(&k);
    if (c->kda_full_rank_gate) {
        o->matmul_fwd(a->gz, a->xn, p->g_proj, NULL, N, d, HK);
    } else {
        o->matmul_fwd(a->ga, a->xn, p->g_a, NULL, N, d, K);
        o->matmul_fwd(a->gz, a->ga, p->g_b, NULL, N, K, HK);
    }
    o->gated_rmsnorm_fwd(a->on, a->on_rstd, a->o, a->gz, p->o_norm, N, H, K, c->norm_eps);
    o->matmul_fwd(out, a->on, p->o_proj, NULL, N, HK, d);
}

void lm_kda_layer_bwd(lm_step_ctx *s, const lm_layer_params *p, lm_layer_params *g, const lm_kda_acts *a,
                      lm_kda_acts *da, const real *x, const real *dout, real *dx) {
    const lm_ops *o = s->ops;
    const lm_config *c = s->c;
    const int N = s->N, d = c->d_model, H = c->kda_heads, K = c->kda_head_dim, HK = H * K, W = c->kda_conv;
    o->matmul_bwd(da->on, g->o_proj, NULL, dout, a->on, p->o_proj, N, HK, d);
    o->gated_rmsnorm_bwd(da->o, da->gz, g->o_norm, da->on, a->o, a->gz, p->o_norm, a->on_rstd, N, H, K);
    if (c->kda_full_rank_gate) {
        o->matmul_bwd(da->xn, g->g_proj, NULL, da->gz, a->xn, p->g_proj, N, d, HK);
    } else {
        o->matmul_bwd(da->ga, g->g_b, NULL, da->gz, a->ga, p->g_b, N, K, HK);
        o->matmul_bwd(da->xn, g->g_a, NULL, da->ga, a->xn, p->g_a, N, d, K);
    }
    lm_kda_args k = kda_args(s, p, a);
    k.d_o = da->o;
    k.dq = da->q; k.dk = da->k; k.dv = da->v; k.df = da->f; k.dbeta_logit = da->bl;
    k.dA_log = g->A_log; k.ddt_bias = g->dt_bias;
    o->kda_bwd(&k);
    o->matmul_bwd(da->xn, g->b_proj, NULL, da->bl, a->xn, p->b_proj, N, d, H);
    o->matmul_bwd(da->fa, g->f_b, NULL, da->f, a->fa, p->f_b, N, K, HK);
    o->matmul_bwd(da->xn, g->f_a, NULL, da->fa, a->xn, p->f_a, N, d, K);
    o->conv_silu_bwd(da->qp, g->q_conv, da->q, a->qp, p->q_conv, NULL, s->B, s->T, HK, W);
    o->conv_silu_bwd(da->kp, g->k_conv, da->k, a->kp, p->k_conv, NULL, s->B, s->T, HK, W);
    o->conv_silu_bwd(da->vp, g->v_conv, da->v, a->vp, p->v_conv, NULL, s->B, s->T, HK, W);
    o->matmul_bwd(da->xn, g->q_proj, NULL, da->qp, a->xn, p->q_proj, N, d, HK);
    o->matmul_bwd(da->xn, g->k_proj, NULL, da->kp, a->xn, p->k_proj, N, d, HK);
    o->matmul_bwd(da->xn, g->v_proj, NULL, da->vp, a->xn, p->v_proj, N, d, HK);
    o->rmsnorm_bwd(dx, g->attn_norm, da->xn, x, p->attn_norm, a->rstd, N, d);
}
