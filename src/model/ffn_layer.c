// ffn_layer.c — the feed-forward sublayers (SPEC §1.3): a dense GLU for the first
// layer(s), and the MoE everywhere else:
//   xn = RMSNorm(x);  z = W_r xn (fp32);  s = sigmoid(z);  top-k of s + b (b: balancing bias)
//   routed = Σ_{j∈top-k} gate_j · E_j(xn)      (dropless grouped GEMMs, or capacity-limited)
//   out = routed + shared(xn)
// With moe_latent_dim (Kimi K3): experts work on W_down xn and the combined routed sum
// goes through RMSNorm and W_up back to d_model.
#include "model/layers.h"

void lm_dense_layer_fwd(lm_step_ctx *s, const lm_layer_params *p, lm_dense_acts *a, const real *x, real *out,
                        const real *res) {
    const lm_ops *o = s->ops;
    const lm_config *c = s->c;
    const int N = s->N, d = c->d_model, F = c->d_ff_dense;
    lm_linears L = {.lo = lm_lo(s, LM_LO_FFN_XN), .lo_filled = 1};   // the norm writes xn's copy
    lm_input_norm_fwd(s, lm_norm_out(s, a->xn, L.lo), a->rstd, x, p->ffn_norm, L.lo);   // xn: read as L.lo
    lm_linears_add(&L, p->ffn_w1, F, a->a, NULL, NULL);
    lm_linears_add(&L, p->ffn_w3, F, a->b, NULL, NULL);
    o->linears_fwd(&L, a->xn, N, d);
    void *h_lo = lm_lo(s, LM_LO_FFN_H);   // written by the GLU
    o->glu_fwd(a->h, a->a, a->b, (size_t)N * F, c->expert_act, h_lo);
    lm_linear_res_fwd(o, out, res, a->h, p->ffn_w2, N, F, d, h_lo, 1);
}

void lm_dense_layer_bwd(lm_step_ctx *s, const lm_layer_params *p, lm_layer_params *g, const lm_dense_acts *a,
                        lm_dense_acts *da, const real *x, const real *dout, real *dx) {
    const lm_ops *o = s->ops;
    const lm_config *c = s->c;
    const int N = s->N, d = c->d_model, F = c->d_ff_dense;
    // h and xn have one writer each here (written, not zeroed: acts.c); a, b are added into
    lm_linear_bwd_written(o, da->h, g->ffn_w2, dout, a->h, p->ffn_w2, N, F, d, lm_lo(s, LM_LO_FFN_H), s->dout_lo);
    o->glu_bwd(da->a, da->b, da->h, a->a, a->b, (size_t)N * F, c->expert_act);
    lm_linears L = {0};
    lm_linears_add(&L, p->ffn_w1, F, NULL, da->a, g->ffn_w1);
    lm_linears_add(&L, p->ffn_w3, F, NULL, da->b, g->ffn_w3);
    L.dinp_assign = 1;
    L.lo = lm_lo(s, LM_LO_FFN_XN);
    o->linears_bwd(&L, da->xn, a->xn, N, d);
    lm_input_norm_bwd(s, dx, g->ffn_norm, da->xn, x, p->ffn_norm, a->rstd);
}

static int expert_width(const lm_config *c) { return c->moe_latent_dim ? c->moe_latent_dim : c->d_model; }

// The MoE layer's dense projections of xn as one list (see kda_layer.c): the shared
// experts' two inputs, the latent down projection, the router.
static lm_linears xn_linears(const lm_config *c, const lm_layer_params *p, lm_moe_acts *a, lm_layer_params *g,
                             const lm_moe_acts *da) {
    const int Fs = c->n_shared * c->d_ff_expert;
    lm_linears L = {0};
#define XN_LINEAR(w, oc, t) LM_LINEARS_ADD_NAMED(L, p, a, g, da, w, oc, t)
    if (c->n_shared > 0) {
        XN_LINEAR(sh_w1, Fs, sa);
        XN_LINEAR(sh_w3, Fs, sb);
    }
    if (c->moe_latent_dim) XN_LINEAR(lat_down, c->moe_latent_dim, xl);
    XN_LINEAR(router, c->n_experts, z);
#undef XN_LINEAR
    return L;
}

