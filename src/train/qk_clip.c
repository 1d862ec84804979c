// qk_clip.c — see qk_clip.h.
#include "train/qk_clip.h"

void lm_qk_reset(const lm_model *m, real *maxlog) {
    for (int i = 0; i < m->cfg.n_layers * m->cfg.mla_heads; i++) maxlog[i] = -INFINITY;
}

void lm_qk_observe(const lm_model *m, real *maxlog) {
    const lm_config *c = &m->cfg;
    real *cur = lm_malloc((size_t)c->mla_heads * sizeof(real));
    for (int i = 0; i < c->n_layers; i++) {
        if (!lm_layer_is_mla(c, i)) continue;
        const lm_mla_acts *a = &m->acts.layer[i].mla;
        m->ops->attn_max_logit(cur, a->q, a->k, m->ctx.B, m->ctx.T, c->mla_heads, lm_mla_qk_dim(c),
                               1 / sqrt((real)lm_mla_qk_dim(c)));
        for (int h = 0; h < c->mla_heads; h++)
            if (cur[h] > maxlog[i * c->mla_heads + h]) maxlog[i * c->mla_heads + h] = cur[h];
    }
    free(cur);
}

int lm_qk_clip(lm_model *m, const real *maxlog, real tau) {
    const lm_config *c = &m->cfg;
    const lm_ops *o = m->ops;
    const int Hm = c->mla_heads, Dn = c->qk_nope_dim, De = c->qk_extra_dim, Dv = c->v_head_dim, Dqk = Dn + De;
    const int R = c->kv_lora_rank, qin = c->q_lora_rank > 0 ? c->q_lora_rank : c->d_model;
    int clipped = 0;
    for (int i = 0; i < c->n_layers; i++) {
        if (!lm_layer_is_mla(c, i)) continue;
        lm_layer_params *p = &m->params.layer[i];
        real *wq = c->q_lora_rank > 0 ? p->mq_b : p->mq_proj;   // [Hm·Dqk, qin]
        for (int h = 0; h < Hm; h++) {
            real mx = maxlog[i * Hm + h];
            if (!(mx > tau)) continue;
            real g = tau / mx, sg = sqrt(g);
            o->scale(wq + (size_t)h * Dqk * qin, sg, (size_t)Dn * qin);                  // q nope rows
            if (De > 0) o->scale(wq + ((size_t)h * Dqk + Dn) * qin, g, (size_t)De * qin);  // q extra rows
            o->scale(p->kv_b + (size_t)h * (Dn + Dv) * R, sg, (size_t)Dn * R);          // k nope rows
            clipped++;
        }
    }
    return clipped;
}
