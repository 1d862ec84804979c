// layers.h — the sublayers of one decoder layer (KDA mixer, MLA mixer, dense FFN,
// MoE FFN) as forward/backward pairs over the op interface, with the activations
// each one saves for its backward.
//
// Every sublayer is PreNorm: out = Sublayer(RMSNorm(x)). x [N, d] is the sublayer's
// input (the residual stream, or the AttnRes mixer output), out [N, d] its output.
// Backward adds ∂L/∂x into dx and parameter gradients into g (all accumulating).
#ifndef LM_LAYERS_H
#define LM_LAYERS_H
#include "ops.h"
#include "model/config.h"
#include "model/params.h"
#include "model/balancer.h"
#include "model/cache.h"

// The linear inputs of a layer whose GEMM-precision copy a training forward keeps for the
// backward's weight gradients (lm_linears.lo; the CUDA bf16 mode), one home each:
//   ATTN_XN: the mixer's normalised input;  ATTN_OUT: the mixer's output projection's input (KDA on,
//   MLA og or o);  ATTN_A, ATTN_B: KDA fa, ga / MLA c, qan;  FFN_XN: the FFN's normalised input;
//   FFN_H: the dense GLU's h, the MoE shared experts' sh.
// LM_LO_ATTN_QKV: an MLA layer's q, k, v in its attention kernels' precision (ops.h
// attn_lo_bytes), not a linear's input
enum { LM_LO_ATTN_XN, LM_LO_ATTN_OUT, LM_LO_ATTN_A, LM_LO_ATTN_B, LM_LO_FFN_XN, LM_LO_FFN_H, LM_LO_ATTN_QKV, LM_LO_N };

// N = B·T tokens; shapes per field.
typedef struct {
    real *xn, *rstd;             // [N,d], [N]        normalised input
    real *qp, *kp, *vp;          // [N,H·K]           projections before the short conv
    real *q, *k, *v;             // [N,H·K]           after conv + SiLU (KDA op inputs)
    real *fa, *f;                // [N,K], [N,H·K]    forget-gate input (low rank)
    real *bl;                    // [N,H]             β logits
    real *o;                     // [N,H·V]           KDA core output
    real *ga, *gz;               // [N,K], [N,H·V]    output gate (low rank or full rank)
    real *on, *on_rstd;          // [N,H·V], [N·H]    gated headwise RMSNorm output
} lm_kda_acts;

typedef struct {
    real *xn, *rstd;             // [N,d], [N]
    real *qa, *qa_rstd, *qan;    // [N,Rq], [N], [N,Rq]   low-rank q (q_lora_rank > 0)
    real *q;                     // [N,Hm,Dn+De]
    real *craw, *c_rstd, *c;     // [N,R], [N], [N,R]     latent before/after its RMSNorm
    real *kpe;                   // [N,De]
    real *kv;                    // [N,Hm,Dn+Dv]
    real *k, *v;                 // [N,Hm,Dn+De], [N,Hm,Dv]
    real *o, *lse;               // [N,Hm,Dv], [B,Hm,T]
    real *z, *og;                // [N,Hm·Dv]         gate logits and gated output
    // decode with a cache (absorbed form): per-head query parts and latent-space vectors
    real *q_nope, *q_pe;         // [N,Hm,Dn], [N,Hm,De]
    real *q_lat, *o_lat;         // [N,Hm,R]
    real *step_q_lat, *step_q_pe, *step_o_lat;   // [B,Hm,R], [B,Hm,De], [B,Hm,R]  one token per sequence
} lm_mla_acts;

typedef struct {
    real *xn, *rstd;             // [N,d], [N]
    real *a, *b, *h;             // [N,F]             W1 x, W3 x, act(a)·b
} lm_dense_acts;

typedef struct {
    real *xn, *rstd;             // [N,d], [N]
    real *z, *s, *alpha, *gate;  // [N,E], [N,E], [N], [N,k]   router
    int *idx;                    // [N,k]
    int *counts, *offsets;       // [E], [E+1]
    int *row_token, *slot_row;   // [N·k], [N·k]
    real *xl;                    // [N,dl]            latent input (moe_latent_dim > 0)
    real *xp;                    // [N·k,dl]          rows grouped by expert
    real *ea, *eb, *eh;          // [N·k,F]
    real *yp;                    // [N·k,dl]
    // y, un, routed and so exist only with the latent projection (moe_latent_dim > 0); without
    // it the routed sum is added straight into the sublayer's output
    real *y;                     // [N,dl]            combined routed output
    real *un, *un_rstd;          // [N,dl], [N]       latent RMSNorm of y
    real *routed;                // [N,d]             routed branch in model width
    real *sa, *sb, *sh;          // [N,Fs]            shared expert(s)
    real *so;                    // [N,d]             shared branch output
} lm_moe_acts;

