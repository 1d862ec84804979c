// model.h — the whole model: parameters, activations, the residual-stream plan
// (PreNorm, Block AttnRes or Full AttnRes), forward and backward.
//
// Reading order for one token: model.c lm_model_forward (embedding → the tape of
// mixers and sublayers → final norm → LM head → cross-entropy), then the sublayers
// in kda_layer.c, mla_layer.c and ffn_layer.c.
#ifndef LM_MODEL_H
#define LM_MODEL_H
#include "model/layers.h"

#define LM_MAX_STREAM (6 * LM_MAX_LAYERS + 4)
#define LM_MAX_MIX (2 * LM_MAX_LAYERS + 1)
#define LM_MAX_TAPE (6 * LM_MAX_LAYERS + 4)

// One step of the residual-stream plan. Stream tensors are [N, d] and numbered; the
// plan is fixed by the config (it does not depend on data).
enum { LM_TP_MIX, LM_TP_ATTN, LM_TP_FFN, LM_TP_ADD };
typedef struct {
    int kind;
    int layer;        // decoder layer of a sublayer or mixer; −1 for the output mixer
    int out;          // stream written
    int in[2];        // ATTN/FFN read in[0]; ADD reads in[0] + in[1]
    int mix;          // MIX: index into lm_model.mix
    // backward: the stream gradients this op writes rather than adds into, being their first
    // access (plan_grad_writes): MIX bit j = source j, ATTN/FFN bit 0 = in[0], ADD bit j = in[j]
    unsigned assign;
    // MIX: it runs the RMSNorm that reads its output (ops attnres_norm_*): the input norm of the
    // sublayer after it, or the final norm. ATTN/FFN: its input norm ran in the mixer before it
    // (lm_step_ctx.in_normed), whose backward reads the norm's output gradient
    int normed;
    // backward, where the backend keeps GEMM-precision copies (plan_dout_lo): MIX, the source
    // j ≥ 0 whose gradient it also writes in that precision to lm_model.lo_dstream (−1: none);
    // ATTN/FFN, 1 if its output gradient arrives there (lm_step_ctx.dout_lo)
    int dout_lo;
    // ATTN/FFN: the ADD right after it (its output + the partial sum in[0]) runs inside it, as
    // its output linear's residual (lm_linears.res): it writes the ADD's output, and its own
    // output stream, read by that ADD alone, is never stored. ADD: it ran so (plan_fused_adds)
    int fused;
} lm_tape_op;

typedef struct {
    int n;                          // number of sources
    int src[LM_MAX_SOURCES];        // stream ids
    int layer, which;               // parameters: layer's attn (0) / ffn (1) mixer, or output (layer −1)
} lm_mix_plan;

typedef struct {
    real *stream[LM_MAX_STREAM];    // [N, d]
    real *alpha[LM_MAX_MIX];        // [N, n_sources] AttnRes weights
    lm_layer_acts layer[LM_MAX_LAYERS];
    real *fn, *fn_rstd;             // [N, d], [N]   final RMSNorm
    real *logits;                   // [N, Vocab]
    real *losses, *lse;             // [N]
    int *tokens, *targets;          // [N]
} lm_acts;