// the routed experts' op arguments: this layer's plan, weights and saved tensors (the
// gradient arena's tensors of the same names are the backward's work buffers)
static lm_experts routed_experts(const lm_step_ctx *s, const lm_layer_params *p, const lm_moe_acts *a) {
    const lm_config *c = s->c;
    return (lm_experts){.N = s->N, .E = c->n_experts, .k = c->top_k, .C = expert_width(c), .F = c->d_ff_expert,
                        .R = s->N * c->top_k, .act = c->expert_act, .offsets = a->offsets,
                        .row_token = a->row_token, .slot_row = a->slot_row, .gate = a->gate, .W1 = p->exp_w1,
                        .W3 = p->exp_w3, .W2 = p->exp_w2, .xp = a->xp, .ea = a->ea, .eb = a->eb, .eh = a->eh,
                        .yp = a->yp};
}

void lm_moe_layer_fwd(lm_step_ctx *s, const lm_layer_params *p, lm_balancer *bal, lm_moe_acts *a, const real *x,
                      real *out, const real *res) {
    const lm_ops *o = s->ops;
    const lm_config *c = s->c;
    const int N = s->N, d = c->d_model, E = c->n_experts, k = c->top_k, F = c->d_ff_expert, dl = expert_width(c);
    lm_linears L = xn_linears(c, p, a, NULL, NULL);   // router logits z among them
    L.lo = lm_lo(s, LM_LO_FFN_XN);
    L.lo_filled = 1;   // by the norm
    lm_input_norm_fwd(s, a->xn, a->rstd, x, p->ffn_norm, L.lo);
    o->linears_fwd(&L, a->xn, N, d);
    // the bias (a buffer updated only between steps) decides selection only
    o->moe_route_fwd(a->idx, a->gate, a->s, a->alpha, a->z, p->route_bias, N, E, k, c->route_scale, 1);
    o->moe_plan(a->counts, a->offsets, a->row_token, a->slot_row, a->idx, a->s, N, E, k, s->capacity);
    if (s->training && bal) lm_balancer_observe(bal, o, a->s, a->alpha, a->counts, a->offsets, N);
    const real *xin = a->xn;
    if (c->moe_latent_dim) xin = a->xl;
    lm_experts ex = routed_experts(s, p, a);
    if (!c->moe_latent_dim) ex.x_lo = L.lo;   // xn's bf16 copy, filled by the norm
    const int Fs = c->n_shared * F;
    if (!c->moe_latent_dim) {
        // the experts op adds its sum into out, which already holds res + the shared experts'
        // output (or res, or zeros): no routed tensor and no separate sum pass
        if (c->n_shared > 0) {
            void *sh_lo = lm_lo(s, LM_LO_FFN_H);   // written by the GLU
            o->glu_fwd(a->sh, a->sa, a->sb, (size_t)N * Fs, c->expert_act, sh_lo);
            lm_linear_res_fwd(o, out, res, a->sh, p->sh_w2, N, Fs, d, sh_lo, 1);
        } else if (res) {
            o->copy(out, res, (size_t)N * d * sizeof(real));
        } else {
            o->zero(out, (size_t)N * d * sizeof(real));
        }
        o->moe_experts_fwd(&ex, out, xin);
    } else {
        o->zero(a->y, (size_t)N * dl * sizeof(real));
        o->moe_experts_fwd(&ex, a->y, xin);
        o->rmsnorm_fwd(a->un, a->un_rstd, a->y, p->lat_norm, N, dl, c->norm_eps, NULL);
        o->matmul_fwd(a->routed, a->un, p->lat_up, NULL, N, dl, d);
        if (c->n_shared > 0) {
            void *sh_lo = lm_lo(s, LM_LO_FFN_H);   // written by the GLU
            o->glu_fwd(a->sh, a->sa, a->sb, (size_t)N * Fs, c->expert_act, sh_lo);
            lm_linear_fwd(o, a->so, a->sh, p->sh_w2, N, Fs, d, sh_lo, 1);
            o->add(out, a->routed, a->so, (size_t)N * d);
        } else {
            o->copy(out, a->routed, (size_t)N * d * sizeof(real));
        }
        if (res) o->add(out, out, res, (size_t)N * d);
    }
    // the balancing losses (host values: the backend waits for them) are not formed when
    // generating with a cache, whose steps may be recorded and replayed (lm_model_forward)
    if (s->cache) return;
    if (c->balance == LM_BAL_AUX && c->aux_coef > 0)
        s->aux_loss += s->aux_dloss * o->moe_aux_fwd(a->s, a->counts, N, E, k, c->aux_coef);
    if (c->zloss_coef > 0) s->aux_loss += s->aux_dloss * o->moe_zloss_fwd(a->z, N, E, c->zloss_coef);
}

