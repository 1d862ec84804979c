// mla_layer.c — gated NoPE multi-head latent attention (SPEC §1.2) as a sublayer:
//   xn = RMSNorm(x);  q = W_q xn (or W_qb RMSNorm(W_qa xn));  c = RMSNorm(W_kva xn) [R]
//   kpe = W_kpe xn [De];  [k_nope | v] per head = W_kvb c;  k = [k_nope, kpe]
//   o = causal softmax(q kᵀ · (Dn+De)^-1/2) v, no positions;  o ← o ⊙ sigmoid(W_gate xn)
//   out = o_proj(o)
#include "model/layers.h"

static real mla_scale(const lm_config *c) { return 1 / sqrt((real)lm_mla_qk_dim(c)); }

// Appends this chunk's latents c [B,T,R] and extra key dims kpe [B,T,De] to the cache
// at positions len … len+T−1 of every sequence: where the backend's lens (len + T, set by
// lm_model_forward, which also refuses a chunk that does not fit) says, so that a recorded
// one-token step appends at the current end.
static void cache_append(lm_step_ctx *s, const lm_mla_acts *a) {
    const lm_ops *o = s->ops;
    const lm_config *c = s->c;
    lm_cache *kc = s->cache;
    const int R = c->kv_lora_rank, De = c->qk_extra_dim, T = s->T;
    LM_CHECK(kc->lens_value == kc->len + T, "MLA cache append: lens not set for this chunk");
    o->cache_append(kc->mla_c[s->layer], a->c, kc->lens, s->B, T, R, kc->max_len, kc->mla_bf16);
    if (De > 0) o->cache_append(kc->mla_kpe[s->layer], a->kpe, kc->lens, s->B, T, De, kc->max_len, kc->mla_bf16);
}

// Attention of the chunk's queries over the whole cache in the absorbed form: W_uk is
// folded into the query (q_lat = W_ukᵀ q_nope) and W_uv applied after the latent-space
// weighted sum, so per-head keys and values are never formed. Token t of the chunk sees
// the first len + t + 1 cached tokens.
static void decode_absorbed(lm_step_ctx *s, const lm_layer_params *p, lm_mla_acts *a) {
    const lm_ops *o = s->ops;
    const lm_config *c = s->c;
    lm_cache *kc = s->cache;
    const int B = s->B, T = s->T, N = s->N, Hm = c->mla_heads, Dqk = lm_mla_qk_dim(c);
    const int Dn = c->qk_nope_dim, De = c->qk_extra_dim, Dv = c->v_head_dim, R = c->kv_lora_rank;
    const long stride = (long)(Dn + Dv) * R;
    o->copy2d(a->q_nope, Dn, a->q, Dqk, (size_t)N * Hm, Dn);
    if (De > 0) o->copy2d(a->q_pe, De, a->q + Dn, Dqk, (size_t)N * Hm, De);
    o->head_matmul(a->q_lat, a->q_nope, p->kv_b, N, Hm, Dn, R, stride, 1);
    for (int t = 0; t < T; t++) {
        // every sequence has the same length; the backend copy is rewritten only when that
        // length changes: a one-token step finds it set by lm_model_forward (len + 1)
        lm_cache_set_lens(kc, kc->len + t + 1);
        // token t of every sequence: rows b·T + t
        o->copy2d(a->step_q_lat, (size_t)Hm * R, a->q_lat + (size_t)t * Hm * R, (size_t)T * Hm * R, B, (size_t)Hm * R);
        if (De > 0)
            o->copy2d(a->step_q_pe, (size_t)Hm * De, a->q_pe + (size_t)t * Hm * De, (size_t)T * Hm * De, B,
                      (size_t)Hm * De);
        o->mla_decode(a->step_o_lat, a->step_q_lat, a->step_q_pe, kc->mla_c[s->layer], kc->mla_kpe[s->layer],
                      kc->lens, B, Hm, R, De, kc->max_len, mla_scale(c), kc->mla_bf16);
        o->copy2d(a->o_lat + (size_t)t * Hm * R, (size_t)T * Hm * R, a->step_o_lat, (size_t)Hm * R, B, (size_t)Hm * R);
    }
    o->head_matmul(a->o, a->o_lat, p->kv_b + (size_t)Dn * R, N, Hm, R, Dv, stride, 0);
}