typedef struct {
    lm_kda_acts kda;
    lm_mla_acts mla;
    lm_dense_acts dense;
    lm_moe_acts moe;
} lm_layer_acts;

// Per-step context shared by the sublayers.
typedef struct {
    const lm_ops *ops;
    const lm_config *c;
    int B, T, N;
    int training;                // updates balancing statistics
    lm_cache *cache;             // inference: read and extend this cache (NULL in training)
    int layer;                   // decoder layer being run
    int capacity;                // per-expert capacity for this step, −1 = dropless
    real aux_dloss;              // weight of this micro-batch's aux/z losses in the objective
    double aux_loss;             // forward: sum of aux + z losses of the micro-batch (objective units)
    void *const *kda_saved;      // training: per layer, the KDA forward's intermediates for its backward
    void *(*lo)[LM_LO_N];        // training: per layer, homes of its linears' inputs in GEMM precision
                                 // (lm_linears.lo; NULL, or NULL entries, where the backend keeps none)
    int expert_grads_fresh;      // backward: write the experts' weight gradients, not add (lm_model)
    int dx_assign;               // backward: the sublayer writes its input stream's gradient, not adds
    void *dout_lo;               // backward: the sublayer's output gradient also in the linears' GEMM
                                 // precision (written by the mixer before it: lm_source_grads.lo), or NULL
    // the sublayer's input RMSNorm (xn, rstd and its lo) ran in the AttnRes mixer before it
    // (ops attnres_norm_fwd): the sublayer skips it, and its backward leaves ∂xn to that mixer
    // instead of computing dx
    int in_normed;
    // training on a backend that keeps GEMM-precision copies, with its GEMMs in that precision:
    // a norm output whose readers all take the copy (the attention and dense sublayers' input,
    // the final norm's output) is written only there (lm_norm_out); the MoE sublayer's experts
    // may read its xn itself, so that one is always written
    int xn_lo_only;
} lm_step_ctx;

// where a norm writes the output xn whose copy is lo, when every reader of xn takes lo: NULL
// (the copy alone) under xn_lo_only, else xn
static inline real *lm_norm_out(const lm_step_ctx *s, real *xn, const void *lo) {
    return s->xn_lo_only && lo ? NULL : xn;
}

// The sublayer's input norm xn = RMSNorm(x) ⊙ gain (lo: rmsnorm_fwd's), unless the mixer
// before it ran it (in_normed)
static inline void lm_input_norm_fwd(const lm_step_ctx *s, real *xn, real *rstd, const real *x, const real *gain,
                                     void *lo) {
    if (!s->in_normed) s->ops->rmsnorm_fwd(xn, rstd, x, gain, s->N, s->c->d_model, s->c->norm_eps, lo);
}
// its backward, dx from dxn (s->dx_assign: written) — or, when the mixer ran the norm, nothing:
// that mixer's backward reads dxn
static inline void lm_input_norm_bwd(const lm_step_ctx *s, real *dx, real *dgain, const real *dxn, const real *x,
                                     const real *gain, const real *rstd) {
    if (!s->in_normed) s->ops->rmsnorm_bwd(dx, dgain, dxn, x, gain, rstd, s->N, s->c->d_model, s->dx_assign);
}

void lm_layer_acts_layout(const lm_config *c, int i, int B, int T, lm_layer_acts *a, lm_layout *L);
// the width C of each LM_LO_* input of layer i (0: the layer has no such linear)
void lm_layer_lo_widths(const lm_config *c, int i, int C[LM_LO_N]);
// the home of input `slot` of the running layer, or NULL
static inline void *lm_lo(const lm_step_ctx *s, int slot) { return s->lo ? s->lo[s->layer][slot] : NULL; }
// A tensor [N, C] passed between two ops in the linears' GEMM precision (a gradient, or the KDA
// output), in its own fp32 slot (then unused): in training on a backend that keeps such copies,
// where they fit; NULL otherwise
static inline void *lm_grad_lo_home(const lm_step_ctx *s, real *slot, int N, int C) {
    const lm_ops *o = s->ops;
    if (!s->lo || !o->linears_lo_bytes) return NULL;
    const size_t b = o->linears_lo_bytes(N, C);
    return b && b <= (size_t)N * C * sizeof(real) ? (void *)slot : NULL;
}