void lm_moe_layer_bwd(lm_step_ctx *s, const lm_layer_params *p, lm_layer_params *g, const lm_moe_acts *a,
                      lm_moe_acts *da, const real *x, const real *dout, real *dx) {
    const lm_ops *o = s->ops;
    const lm_config *c = s->c;
    const int N = s->N, d = c->d_model, E = c->n_experts, k = c->top_k, F = c->d_ff_expert, dl = expert_width(c);
    if (c->n_shared > 0) {
        const int Fs = c->n_shared * F;
        lm_linear_bwd_written(o, da->sh, g->sh_w2, dout, a->sh, p->sh_w2, N, Fs, d, lm_lo(s, LM_LO_FFN_H),
                              s->dout_lo);   // one writer
        o->glu_bwd(da->sa, da->sb, da->sh, a->sa, a->sb, (size_t)N * Fs, c->expert_act);
    }
    const real *dy = dout;   // out = routed + shared: the routed branch sees dout unchanged
    if (c->moe_latent_dim) {
        o->matmul_bwd(da->un, g->lat_up, NULL, dout, a->un, p->lat_up, N, dl, d);
        o->rmsnorm_bwd(da->y, g->lat_norm, da->un, a->y, p->lat_norm, a->un_rstd, N, dl, 0);
        dy = da->y;
    }
    const lm_experts ex = routed_experts(s, p, a);
    const lm_experts_grads eg = {.dgate = da->gate, .dW1 = g->exp_w1, .dW3 = g->exp_w3, .dW2 = g->exp_w2,
                                 .dW_assign = s->expert_grads_fresh, .dx_assign = 1, .dyp = da->yp, .deh = da->eh,
                                 .dea = da->ea, .deb = da->eb, .dxp = da->xp};
    o->moe_experts_bwd(&ex, &eg, c->moe_latent_dim ? da->xl : da->xn, dy);
    o->moe_route_bwd(da->z, da->gate, a->s, a->idx, N, E, k, c->route_scale, 1);
    if (c->balance == LM_BAL_AUX && c->aux_coef > 0)
        o->moe_aux_bwd(da->z, a->s, a->counts, N, E, k, c->aux_coef, s->aux_dloss);
    if (c->zloss_coef > 0) o->moe_zloss_bwd(da->z, a->z, N, E, c->zloss_coef, s->aux_dloss);
    // the experts op wrote its dx (xn's gradient, or xl's with the latent projection, whose
    // only writer it is); the linears add into xn's — or, with the latent projection, are
    // its only writer and write it. Neither slot is zeroed (acts.c).
    lm_linears L = xn_linears(c, p, NULL, g, da);
    L.dinp_assign = c->moe_latent_dim != 0;
    L.lo = lm_lo(s, LM_LO_FFN_XN);
    o->linears_bwd(&L, da->xn, a->xn, N, d);
    lm_input_norm_bwd(s, dx, g->ffn_norm, da->xn, x, p->ffn_norm, a->rstd);
}
