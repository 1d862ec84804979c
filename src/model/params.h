// params.h — the parameter tensors of the model, named as in the safetensors file.
// One lm_params struct of pointers per use (weights, gradients, optimiser moments),
// all bound into allocations of the same layout (see core/arena.h).
#ifndef LM_PARAMS_H
#define LM_PARAMS_H
#include "core/arena.h"
#include "model/config.h"

// Shapes use d = d_model, H/K/V = KDA heads/head dim, Hm = MLA heads, Dn/De/Dv = MLA
// nope/extra/value dims, R = kv_lora_rank, Rq = q_lora_rank, E = experts,
// F = expert FFN width, Fs = n_shared·F, dl = expert input width (d or moe_latent_dim).
typedef struct {
    real *attn_norm, *ffn_norm;          // [d] PreNorm gains before the mixer and the FFN
    // Block AttnRes pseudo-query w and key-norm gain γ of the two mixers of this layer
    real *res_attn_w, *res_attn_g, *res_ffn_w, *res_ffn_g;   // [d]
    // KDA
    real *q_proj, *k_proj, *v_proj;      // [H·K, d]
    real *q_conv, *k_conv, *v_conv;      // [H·K, W]
    real *f_a, *f_b;                     // [K, d], [H·K, K]   low-rank forget-gate input
    real *A_log;                         // [H]
    real *dt_bias;                       // [H·K]
    real *b_proj;                        // [H, d]             β logits
    real *g_a, *g_b;                     // [K, d], [H·K, K]   low-rank output gate
    real *g_proj;                        // [H·K, d]           full-rank output gate (option)
    real *o_norm;                        // [V] headwise RMSNorm gain shared by heads
    real *o_proj;                        // [d, H·V] (KDA) or [d, Hm·Dv] (MLA)
    // MLA
    real *mq_proj;                       // [Hm·(Dn+De), d]    (q_lora_rank = 0)
    real *mq_a, *mq_a_norm, *mq_b;       // [Rq, d], [Rq], [Hm·(Dn+De), Rq]
    real *kv_a;                          // [R, d]             latent
    real *kpe_proj;                      // [De, d]            extra key dims shared by heads
    real *kv_norm;                       // [R]
    real *kv_b;                          // [Hm·(Dn+Dv), R]    per-head k_nope and v
    real *mo_gate;                       // [Hm·Dv, d]         output gate
    // dense FFN (SwiGLU)
    real *ffn_w1, *ffn_w3, *ffn_w2;      // [Fd, d], [Fd, d], [d, Fd]
    // MoE
    real *router;                        // [E, d]
    real *route_bias;                    // [E] balancing bias (buffer, not trained)
    real *exp_w1, *exp_w3, *exp_w2;      // [E, F, dl], [E, F, dl], [E, dl, F]
    real *sh_w1, *sh_w3, *sh_w2;         // [Fs, d], [Fs, d], [d, Fs]
    real *lat_down, *lat_norm, *lat_up;  // [dl, d], [dl], [d, dl]   latent MoE (K3)
} lm_layer_params;

typedef struct {
    real *embed;                         // [Vocab, d]
    real *final_norm;                    // [d]
    real *res_out_w, *res_out_g;         // [d] output AttnRes mixer
    real *lm_head;                       // [Vocab, d] (= embed when tied)
    lm_layer_params layer[LM_MAX_LAYERS];
} lm_params;

// Registers every parameter of the config in L (owner = *p). Tied embeddings: lm_head is
// not registered; bind it with lm_params_tie() after binding.
void lm_params_layout(const lm_config *c, lm_params *p, lm_layout *L);
void lm_params_tie(const lm_config *c, lm_params *p);
// Host-side initialisation of a host copy of the whole parameter block (std init_std
// normal for matrices, 1 for norm gains, KDA gate init of SPEC §1.1, AttnRes w = 0,
// γ = 1, zero biases).
void lm_params_init(const lm_config *c, const lm_layout *L, real *host, uint64_t seed);

#endif