// Chunked prefill (T ≥ PREFIX_MIN_T tokens after len cached ones): per-head keys and values
// of all len + T cached tokens (up-projected from the latent cache, one sequence at a time,
// into the cache's scratch), then causal attention of the chunk's queries over them. One
// up-projection of the cache per chunk instead of a decode step per token; the scratch
// grows with the whole context (B·(len+T)·H·(Dn+Dv + Dqk+Dv) reals, and L·(R+De) for a bf16
// cache's rows widened), so shorter chunks keep the absorbed token-by-token path, whose
// memory follows the chunk.
#define PREFIX_MIN_T 64
static void prefill_over_cache(lm_step_ctx *s, const lm_layer_params *p, lm_mla_acts *a) {
    const lm_ops *o = s->ops;
    const lm_config *c = s->c;
    lm_cache *kc = s->cache;
    const int B = s->B, T = s->T, P = kc->len, L = P + T, Hm = c->mla_heads, Dqk = lm_mla_qk_dim(c);
    const int Dn = c->qk_nope_dim, De = c->qk_extra_dim, Dv = c->v_head_dim, R = c->kv_lora_rank;
    const size_t nkv = (size_t)L * Hm * (Dn + Dv), nk = (size_t)B * L * Hm * Dqk, nv = (size_t)B * L * Hm * Dv;
    const size_t a16 = 16;   // reals: keeps every part 64-byte aligned
    const size_t pkv = (nkv + a16 - 1) / a16 * a16, pk = (nk + a16 - 1) / a16 * a16, pv = (nv + a16 - 1) / a16 * a16;
    const size_t pc = kc->mla_bf16 ? ((size_t)L * R + a16 - 1) / a16 * a16 : 0, pe = kc->mla_bf16 ? (size_t)L * De : 0;
    real *kv = lm_cache_scratch(kc, (pkv + pk + pv + pc + pe) * sizeof(real)), *k = kv + pkv, *v = k + pk;
    real *crow = v + pv, *erow = crow + pc;   // a bf16 cache's rows of sequence b, widened
    for (int b = 0; b < B; b++) {
        const real *cb = crow, *eb = De > 0 ? erow : NULL;
        if (kc->mla_bf16) {
            o->cache_rows(crow, kc->mla_c[s->layer], b, L, R, kc->max_len, 1);
            if (De > 0) o->cache_rows(erow, kc->mla_kpe[s->layer], b, L, De, kc->max_len, 1);
        } else {   // the reals in place
            cb = kc->mla_c[s->layer] + (size_t)b * kc->max_len * R;
            eb = De > 0 ? kc->mla_kpe[s->layer] + (size_t)b * kc->max_len * De : NULL;
        }
        o->matmul_fwd(kv, cb, p->kv_b, NULL, L, R, Hm * (Dn + Dv));
        o->mla_split_fwd(k + (size_t)b * L * Hm * Dqk, v + (size_t)b * L * Hm * Dv, kv, eb, L, Hm, Dn, De, Dv);
    }
    o->attn_prefix_fwd(a->o, a->q, k, v, B, T, P, Hm, Dqk, Dv, mla_scale(c));
}

