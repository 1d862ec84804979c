// acts.c — the activation tensors each sublayer saves for its backward, registered
// in the model's activation layout for a batch of B sequences of T tokens.
#include "model/layers.h"

#define ADD(field, flags, ...) \
    lm_layout_add(L, &(field), (flags), LM_NDIM(__VA_ARGS__), LM_SHAPE(__VA_ARGS__), "layers.%d.%s", i, #field)

void lm_layer_acts_layout(const lm_config *c, int i, int B, int T, lm_layer_acts *a, lm_layout *L) {
    const int64_t N = (int64_t)B * T, d = c->d_model;
    if (!lm_layer_is_mla(c, i)) {
        lm_kda_acts *k = &a->kda;
        const int64_t H = c->kda_heads, K = c->kda_head_dim, HK = H * K;
        // each of these gradients has one writer in the backward (kda_layer.c), which writes
        // it rather than adding (or none: the rstd): no zeroing, no read of the zeros
        const unsigned ng = LM_T_NO_GRAD_ZERO;
        ADD(k->xn, ng, N, d); ADD(k->rstd, ng, N);
        ADD(k->qp, ng, N, HK); ADD(k->kp, ng, N, HK); ADD(k->vp, ng, N, HK);
        ADD(k->q, ng, N, HK); ADD(k->k, ng, N, HK); ADD(k->v, ng, N, HK);
        ADD(k->fa, ng, N, K); ADD(k->f, ng, N, HK); ADD(k->bl, ng, N, H);
        ADD(k->o, ng, N, HK);
        if (!c->kda_full_rank_gate) ADD(k->ga, ng, N, K);
        ADD(k->gz, ng, N, HK);
        ADD(k->on, ng, N, HK); ADD(k->on_rstd, ng, N * H);
    } else {
        lm_mla_acts *m = &a->mla;
        const int64_t Hm = c->mla_heads, Dqk = lm_mla_qk_dim(c), Dn = c->qk_nope_dim, De = c->qk_extra_dim;
        const int64_t Dv = c->v_head_dim, R = c->kv_lora_rank, Rq = c->q_lora_rank;
        // as in a KDA layer, each of these gradients has one writer (mla_layer.c), which writes it
        const unsigned ng = LM_T_NO_GRAD_ZERO;
        ADD(m->xn, ng, N, d); ADD(m->rstd, ng, N);
        if (Rq > 0) { ADD(m->qa, ng, N, Rq); ADD(m->qa_rstd, ng, N); ADD(m->qan, ng, N, Rq); }
        ADD(m->q, ng, N, Hm * Dqk);
        ADD(m->craw, ng, N, R); ADD(m->c_rstd, ng, N); ADD(m->c, ng, N, R);
        if (De > 0) ADD(m->kpe, ng, N, De);
        ADD(m->kv, ng, N, Hm * (Dn + Dv));
        ADD(m->k, ng, N, Hm * Dqk); ADD(m->v, ng, N, Hm * Dv);
        ADD(m->o, ng, N, Hm * Dv); ADD(m->lse, ng, N * Hm);
        if (c->mla_gated) { ADD(m->z, ng, N, Hm * Dv); ADD(m->og, ng, N, Hm * Dv); }
        // the absorbed decode's work tensors (inference only: no backward)
        ADD(m->q_nope, ng, N, Hm * Dn); if (De > 0) ADD(m->q_pe, ng, N, Hm * De);
        ADD(m->q_lat, ng, N, Hm * R); ADD(m->o_lat, ng, N, Hm * R);
        ADD(m->step_q_lat, ng, (int64_t)B * Hm * R); if (De > 0) ADD(m->step_q_pe, ng, (int64_t)B * Hm * De);
        ADD(m->step_o_lat, ng, (int64_t)B * Hm * R);
    }
    if (!lm_layer_is_moe(c, i)) {
        lm_dense_acts *f = &a->dense;
        const int64_t F = c->d_ff_dense;
        const unsigned ng = LM_T_NO_GRAD_ZERO;   // written by their one writer (ffn_layer.c)
        ADD(f->xn, ng, N, d); ADD(f->rstd, ng, N);
        ADD(f->a, 0, N, F); ADD(f->b, 0, N, F); ADD(f->h, ng, N, F);
    } else {
        lm_moe_acts *m = &a->moe;
        const int64_t E = c->n_experts, k = c->top_k, F = c->d_ff_expert;
        const int64_t dl = c->moe_latent_dim ? c->moe_latent_dim : d;
        // xn's gradient is written by the experts op (or, with the latent projection, by the
        // linears), sh's by its one linear, xl's by the experts op (ffn_layer.c): not zeroed
        ADD(m->xn, LM_T_NO_GRAD_ZERO, N, d); ADD(m->rstd, LM_T_NO_GRAD_ZERO, N);
        ADD(m->z, 0, N, E); ADD(m->s, 0, N, E); ADD(m->alpha, 0, N); ADD(m->gate, 0, N, k);
        ADD(m->idx, LM_T_INT, N, k); ADD(m->counts, LM_T_INT, E); ADD(m->offsets, LM_T_INT, E + 1);
        ADD(m->row_token, LM_T_INT, N * k); ADD(m->slot_row, LM_T_INT, N * k);
        if (c->moe_latent_dim) ADD(m->xl, LM_T_NO_GRAD_ZERO, N, dl);
        // gradient slots the backward does not need zeroed: the experts op's work buffers
        // (xp, ea, eb, eh, yp), and routed, so, whose gradient is dout itself. Without the
        // latent projection the routed sum goes straight into the sublayer's output (no y,
        // routed, so: ffn_layer.c)
        const unsigned ng = LM_T_NO_GRAD_ZERO;
        ADD(m->xp, ng, N * k, dl);
        ADD(m->ea, ng, N * k, F); ADD(m->eb, ng, N * k, F); ADD(m->eh, ng, N * k, F);
        ADD(m->yp, ng, N * k, dl);
        if (c->moe_latent_dim) {
            ADD(m->y, 0, N, dl); ADD(m->un, 0, N, dl); ADD(m->un_rstd, 0, N); ADD(m->routed, ng, N, d);
        }
        if (c->n_shared > 0) {
            const int64_t Fs = c->n_shared * F;
            ADD(m->sa, 0, N, Fs); ADD(m->sb, 0, N, Fs); ADD(m->sh, LM_T_NO_GRAD_ZERO, N, Fs);
            if (c->moe_latent_dim) ADD(m->so, ng, N, d);
        }
    }
}

void lm_layer_lo_widths(const lm_config *c, int i, int C[LM_LO_N]) {
    for (int j = 0; j < LM_LO_N; j++) C[j] = 0;
    C[LM_LO_ATTN_XN] = C[LM_LO_FFN_XN] = c->d_model;
    if (!lm_layer_is_mla(c, i)) {
        C[LM_LO_ATTN_OUT] = c->kda_heads * c->kda_head_dim;
        C[LM_LO_ATTN_A] = c->kda_head_dim;                              // fa → f_b
        if (!c->kda_full_rank_gate) C[LM_LO_ATTN_B] = c->kda_head_dim;  // ga → g_b
    } else {
        C[LM_LO_ATTN_OUT] = c->mla_heads * c->v_head_dim;
        C[LM_LO_ATTN_A] = c->kv_lora_rank;                              // c → kv_b
        C[LM_LO_ATTN_B] = c->q_lora_rank;                               // qan → mq_b (0: none)
    }
    C[LM_LO_FFN_H] = !lm_layer_is_moe(c, i) ? c->d_ff_dense : c->n_shared * c->d_ff_expert;
}
