// params.c — registration of every parameter tensor and its initialisation.
#include "model/params.h"
#include "core/rng.h"
#include "ops.h"

#define ADD(field, flags, ...) \
    lm_layout_add(L, &(field), (flags), LM_NDIM(__VA_ARGS__), LM_SHAPE(__VA_ARGS__), "%s" , name_buf)

// every call formats the name into name_buf first: keeps the registration table readable
static char name_buf[LM_NAME_MAX];
#define NAME(...) snprintf(name_buf, sizeof name_buf, __VA_ARGS__)

enum { MAT = LM_T_MATRIX, VEC = LM_T_NODECAY };

static void layer_layout(const lm_config *c, int i, lm_layer_params *lp, lm_layout *L) {
    const int d = c->d_model;
    const char *pre = "model.layers";
    NAME("%s.%d.input_layernorm.weight", pre, i);          ADD(lp->attn_norm, VEC, d);
    NAME("%s.%d.post_attention_layernorm.weight", pre, i); ADD(lp->ffn_norm, VEC, d);
    if (c->residual != LM_RES_PRENORM) {
        NAME("%s.%d.self_attention_res_proj.weight", pre, i); ADD(lp->res_attn_w, VEC, d);
        NAME("%s.%d.self_attention_res_norm.weight", pre, i); ADD(lp->res_attn_g, VEC, d);
        NAME("%s.%d.mlp_res_proj.weight", pre, i);            ADD(lp->res_ffn_w, VEC, d);
        NAME("%s.%d.mlp_res_norm.weight", pre, i);            ADD(lp->res_ffn_g, VEC, d);
    }
    if (!lm_layer_is_mla(c, i)) {
        const int H = c->kda_heads, K = c->kda_head_dim, HK = H * K, W = c->kda_conv;
        const char *a = "self_attn";
        NAME("%s.%d.%s.q_proj.weight", pre, i, a);   ADD(lp->q_proj, MAT, HK, d);
        NAME("%s.%d.%s.k_proj.weight", pre, i, a);   ADD(lp->k_proj, MAT, HK, d);
        NAME("%s.%d.%s.v_proj.weight", pre, i, a);   ADD(lp->v_proj, MAT, HK, d);
        NAME("%s.%d.%s.q_conv1d.weight", pre, i, a); ADD(lp->q_conv, 0, HK, W);
        NAME("%s.%d.%s.k_conv1d.weight", pre, i, a); ADD(lp->k_conv, 0, HK, W);
        NAME("%s.%d.%s.v_conv1d.weight", pre, i, a); ADD(lp->v_conv, 0, HK, W);
        NAME("%s.%d.%s.f_a_proj.weight", pre, i, a); ADD(lp->f_a, MAT, K, d);
        NAME("%s.%d.%s.f_b_proj.weight", pre, i, a); ADD(lp->f_b, MAT, HK, K);
        NAME("%s.%d.%s.A_log", pre, i, a);           ADD(lp->A_log, VEC, H);
        NAME("%s.%d.%s.dt_bias", pre, i, a);         ADD(lp->dt_bias, VEC, HK);
        NAME("%s.%d.%s.b_proj.weight", pre, i, a);   ADD(lp->b_proj, MAT, H, d);
        if (c->kda_full_rank_gate) {
            NAME("%s.%d.%s.g_proj.weight", pre, i, a); ADD(lp->g_proj, MAT, HK, d);
        } else {
            NAME("%s.%d.%s.g_a_proj.weight", pre, i, a); ADD(lp->g_a, MAT, K, d);
            NAME("%s.%d.%s.g_b_proj.weight", pre, i, a); ADD(lp->g_b, MAT, HK, K);
        }
        NAME("%s.%d.%s.o_norm.weight", pre, i, a);   ADD(lp->o_norm, VEC, K);
        NAME("%s.%d.%s.o_proj.weight", pre, i, a);   ADD(lp->o_proj, MAT, d, HK);
    } else {
        const int Hm = c->mla_heads, Dqk = lm_mla_qk_dim(c), Dn = c->qk_nope_dim, Dv = c->v_head_dim;
        const int R = c->kv_lora_rank, De = c->qk_extra_dim;
        const char *a = "self_attn";
        if (c->q_lora_rank > 0) {
            NAME("%s.%d.%s.q_a_proj.weight", pre, i, a);      ADD(lp->mq_a, MAT, c->q_lora_rank, d);
            NAME("%s.%d.%s.q_a_layernorm.weight", pre, i, a); ADD(lp->mq_a_norm, VEC, c->q_lora_rank);
            NAME("%s.%d.%s.q_b_proj.weight", pre, i, a);      ADD(lp->mq_b, MAT, Hm * Dqk, c->q_lora_rank);
        } else {
            NAME("%s.%d.%s.q_proj.weight", pre, i, a); ADD(lp->mq_proj, MAT, Hm * Dqk, d);
        }
        NAME("%s.%d.%s.kv_a_proj.weight", pre, i, a);      ADD(lp->kv_a, MAT, R, d);
        if (De > 0) { NAME("%s.%d.%s.k_pe_proj.weight", pre, i, a); ADD(lp->kpe_proj, MAT, De, d); }
        NAME("%s.%d.%s.kv_a_layernorm.weight", pre, i, a); ADD(lp->kv_norm, VEC, R);
        NAME("%s.%d.%s.kv_b_proj.weight", pre, i, a);      ADD(lp->kv_b, MAT, Hm * (Dn + Dv), R);
        if (c->mla_gated) { NAME("%s.%d.%s.o_gate_proj.weight", pre, i, a); ADD(lp->mo_gate, MAT, Hm * Dv, d); }
        NAME("%s.%d.%s.o_proj.weight", pre, i, a);         ADD(lp->o_proj, MAT, d, Hm * Dv);
    }
    if (!lm_layer_is_moe(c, i)) {
        const int F = c->d_ff_dense;
        NAME("%s.%d.mlp.gate_proj.weight", pre, i); ADD(lp->ffn_w1, MAT, F, d);
        NAME("%s.%d.mlp.up_proj.weight", pre, i);   ADD(lp->ffn_w3, MAT, F, d);
        NAME("%s.%d.mlp.down_proj.weight", pre, i); ADD(lp->ffn_w2, MAT, d, F);
    } else {
        const int E = c->n_experts, F = c->d_ff_expert, dl = c->moe_latent_dim ? c->moe_latent_dim : d;
        NAME("%s.%d.mlp.gate.weight", pre, i);                  ADD(lp->router, 0, E, d);
        NAME("%s.%d.mlp.gate.e_score_correction_bias", pre, i); ADD(lp->route_bias, LM_T_BUFFER, E);
        NAME("%s.%d.mlp.experts.gate_proj.weight", pre, i); ADD(lp->exp_w1, MAT | LM_T_EXPERT, E, F, dl);
        NAME("%s.%d.mlp.experts.up_proj.weight", pre, i);   ADD(lp->exp_w3, MAT | LM_T_EXPERT, E, F, dl);
        NAME("%s.%d.mlp.experts.down_proj.weight", pre, i); ADD(lp->exp_w2, MAT | LM_T_EXPERT, E, dl, F);
        if (c->n_shared > 0) {
            const int Fs = c->n_shared * F;
            NAME("%s.%d.mlp.shared_experts.gate_proj.weight", pre, i); ADD(lp->sh_w1, MAT, Fs, d);
            NAME("%s.%d.mlp.shared_experts.up_proj.weight", pre, i);   ADD(lp->sh_w3, MAT, Fs, d);
            NAME("%s.%d.mlp.shared_experts.down_proj.weight", pre, i); ADD(lp->sh_w2, MAT, d, Fs);
        }
        if (c->moe_latent_dim) {
            NAME("%s.%d.mlp.latent_down_proj.weight", pre, i); ADD(lp->lat_down, MAT, dl, d);
            NAME("%s.%d.mlp.latent_norm.weight", pre, i);      ADD(lp->lat_norm, VEC, dl);
            NAME("%s.%d.mlp.latent_up_proj.weight", pre, i);   ADD(lp->lat_up, MAT, d, dl);
        }
    }
}