// The projections of xn as one list (see kda_layer.c): q (or its low-rank down
// projection), the latent kv, the decoupled key part, the output gate.
static lm_linears xn_linears(const lm_config *c, const lm_layer_params *p, lm_mla_acts *a, lm_layer_params *g,
                             const lm_mla_acts *da) {
    const int Hm = c->mla_heads, Dqk = lm_mla_qk_dim(c), De = c->qk_extra_dim, Dv = c->v_head_dim;
    lm_linears L = {0};
#define XN_LINEAR(w, oc, t) LM_LINEARS_ADD_NAMED(L, p, a, g, da, w, oc, t)
    if (c->mla_gated) XN_LINEAR(mo_gate, Hm * Dv, z);
    if (De > 0) XN_LINEAR(kpe_proj, De, kpe);
    XN_LINEAR(kv_a, c->kv_lora_rank, craw);
    if (c->q_lora_rank > 0) XN_LINEAR(mq_a, c->q_lora_rank, qa);
    else XN_LINEAR(mq_proj, Hm * Dqk, q);
#undef XN_LINEAR
    return L;
}

void lm_mla_layer_fwd(lm_step_ctx *s, const lm_layer_params *p, lm_mla_acts *a, const real *x, real *out,
                      const real *res) {
    const lm_ops *o = s->ops;
    const lm_config *c = s->c;
    const int N = s->N, d = c->d_model, Hm = c->mla_heads, Dqk = lm_mla_qk_dim(c);
    const int Dn = c->qk_nope_dim, De = c->qk_extra_dim, Dv = c->v_head_dim, R = c->kv_lora_rank, Rq = c->q_lora_rank;
    lm_linears L = xn_linears(c, p, a, NULL, NULL);
    L.lo = lm_lo(s, LM_LO_ATTN_XN);
    L.lo_filled = 1;   // by the norm
    lm_input_norm_fwd(s, lm_norm_out(s, a->xn, L.lo), a->rstd, x, p->attn_norm, L.lo);   // xn: read as L.lo
    o->linears_fwd(&L, a->xn, N, d);
    if (Rq > 0) {
        void *qan_lo = lm_lo(s, LM_LO_ATTN_B);   // written by its norm
        o->rmsnorm_fwd(a->qan, a->qa_rstd, a->qa, p->mq_a_norm, N, Rq, c->norm_eps, qan_lo);
        lm_linear_fwd(o, a->q, a->qan, p->mq_b, N, Rq, Hm * Dqk, qan_lo, 1);
    }
    // c's copy (for kv_b) written by its norm; only the cacheless path below reads it
    void *c_lo = lm_lo(s, LM_LO_ATTN_A);
    o->rmsnorm_fwd(a->c, a->c_rstd, a->craw, p->kv_norm, N, R, c->norm_eps, c_lo);
    lm_cache *kc = s->cache;
    if (kc) cache_append(s, a);
    if (kc && kc->len > 0 && s->T < PREFIX_MIN_T) {
        decode_absorbed(s, p, a);
    } else if (kc && kc->len > 0) {
        prefill_over_cache(s, p, a);
    } else {
        lm_linear_fwd(o, a->kv, a->c, p->kv_b, N, R, Hm * (Dn + Dv), c_lo, 1);
        void *qkv_lo = lm_lo(s, LM_LO_ATTN_QKV);   // training on CUDA: q, k, v kept in bf16 for the backward
        if (qkv_lo) {
            o->mla_split_fwd_lo(a->k, a->v, qkv_lo, a->kv, a->kpe, s->B, s->T, Hm, Dn, De, Dv);
            o->attn_fwd_lo(a->o, a->lse, a->q, qkv_lo, s->B, s->T, Hm, Dqk, Dv, mla_scale(c));
        } else {
            o->mla_split_fwd(a->k, a->v, a->kv, a->kpe, N, Hm, Dn, De, Dv);
            o->attn_fwd(a->o, a->lse, a->q, a->k, a->v, s->B, s->T, Hm, Dqk, Dv, mla_scale(c));
        }
    }
    const real *og = a->o;
    void *out_lo = lm_lo(s, LM_LO_ATTN_OUT);
    if (c->mla_gated) {   // z: among the projections of xn above; og's copy for o_proj written by the gate
        o->sigmoid_gate_fwd(a->og, a->o, a->z, (size_t)N * Hm * Dv, out_lo);
        og = a->og;
    }
    lm_linear_res_fwd(o, out, res, og, p->o_proj, N, Hm * Dv, d, out_lo, c->mla_gated);
}