typedef struct lm_model {
    lm_config cfg;
    const lm_ops *ops;
    lm_layout playout;              // parameters (names as in the safetensors file)
    lm_params params, grads;
    real *params_mem, *grads_mem;   // backend memory, playout.numel reals each
    int B, T;                       // activation buffers are sized for B × T
    lm_layout alayout;
    lm_acts acts, dacts;            // activations and their gradients (same layout)
    real *acts_mem, *dacts_mem;
    // what the backend's KDA forward keeps for its backward (training only; ops->kda_saved_bytes
    // per KDA layer, none when 0): one allocation, a pointer per layer (NULL for MLA layers)
    void *kda_saved_mem;
    void *kda_saved[LM_MAX_LAYERS];
    // the GEMM-precision copies of the linears' inputs a training forward keeps for the backward
    // (lm_linears.lo, ops->linears_lo_bytes; none when 0): one allocation, a home per layer and
    // LM_LO_* input (NULL where the layer has no such input), and the LM head's
    void *lo_mem;
    void *lo[LM_MAX_LAYERS][LM_LO_N];
    void *lo_head;
    void *lo_dstream;               // [N, d]: a sublayer's output gradient, from its mixer (dout_lo)
    // residual plan
    int n_stream, n_tape, n_mix;
    int stream_embed, stream_final;
    // grad_alias[s] ≥ 0: stream s feeds only the ADD whose output that is, so its gradient is
    // that output's gradient itself — one buffer, no accumulation pass (−1: its own)
    int grad_alias[LM_MAX_STREAM];
    // grad_unzeroed[b]: the backward's first access to gradient buffer b is a write (the op's
    // assign bit, or final_assign for the final norm's), or it has none (the output of a mixer
    // that runs its reader's norm), so b is not zeroed before the backward
    unsigned char grad_unzeroed[LM_MAX_STREAM];
    int final_assign;
    // the routed experts' weight gradients (LM_T_EXPERT, ~90% of a MoE model's gradients) hold
    // nothing yet: lm_model_zero_grads skipped them, and the next backward writes them instead
    // of adding (no memset and no read of the zeros, 3 × E·F·C fp32 each way per MoE layer)
    int expert_grads_fresh;
    // LM_KEEP_XN=1 (A/B measurements): the norms write their fp32 outputs even where every reader
    // takes the GEMM-precision copy (lm_step_ctx.xn_lo_only)
    int keep_xn;
    lm_tape_op tape[LM_MAX_TAPE];
    lm_mix_plan mix[LM_MAX_MIX];
    // balancing state of each MoE layer
    lm_balancer bal[LM_MAX_LAYERS];
    // last forward
    lm_step_ctx ctx;
    double last_ce_sum;             // Σ cross-entropy over counted targets
    long last_count;                // counted targets
} lm_model;

// The output mixer — a MIX ending the tape — runs the final norm (its `normed`: plan_mix_norms)
static inline int lm_final_normed(const lm_model *m) {
    return m->n_tape > 0 && m->tape[m->n_tape - 1].kind == LM_TP_MIX && m->tape[m->n_tape - 1].normed;
}

// Creates the model on a backend with freshly initialised parameters (seeded).
lm_model *lm_model_create(const lm_config *c, const lm_ops *ops, uint64_t seed);
void lm_model_free(lm_model *m);
// (Re)allocates activations for batches of B sequences of T tokens.
// Reserves the activations of a B × T batch (a forward does it); the first backward at that
// shape adds their gradients.
void lm_model_reserve(lm_model *m, int B, int T);
// Backend bytes of the activations of a B × T batch, and of their gradients too when
// with_grads (what training needs; a forward alone needs the activations).
size_t lm_model_acts_bytes(const lm_model *m, int B, int T, int with_grads);
// the same for a config, without creating its model (linmoe plan)
size_t lm_config_acts_bytes(const lm_config *c, int B, int T, int with_grads);

typedef struct {
    int training;                   // update balancing statistics
    int capacity;                   // per-expert capacity, −1 = dropless
    real aux_weight;                // weight of this micro-batch's aux/z losses (its share of the step)
    lm_cache *cache;                // inference: continue these sequences (B must match); NULL = fresh
} lm_fwd_opts;

// tokens, targets: host arrays [B·T]; targets < 0 are not counted; targets may be NULL
// (logits only). Returns the mean cross-entropy over counted targets (NAN if none).
double lm_model_forward(lm_model *m, const int *tokens, const int *targets, int B, int T, lm_fwd_opts opts);
// Accumulates parameter gradients of  dloss · Σ_counted CE + (aux losses of the forward)
// into m->grads. Call after lm_model_forward on the same batch.
void lm_model_backward(lm_model *m, real dloss);
// Zeroes the gradients (the experts' weights lazily: see expert_grads_fresh).
void lm_model_zero_grads(lm_model *m);
// Host copies of parameters (for checkpoints and tests).
void lm_model_get_params(const lm_model *m, real *host);
void lm_model_set_params(lm_model *m, const real *host);
void lm_model_get_grads(lm_model *m, real *host);

#endif
