// config.h — the model configuration: every architectural option of SPEC §1, the
// layer schedule derived from it, the presets users type, validation with messages
// that name the offending field, JSON round trip (checkpoint metadata, --config),
// and parameter counting.
#ifndef LM_CONFIG_H
#define LM_CONFIG_H
#include "core/common.h"

enum { LM_RES_BLOCK = 0, LM_RES_FULL = 1, LM_RES_PRENORM = 2 };

typedef struct lm_config {
    char name[32];
    int vocab, d_model, n_layers;
    real norm_eps;
    real init_std;
    int tie_embeddings;
    int seq_len;                 // default training sequence length of the preset

    // layer schedule: layer i (0-based) is MLA iff (i+1) % mla_period == 0, or it is the
    // last layer and mla_last; every other layer is KDA. layer_types is derived ('K'/'M')
    // unless set explicitly (then period/last are ignored).
    int mla_period, mla_last;
    char layer_types[LM_MAX_LAYERS + 1];
    int first_dense;             // number of leading layers whose FFN is a dense SwiGLU

    // KDA (SPEC §1.1)
    int kda_heads, kda_head_dim; // H, K = V
    int kda_conv;                // short conv width (4)
    int gate_mode;               // LM_GATE_BOUNDED / LM_GATE_UNBOUNDED
    real gate_lb;                // lower bound of the bounded gate, in [-5, 0)
    int kda_chunk;               // 16, 32 or 64
    int kda_form;                // LM_KDA_* core form (AUTO by default)
    int kda_full_rank_gate;      // output gate g_proj [H·V, d] instead of g_a/g_b (K3 option)

    // MLA (SPEC §1.2)
    int mla_heads;
    int q_lora_rank;             // 0 = direct q projection
    int kv_lora_rank;            // latent width r
    int qk_nope_dim, qk_extra_dim, v_head_dim;
    int mla_gated;               // per-head, per-channel sigmoid output gate

    // FFN (SPEC §1.3)
    int d_ff_dense;
    int n_experts, top_k, n_shared, d_ff_expert;
    int moe_latent_dim;          // 0 = experts work at d_model; else K3 latent MoE width
    real route_scale;
    int expert_act;              // LM_ACT_SWIGLU / LM_ACT_SITU

    // balancing and dispatch
    int balance;                 // lm_balance_kind of model/balancer.h (qb by default)
    int qb_bins;
    real balance_rate;           // u of sign / step of quartile
    real aux_coef;               // coefficient of the aux loss (balance = aux)
    real zloss_coef;             // router z-loss, 0 = off
    real capacity_factor;        // 0 = dropless
    int capacity_relax_steps;    // capacity relaxes to dropless by this step

    // residual stream (SPEC §1.4)
    int residual;                // LM_RES_*
    int block_layers;            // S_b: decoder layers per AttnRes block
} lm_config;

// Fills *c with a named preset: "tiny", "small", "kimi-linear-48b-a3b", "k3". Apply any
// overrides, then call lm_config_finalize.
lm_status lm_config_preset(lm_config *c, const char *name);
// Derives layer_types and checks every field; the error names the field.
lm_status lm_config_finalize(lm_config *c);
static inline int lm_layer_is_mla(const lm_config *c, int i) { return c->layer_types[i] == 'M'; }
static inline int lm_layer_is_moe(const lm_config *c, int i) { return i >= c->first_dense && c->n_experts > 0; }
static inline int lm_mla_qk_dim(const lm_config *c) { return c->qk_nope_dim + c->qk_extra_dim; }

// JSON: every field by name. Parsing rejects unknown keys and wrong types; fields not
// present keep their value in *c (so a file can override a preset).
char *lm_config_to_json(const lm_config *c);              // malloc'd
lm_status lm_config_apply_json(lm_config *c, const char *json);
// Sets one field from a string ("d_model", "128"), for command-line overrides.
lm_status lm_config_set(lm_config *c, const char *key, const char *value);

// Parameter counts from the parameter layout (one source of truth with allocation).
// total: every trained parameter (a tied embedding counted once; balancing biases are
// buffers and not counted). active: the parameters one token's forward pass multiplies
// with — total minus the embedding table (a lookup) minus the (E − top_k)/E share of
// the routed-expert weights.
void lm_config_count_params(const lm_config *c, double *total, double *active);

// Model FLOPs of one token of a training step (forward + backward = 3 × forward) at
// sequence length T, the numerator of MFU. Forward per token:
//   matmuls    2 × active parameters (the LM head included, the embedding lookup not)
//   MLA        per layer 2·H·(Dqk + Dv)·(T+1)/2   (QKᵀ and PV over the causal average context)
//   KDA        per layer and head 2·(3·K·V + C·K + C·V/2), chunk C: the state products
//              (q·S, k·S, k⊗u) and the within-chunk products (kkᵀ, qkᵀ, P·u)
// Recomputation is not counted (model FLOPs, not hardware FLOPs).
double lm_config_train_flops(const lm_config *c, int T);
void lm_config_print(const lm_config *c, FILE *f);

const char *lm_residual_name(int mode);
int lm_residual_from_name(const char *s);    // -1 if unknown

#endif