// Appends the linear W [OC, ·] to a list of linears of one input (ops.h lm_linears): its
// output (forward), output gradient and weight gradient (backward); the unused ones NULL.
static inline void lm_linears_add(lm_linears *L, const real *W, int OC, real *out, const real *dout, real *dW) {
    LM_ASSERT(L->n < LM_MAX_LINEARS);
    const int i = L->n++;
    L->W[i] = W;
    L->OC[i] = OC;
    L->out[i] = out;
    L->dout[i] = dout;
    L->dW[i] = dW;
}
// The linear p->w of `oc` outputs whose tensor is t: output a->t (forward), output gradient
// da->t and weight gradient g->w (backward); a, da, g may each be NULL (then NULL is given).
// For a sublayer's list of the linears of its normalised input (xn_linears).
// dinp [N,C] = dout · W, written rather than added (for a gradient with this one writer in
// the backward, whose slot is not zeroed: acts.c); dW [OC,C] += doutᵀ · inp
// (lo: lm_linears.lo, the forward's copy of inp, or NULL; dout_lo: lm_linears.dout_lo, dout
// already in the GEMM precision, or NULL)
static inline void lm_linear_bwd_written(const lm_ops *o, real *dinp, real *dW, const real *dout, const real *inp,
                                         const real *W, int N, int C, int OC, void *lo, void *dout_lo) {
    const lm_linears L = {.n = 1, .OC = {OC}, .W = {W}, .dout = {dout}, .dW = {dW}, .dinp_assign = 1, .lo = lo,
                          .dout_lo = dout_lo};
    o->linears_bwd(&L, dinp, inp, N, C);
}
// out [N,OC] = res [N,OC] + inp [N,C] · W [OC,C]ᵀ (res NULL: no residual; else a sublayer's
// output linear writing the residual stream's next tensor, lm_linears.res), leaving inp's
// GEMM-precision copy in lo (or NULL) — or, with lo_filled, reading it there (inp's producer
// wrote it: rmsnorm_fwd's lo and the like)
static inline void lm_linear_res_fwd(const lm_ops *o, real *out, const real *res, const real *inp, const real *W,
                                     int N, int C, int OC, void *lo, int lo_filled) {
    const lm_linears L = {.n = 1, .OC = {OC}, .W = {W}, .out = {out}, .res = {res}, .lo = lo, .lo_filled = lo_filled};
    o->linears_fwd(&L, inp, N, C);
}
// the same without a residual
static inline void lm_linear_fwd(const lm_ops *o, real *out, const real *inp, const real *W, int N, int C, int OC,
                                 void *lo, int lo_filled) {
    lm_linear_res_fwd(o, out, NULL, inp, W, N, C, OC, lo, lo_filled);
}
#define LM_LINEARS_ADD_NAMED(L, p, a, g, da, w, oc, t) \
    lm_linears_add(&(L), (p)->w, (oc), (a) ? (a)->t : NULL, (da) ? (da)->t : NULL, (g) ? (g)->w : NULL)

// The sublayers: out [N, d] = res + sublayer(x) (res NULL: out = sublayer(x)); res is the
// partial sum the residual stream adds the output onto, which the output linear adds in (the
// sublayer's own output is then never stored). Their backwards need neither out nor res.
void lm_kda_layer_fwd(lm_step_ctx *s, const lm_layer_params *p, lm_kda_acts *a, const real *x, real *out,
                      const real *res);
void lm_kda_layer_bwd(lm_step_ctx *s, const lm_layer_params *p, lm_layer_params *g, const lm_kda_acts *a,
                      lm_kda_acts *da, const real *x, const real *dout, real *dx);
void lm_mla_layer_fwd(lm_step_ctx *s, const lm_layer_params *p, lm_mla_acts *a, const real *x, real *out,
                      const real *res);
void lm_mla_layer_bwd(lm_step_ctx *s, const lm_layer_params *p, lm_layer_params *g, const lm_mla_acts *a,
                      lm_mla_acts *da, const real *x, const real *dout, real *dx);
void lm_dense_layer_fwd(lm_step_ctx *s, const lm_layer_params *p, lm_dense_acts *a, const real *x, real *out,
                        const real *res);
void lm_dense_layer_bwd(lm_step_ctx *s, const lm_layer_params *p, lm_layer_params *g, const lm_dense_acts *a,
                        lm_dense_acts *da, const real *x, const real *dout, real *dx);
// bal may be NULL (no statistics, e.g. evaluation)
void lm_moe_layer_fwd(lm_step_ctx *s, const lm_layer_params *p, lm_balancer *bal, lm_moe_acts *a, const real *x,
                      real *out, const real *res);
void lm_moe_layer_bwd(lm_step_ctx *s, const lm_layer_params *p, lm_layer_params *g, const lm_moe_acts *a,
                      lm_moe_acts *da, const real *x, const real *dout, real *dx);

#endif