void lm_params_layout(const lm_config *c, lm_params *p, lm_layout *L) {
    lm_layout_init(L, p);
    const int d = c->d_model;
    NAME("model.embed_tokens.weight"); ADD(p->embed, LM_T_EMBED, c->vocab, d);
    for (int i = 0; i < c->n_layers; i++) layer_layout(c, i, &p->layer[i], L);
    if (c->residual != LM_RES_PRENORM) {
        NAME("model.output_attn_res_proj.weight"); ADD(p->res_out_w, VEC, d);
        NAME("model.output_attn_res_norm.weight"); ADD(p->res_out_g, VEC, d);
    }
    NAME("model.norm.weight"); ADD(p->final_norm, VEC, d);
    if (!c->tie_embeddings) { NAME("lm_head.weight"); ADD(p->lm_head, 0, c->vocab, d); }
}

void lm_params_tie(const lm_config *c, lm_params *p) {
    if (c->tie_embeddings) p->lm_head = p->embed;
}

// name ends with `suffix`
static int ends_with(const char *name, const char *suffix) {
    size_t n = strlen(name), s = strlen(suffix);
    return n >= s && strcmp(name + n - s, suffix) == 0;
}

void lm_params_init(const lm_config *c, const lm_layout *L, real *host, uint64_t seed) {
    // tensors in parallel: each has its own stream, so the values do not depend on the
    // thread count (a 1B-parameter model took ~50 s on one core)
    #pragma omp parallel for schedule(dynamic, 1)
    for (int t = 0; t < L->n; t++) {
        lm_rng r;
        const lm_tensor_info *ti = &L->t[t];
        real *x = host + ti->offset;
        // each tensor gets its own stream so adding a tensor does not reshuffle the rest
        lm_rng_seed(&r, seed ^ (0x9e3779b97f4a7c15ULL * (uint64_t)(t + 1)));
        const char *nm = ti->name;
        if (ends_with(nm, "res_proj.weight")) {
            memset(x, 0, ti->numel * sizeof(real));      // AttnRes pseudo-queries start at zero
        } else if (ti->flags & LM_T_BUFFER) {
            memset(x, 0, ti->numel * sizeof(real));
        } else if (ends_with(nm, ".A_log")) {
            // bounded gate: A_log = 0 (exp = 1); unbounded: A = U[1, 16], A_log = log A
            for (size_t i = 0; i < ti->numel; i++)
                x[i] = c->gate_mode == LM_GATE_BOUNDED ? 0 : (real)log(1 + 15 * lm_rng_uniform(&r));
        } else if (ends_with(nm, ".dt_bias")) {
            // dt ~ exp(U[log 1e-3, log 0.1]), dt_bias = inverse softplus(dt) = dt + log(−expm1(−dt))
            for (size_t i = 0; i < ti->numel; i++) {
                double dt = exp(log(1e-3) + (log(0.1) - log(1e-3)) * lm_rng_uniform(&r));
                if (dt < 1e-4) dt = 1e-4;
                x[i] = (real)(dt + log(-expm1(-dt)));
            }
        } else if ((ti->flags & LM_T_NODECAY) && ti->ndim == 1) {
            for (size_t i = 0; i < ti->numel; i++) x[i] = 1;   // norm gains, γ
        } else if (ends_with(nm, "conv1d.weight")) {
            // depthwise conv: fan-in = width
            double sd = 1.0 / sqrt((double)c->kda_conv);
            for (size_t i = 0; i < ti->numel; i++) x[i] = (real)(sd * (2 * lm_rng_uniform(&r) - 1));
        } else {
            for (size_t i = 0; i < ti->numel; i++) x[i] = (real)(c->init_std * lm_rng_normal(&r));
        }
    }
}