void lm_mla_layer_bwd(lm_step_ctx *s, const lm_layer_params *p, lm_layer_params *g, const lm_mla_acts *a,
                      lm_mla_acts *da, const real *x, const real *dout, real *dx) {
    const lm_ops *o = s->ops;
    const lm_config *c = s->c;
    const int N = s->N, d = c->d_model, Hm = c->mla_heads, Dqk = lm_mla_qk_dim(c);
    const int Dn = c->qk_nope_dim, De = c->qk_extra_dim, Dv = c->v_head_dim, R = c->kv_lora_rank, Rq = c->q_lora_rank;
    // every intermediate gradient below has one writer, which writes it (the slots are not
    // zeroed: acts.c)
    if (c->mla_gated) {
        lm_linear_bwd_written(o, da->og, g->o_proj, dout, a->og, p->o_proj, N, Hm * Dv, d, lm_lo(s, LM_LO_ATTN_OUT),
                              s->dout_lo);
        o->sigmoid_gate_bwd(da->o, da->z, da->og, a->o, a->z, (size_t)N * Hm * Dv, 1);
    } else {
        lm_linear_bwd_written(o, da->o, g->o_proj, dout, a->o, p->o_proj, N, Hm * Dv, d, lm_lo(s, LM_LO_ATTN_OUT),
                              s->dout_lo);
    }
    const void *qkv_lo = lm_lo(s, LM_LO_ATTN_QKV);   // the forward's bf16 q, k, v (CUDA training)
    if (qkv_lo)
        o->attn_bwd_lo(da->q, da->k, da->v, da->o, qkv_lo, a->o, a->lse, s->B, s->T, Hm, Dqk, Dv, mla_scale(c), 1);
    else
        o->attn_bwd(da->q, da->k, da->v, da->o, a->q, a->k, a->v, a->o, a->lse, s->B, s->T, Hm, Dqk, Dv, mla_scale(c),
                    1);
    // dkv straight to kv_b's backward in bf16 (CUDA training)
    void *dkv_lo = o->mla_split_bwd_lo ? lm_grad_lo_home(s, da->kv, N, Hm * (Dn + Dv)) : NULL;
    if (dkv_lo) o->mla_split_bwd_lo(dkv_lo, da->kpe, da->k, da->v, N, Hm, Dn, De, Dv);
    else o->mla_split_bwd(da->kv, da->kpe, da->k, da->v, N, Hm, Dn, De, Dv, 1);
    lm_linear_bwd_written(o, da->c, g->kv_b, da->kv, a->c, p->kv_b, N, R, Hm * (Dn + Dv), lm_lo(s, LM_LO_ATTN_A),
                          dkv_lo);
    o->rmsnorm_bwd(da->craw, g->kv_norm, da->c, a->craw, p->kv_norm, a->c_rstd, N, R, 1);
    if (Rq > 0) {
        lm_linear_bwd_written(o, da->qan, g->mq_b, da->q, a->qan, p->mq_b, N, Rq, Hm * Dqk, lm_lo(s, LM_LO_ATTN_B), NULL);
        o->rmsnorm_bwd(da->qa, g->mq_a_norm, da->qan, a->qa, p->mq_a_norm, a->qa_rstd, N, Rq, 1);
    }
    lm_linears L = xn_linears(c, p, NULL, g, da);
    L.dinp_assign = 1;
    L.lo = lm_lo(s, LM_LO_ATTN_XN);
    o->linears_bwd(&L, da->xn, a->xn, N, d);
    lm_input_norm_bwd(s, dx, g->attn_norm, da->xn, x, p->attn_norm, a->rstd);
}
