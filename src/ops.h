// ops.h — the op interface: every computation the model performs, as forward /
// backward pairs with their tensor shapes. The model code (src/model/) calls ops
// only through an lm_ops table and never touches tensor memory itself, so the same
// model definition runs on the CPU backend (src/cpu/, the fp32 source of truth) and
// the CUDA backend (src/cuda/).
//
// Conventions (all ops):
// - Tensors are row-major; shapes are given in comments as [dims]. Sequences are
//   packed as [B, T, ...] = N = B·T rows.
// - Backward ops ACCUMULATE (+=) into every gradient they produce, so branches and
//   micro-batches add up without extra copies. Any gradient pointer may be NULL when
//   that gradient is not needed.
// - Integer tensors (tokens, expert indices, row maps) are int32 in backend memory.
// - Nothing in an op reads or writes memory that its arguments do not name.
#ifndef LM_OPS_H
#define LM_OPS_H
#include "core/common.h"

#define LM_MAX_SOURCES (2 * LM_MAX_LAYERS + 2)

enum { LM_GATE_BOUNDED = 0, LM_GATE_UNBOUNDED = 1 };
enum { LM_ACT_SWIGLU = 0, LM_ACT_SITU = 1 };
// KDA core forms. AUTO = chunked, factored diagonal blocks for the bounded gate and
// per-position (exact exponent difference) diagonal blocks for the unbounded gate.
enum { LM_KDA_AUTO = 0, LM_KDA_NAIVE = 1, LM_KDA_CHUNK_FACTORED = 2, LM_KDA_CHUNK_EXACT = 3 };

// Arguments of the fused KDA op (SPEC §1.1): L2 norm of q and k per head
// (x / sqrt(Σx² + 1e-6)), gate activation, β = sigmoid(beta_logit), and the delta-rule
// recurrence with per-channel decay, state S [K, V] per (sequence, head) in fp32:
//   S ← Diag(exp(g_t)) S;  r = v_t − Sᵀk_t;  S ← S + β_t k_t rᵀ;  o_t = Sᵀ(scale·q_t)
// bounded gate:   g = lb · sigmoid(exp(A_log[h]) · (f + dt_bias[h,c]))
// unbounded gate: g = −exp(A_log[h]) · softplus(f + dt_bias[h,c])
typedef struct {
    int B, T, H, K, V;
    int gate_mode;                 // LM_GATE_*
    real lb;                       // lower bound of g, in [-5, 0) (bounded mode)
    int form;                      // LM_KDA_*
    int chunk;                     // chunk length for the chunked forms: 16, 32 or 64
    real scale;                    // applied to q, normally K^-1/2
    // inputs
    const real *q, *k;             // [B,T,H,K] before L2 normalisation
    const real *v;                 // [B,T,H,V]
    const real *f;                 // [B,T,H,K] raw gate input (before activation)
    const real *beta_logit;        // [B,T,H]   before sigmoid
    const real *A_log;             // [H]
    const real *dt_bias;           // [H,K]
    const real *S0;                // [B,H,K,V] initial state, NULL = zeros
    // outputs
    real *o;                       // [B,T,H,V]
    real *S_out;                   // [B,H,K,V] final state, may be NULL (may equal S0)
    // backward: upstream gradients (NULL = zero) and accumulated input gradients
    const real *d_o;               // [B,T,H,V]
    const real *dS_out;            // [B,H,K,V]
    real *dq, *dk, *dv, *df, *dbeta_logit, *dA_log, *ddt_bias, *dS0;
    int grads_assign;              // dq, dk, dv, df, dbeta_logit are written (contents on entry
                                   // do not matter), not added into; the rest accumulate
    // decode only: state pool [n_slots,H,K,V] updated in place; slots[b] picks the
    // pool entry of sequence b (NULL = b)
    real *state;
    const int *slots;
    // training: backend memory of kda_saved_bytes that carries the forward's intermediates
    // to the backward of the same inputs (the forward fills it, the backward reads it
    // instead of recomputing); NULL = the backward recomputes them
    void *saved;
    // Optional: the KDA layer's short conv + SiLU in front of q, k, v, inside the op
    // (conv_W ≥ 1; no conv cache; not for kda_decode). The op then forms
    //   q = SiLU(conv(qkv_pre[0], conv_w[0])), k and v likewise (conv_silu_fwd's definition)
    // itself and ignores the q, k, v pointers: qkv_pre [B,T,H·K] ×2 and [B,T,H·V], conv_w
    // [H·K, conv_W] ×2 and [H·V, conv_W]. So that a backend can keep q, k, v in its own
    // precision only (the CUDA backend writes its bf16 copies straight from the conv and
    // the backward's conv reads the bf16 gradients): qkv_out is where a backend that keeps
    // them in fp32 does (the CPU: written by the forward, read by the backward), and in the
    // backward dq, dk, dv are its work buffers (undefined afterwards). The backward adds the
    // conv's backward: dqkv_pre written or added as grads_assign says, dconv_w accumulate
    // (NULL entries skipped).
    int conv_W;
    const real *qkv_pre[3], *conv_w[3];
    real *qkv_out[3];
    real *dqkv_pre[3], *dconv_w[3];
    // backward, optional: memory of linears_lo_bytes(B·T, H·K) bytes — given only on a backend
    // whose linears_lo_bytes is nonzero there — where the backward writes df in its linears'
    // GEMM precision instead of writing df: the output gradient of the linear that made f, read
    // by its backward as lm_linears.dout_lo (grads_assign must be set; df is left alone)
    void *df_lo;
    // backward, optional: d_o already in that precision (the gated norm's dx_lo), read instead of d_o
    const void *d_o_lo;
    // forward, optional (training, on a backend whose linears_lo_bytes(B·T, H·V) is nonzero): o
    // written in the kernels' own precision into o_lo (that many bytes) instead of into o (left
    // alone), for the gated norm that reads it (gated_rmsnorm_fwd/bwd's x_lo)
    void *o_lo;
    // backward, optional (with grads_assign, the conv, and a nonzero linears_lo_bytes): the conv's
    // input gradients written in the linears' GEMM precision instead of into dqkv_pre (left
    // alone), as the column blocks [0, H·K), [H·K, 2·H·K), [2·H·K, 2·H·K + H·V) of a [B·T,
    // dqkv_pre_ld] matrix whose first column is at dqkv_pre_lo: the output gradients of the
    // projections that made qkv_pre, read by their backward as lm_linears.dout_lo (the CUDA
    // backend: dqkv_pre_ld % 4 == 0, dqkv_pre_lo 8-byte aligned)
    void *dqkv_pre_lo;
    int dqkv_pre_ld;
} lm_kda_args;

// A list of [N, C] source tensors for the AttnRes mixer, passed by value so that a
// GPU backend can hand it to a kernel as a parameter.
typedef struct { const real *p[LM_MAX_SOURCES]; int n; } lm_sources;
// assign bit j: p[j] is written, not added into (for a buffer listed twice, its first entry only).
// lo (or NULL; with lo_j < n): a home of N·C values in the linears' GEMM precision where a
// backend that keeps such copies (linears_lo_bytes) also writes p[lo_j] as this op leaves it
// (its last entry, for a buffer listed twice), for the linear that reads that gradient next
// (lm_linears.dout_lo); the CPU ignores it.
typedef struct {
    real *p[LM_MAX_SOURCES];
    int n;
    unsigned assign;
    void *lo;
    int lo_j;
} lm_source_grads;

// The routed experts of one MoE layer (moe_experts_fwd/bwd): the dispatch plan of moe_plan,
// the SwiGLU experts' weights, and the tensors the forward keeps for the backward.
//   xp = x[row_token] [R, C];  ea = xp·W1[e]ᵀ, eb = xp·W3[e]ᵀ [R, F];  eh = act(ea) ⊙ eb;
//   yp [R, C] = eh·W2[e]ᵀ  (per expert segment e);  y [N, C] += Σ_slot gate · yp[slot_row]
// xp, ea, eb, eh and yp are the backend's: only moe_experts_bwd reads them, in the form its
// forward wrote (the CPU keeps the fp32 values; the CUDA backend's bf16 GEMM mode keeps bf16
// values in the first half of xp and eh, which its tensor-core GEMMs read without a rounding
// pass, and on its TMA kernels of ea, eb and yp too: lm_cuda_experts_keep_bf16).
typedef struct {
    int N, E, k, C, F, R, act;      // tokens, experts, slots per token, width, expert FFN width,
                                    // rows allocated (N·k ≥ offsets[E]), LM_ACT_*
    const int *offsets, *row_token, *slot_row;   // [E+1], [R], [N·k]
    const real *gate;               // [N, k]
    const real *W1, *W3, *W2;       // [E, F, C], [E, F, C], [E, C, F]
    real *xp, *ea, *eb, *eh, *yp;   // saved by the forward: [R, C], [R, F] ×3, [R, C]
    // the forward's x in the backend's GEMM precision (an lm_linears.lo its producer filled),
    // or NULL: the CUDA bf16 path gathers xp from it instead of rounding x's rows again
    const void *x_lo;
} lm_experts;
// Their gradients: dx (the op's argument), dgate, dW1, dW3, dW2 accumulate — or with dx_assign
// the op writes dx, and with dW_assign dW1,
// dW3, dW2 (zeros for experts without rows) and their contents on entry do not matter;
// dyp [R, C], deh, dea, deb [R, F] and dxp [R, C] are work buffers: their contents on entry
// do not matter (the model does not zero them) and they hold nothing defined afterwards.
typedef struct {
    real *dgate, *dW1, *dW3, *dW2;
    int dW_assign;
    int dx_assign;   // the op's dx is written (tokens without a routed slot get zeros), not added into
    real *dyp, *deh, *dea, *deb, *dxp;
} lm_experts_grads;

// Linear layers that read the same input (linears_fwd/bwd), e.g. a sublayer's projections
// of its normalised input: out_i [N, OC_i] = inp [N, C] · W_i [OC_i, C]ᵀ for i < n, no
// biases. Backward: dinp [N, C] += Σ_i dout_i · W_i (the CPU adds in list order; the CUDA
// bf16 path sums the list in one product), and
// dW_i [OC_i, C] += dout_iᵀ · inp (a NULL dW_i is skipped). out is read by the forward,
// dout and dW by the backward. A given res_i makes the forward out_i = res_i + inp · W_iᵀ
// (res_i [N, OC_i], not out_i itself): a sublayer's output linear adding its result to the
// residual stream, so that no separate add pass writes and reads the sublayer's output
// (the CUDA bf16 path adds it in the GEMM's epilogue).
#define LM_MAX_LINEARS 8
typedef struct {
    int n;
    int OC[LM_MAX_LINEARS];
    const real *W[LM_MAX_LINEARS];
    real *out[LM_MAX_LINEARS];
    const real *res[LM_MAX_LINEARS];   // forward: NULL, or the tensor out_i is added onto
    const real *dout[LM_MAX_LINEARS];
    real *dW[LM_MAX_LINEARS];
    int dinp_assign;   // backward: dinp is written (its contents on entry do not matter), not added into
    // training: backend memory of linears_lo_bytes(N, C) bytes, or NULL. The forward leaves inp
    // there in the backend's GEMM precision (the CUDA bf16 mode: rounded once, as it reads it),
    // and the backward of the same inp reads it for the weight gradients instead of rounding
    // inp again; a backend without such a form ignores it. The backend's GEMM precision must
    // not change between the forward and that backward (the CUDA mode is set once, from
    // LM_CUDA_GEMM; only tests switch it, between model steps).
    void *lo;
    int lo_filled;     // lo already holds inp: its producer wrote it (rmsnorm_fwd's lo), the forward reads it
    // backward: output gradients already in the GEMM precision, given only where
    // linears_lo_bytes(N, OC) > 0. A list of one (n = 1): dout_lo holds its [N, OC] gradient
    // (e.g. lm_kda_args.df_lo), read instead of dout[0]. A longer list: dout_lo is the [N, ΣOC]
    // matrix of the column blocks of every linear with OC > 0, in list order (the backward
    // wants dinp here), of which the producers wrote the blocks whose bit is set in
    // dout_lo_filled (e.g. lm_kda_args.dqkv_pre_lo); the backward fills the others from dout[i]
    void *dout_lo;
    unsigned dout_lo_filled;
} lm_linears;

// One tensor of the parameter arena for AdamW: elements [offset, offset + n) of p, g, m and v
// (arenas of one layout), updated with weight decay wd.
typedef struct {
    size_t offset, n;
    real wd;
} lm_adamw_span;

typedef struct lm_ops {
    const char *name;

    // ---- memory (backend memory: host for cpu, device for cuda); sizes in bytes ----
    void *(*alloc)(size_t bytes);                         // zero-filled
    void (*free)(void *p);
    void (*to_device)(void *dst, const void *host_src, size_t bytes);
    void (*to_host)(void *host_dst, const void *src, size_t bytes);
    void (*copy)(void *dst, const void *src, size_t bytes);
    void (*zero)(void *p, size_t bytes);
    // strided block copy of `rows` rows of `cols` reals (strides in reals)
    void (*copy2d)(real *dst, size_t dst_stride, const real *src, size_t src_stride, size_t rows, size_t cols);

    // ---- elementwise over n elements ----
    void (*add)(real *out, const real *a, const real *b, size_t n);   // out = a + b (out may alias)
    void (*acc)(real *acc, const real *x, size_t n);                  // acc += x
    void (*scale)(real *x, real s, size_t n);                         // x *= s
    double (*sumsq)(const real *x, size_t n);                         // Σ x², fixed summation order
    int (*all_finite)(const real *x, size_t n);                       // 1 if no NaN/Inf

    // ---- embedding: out[N,C] = table[tokens[N]] ; table [Vocab, C] ----
    void (*embed_fwd)(real *out, const int *tokens, const real *table, int N, int C);
    void (*embed_bwd)(real *dtable, const int *tokens, const real *dout, int N, int C);

    // ---- linear: out[N,OC] = inp[N,C] · W[OC,C]ᵀ + bias[OC] (bias may be NULL) ----
    // W (here and in grouped_matmul) is a parameter: a backend may keep a reduced-precision
    // copy of it until a parameter-writing op writes it (to_device, adamw, muon, scale) or
    // memory is allocated or freed (the CUDA backend does, see cuda_backend.h); copy, copy2d
    // and zero into a weight do not count
    void (*matmul_fwd)(real *out, const real *inp, const real *W, const real *bias, int N, int C, int OC);
    void (*matmul_bwd)(real *dinp, real *dW, real *dbias, const real *dout, const real *inp,
                       const real *W, int N, int C, int OC);

    // the same for several linears of one input (lm_linears above): as a loop of
    // matmul_fwd / matmul_bwd (dinp may be NULL), but a backend may round inp to its GEMM
    // precision once for the whole list (the CUDA backend does)
    void (*linears_fwd)(const lm_linears *L, const real *inp, int N, int C);
    void (*linears_bwd)(const lm_linears *L, real *dinp, const real *inp, int N, int C);
    // bytes of lm_linears.lo for an [N, C] input (NULL or 0: the backend keeps no such copy)
    size_t (*linears_lo_bytes)(int N, int C);

    // ---- RMSNorm with gain: out = inp · rstd · gain, rstd[N] = (mean(inp²) + eps)^-1/2 ----
    // lo: NULL, or an lm_linears.lo home for out (linears_lo_bytes(N, C) bytes): a backend that
    // keeps such copies writes out there too, as the linears reading out would round it, so
    // that they need not (lm_linears.lo_filled); the CPU ignores it. On a backend that keeps
    // copies, out may be NULL when lo is given: only the copy is written (for readers that
    // take it alone: linears in that backend's GEMM precision)
    void (*rmsnorm_fwd)(real *out, real *rstd, const real *inp, const real *gain, int N, int C, real eps,
                        void *lo);
    // dinp accumulates (assign: written, its contents on entry do not matter); dgain accumulates
    void (*rmsnorm_bwd)(real *dinp, real *dgain, const real *dout, const real *inp, const real *gain,
                        const real *rstd, int N, int C, int assign);

    // ---- headwise gated RMSNorm (KDA output): x, z, out [N, H·V]; w [V] shared by heads;
    //      out = x · rstd_h · w ⊙ sigmoid(z), rstd [N·H] ----
    // (lo: as rmsnorm_fwd's, for out as an [N, H·V] input; x_lo, here and in the backward: NULL,
    // or x in the linears' GEMM precision (lm_kda_args.o_lo), read instead of x — on a backend
    // whose linears_lo_bytes is nonzero; the CPU refuses it)
    void (*gated_rmsnorm_fwd)(real *out, real *rstd, const real *x, const real *z, const real *w,
                              int N, int H, int V, real eps, void *lo, const void *x_lo);
    // dx, dz accumulate (assign: written, their contents on entry do not matter); dw accumulates.
    // dx_lo, dz_lo: NULL, or (with assign, on a backend whose linears_lo_bytes(N, H·V) is nonzero)
    // memory of that many bytes where dx / dz are written in the linears' GEMM precision instead
    // of into dx / dz (for lm_kda_args.d_o_lo and lm_linears.dout_lo); the CUDA backend takes
    // them for V % 4 == 0, V ≤ 128 (the KDA head dims) and refuses other V
    void (*gated_rmsnorm_bwd)(real *dx, real *dz, real *dw, const real *dout, const real *x,
                              const real *z, const real *w, const real *rstd, int N, int H, int V, int assign,
                              void *dx_lo, void *dz_lo, const void *x_lo);

    // ---- out = x ⊙ sigmoid(z) (gated MLA output), n elements ----
    // (lo: as rmsnorm_fwd's, for out as the input of a linear)
    void (*sigmoid_gate_fwd)(real *out, const real *x, const real *z, size_t n, void *lo);
    // dx, dz accumulate (assign: written, their contents on entry do not matter)
    void (*sigmoid_gate_bwd)(real *dx, real *dz, const real *dout, const real *x, const real *z, size_t n,
                             int assign);

    // ---- GLU: h = act(g) ⊙ u, act = SiLU (LM_ACT_SWIGLU) or SiTU (LM_ACT_SITU, caps 4 and 25) ----
    // (lo: as rmsnorm_fwd's, for h as the [N, F] input of a linear, n = N·F)
    void (*glu_fwd)(real *h, const real *g, const real *u, size_t n, int act, void *lo);
    void (*glu_bwd)(real *dg, real *du, const real *dh, const real *g, const real *u, size_t n, int act);

    // ---- causal depthwise conv of width W, no bias, then SiLU, over B sequences of T ----
    //   inp, out [B,T,C]; w [C,W] (w[c][W-1] multiplies the current token);
    //   cache [B,W-1,C]: the W-1 inputs before t = 0 (NULL = zeros)
    void (*conv_silu_fwd)(real *out, const real *inp, const real *w, const real *cache,
                          int B, int T, int C, int W);
    // dinp accumulates (assign: written, its contents on entry do not matter); dw accumulates
    void (*conv_silu_bwd)(real *dinp, real *dw, const real *dout, const real *inp, const real *w,
                          const real *cache, int B, int T, int C, int W, int assign);
    // cache ← the last W-1 inputs of [cache ++ inp] per sequence (for decode after prefill)
    void (*conv_cache_update)(real *cache, const real *inp, int B, int T, int C, int W);
    // one token of n ≤ 3 convs at once (a KDA layer's q, k, v; W ≥ 2): for j < n, conv_silu_fwd
    //   of inp[j] [B, C[j]] with cache[j] (T = 1) into out[j], then conv_cache_update of cache[j]
    void (*conv_step)(real *const *out, const real *const *inp, const real *const *w, real *const *cache,
                      const int *C, int n, int B, int W);

    // ---- KDA (see lm_kda_args) ----
    void (*kda_fwd)(const lm_kda_args *a);
    void (*kda_bwd)(const lm_kda_args *a);       // recomputes what it needs, unless a->saved
    void (*kda_decode)(const lm_kda_args *a);    // T = 1 step on a->state[a->slots[b]]
    // bytes of lm_kda_args.saved for a B × T batch (0: the backend always recomputes)
    size_t (*kda_saved_bytes)(int B, int T, int H, int K, int V);

    // ---- MLA ----
    // per-head keys and values from the up-projected latent and the shared extra dims:
    //   kv [N, H, Dn+Dv] (kv_b_proj output), kpe [N, De];
    //   k [N, H, Dn+De] = [kv[..., :Dn], kpe], v [N, H, Dv] = kv[..., Dn:]
    void (*mla_split_fwd)(real *k, real *v, const real *kv, const real *kpe, int N, int H, int Dn, int De, int Dv);
    // dkv, dkpe accumulate (assign: written whole, zeros where dk or dv is NULL)
    void (*mla_split_bwd)(real *dkv, real *dkpe, const real *dk, const real *dv, int N, int H, int Dn, int De, int Dv,
                          int assign);
    // causal softmax attention without positions, blockwise with online softmax:
    //   q, k [B,T,H,Dqk], v [B,T,H,Dv], o [B,T,H,Dv]; lse [B,H,T] saved for backward
    //   o_t = Σ_{s≤t} softmax_s(scale·q_t·k_s) v_s per (b,h); lse_t = log Σ_{s≤t} exp(scale·q_t·k_s).
    //   Backward recomputes the probabilities from lse (no T×T matrix is stored) and
    //   accumulates dq, dk [B,T,H,Dqk], dv [B,T,H,Dv] (any may be NULL; assign: written, their
    //   contents on entry do not matter).
    void (*attn_fwd)(real *o, real *lse, const real *q, const real *k, const real *v,
                     int B, int T, int H, int Dqk, int Dv, real scale);
    void (*attn_bwd)(real *dq, real *dk, real *dv, const real *d_o, const real *q, const real *k,
                     const real *v, const real *o, const real *lse, int B, int T, int H, int Dqk, int Dv, real scale,
                     int assign);
    // The MLA core with q, k, v kept in the attention kernels' own precision from the forward to
    // the backward (training; NULL entries where a backend has no such form — the CPU — and then
    // the model calls the ops above). The results equal theirs bit for bit.
    //   attn_lo_bytes: bytes of such a copy ("lo") of q, k [B·T, H·Dqk] and v [B·T, H·Dv]; 0: none
    //     at these dims.
    //   mla_split_fwd_lo: mla_split_fwd (N = B·T, Dqk = Dn + De), k and v also written into lo;
    //   attn_fwd_lo: attn_fwd on q (rounded into lo here) and lo's k, v;
    //   attn_bwd_lo: attn_bwd on lo's q, k, v (as attn_fwd_lo left them);
    //   mla_split_bwd_lo: mla_split_bwd with assign, dkv written in the linears' GEMM precision into
    //     dkv_lo (linears_lo_bytes(N, H·(Dn+Dv)) bytes, for kv_b's backward as lm_linears.dout_lo).
    size_t (*attn_lo_bytes)(int B, int T, int H, int Dqk, int Dv);
    void (*mla_split_fwd_lo)(real *k, real *v, void *lo, const real *kv, const real *kpe, int B, int T, int H, int Dn,
                             int De, int Dv);
    void (*attn_fwd_lo)(real *o, real *lse, const real *q, void *lo, int B, int T, int H, int Dqk, int Dv, real scale);
    void (*attn_bwd_lo)(real *dq, real *dk, real *dv, const real *d_o, const void *lo, const real *o, const real *lse,
                        int B, int T, int H, int Dqk, int Dv, real scale, int assign);
    void (*mla_split_bwd_lo)(void *dkv_lo, real *dkpe, const real *dk, const real *dv, int N, int H, int Dn, int De,
                             int Dv);
    // the same forward for T queries that follow P earlier positions (chunked prefill over a
    // cache; inference only): q, o [B,T,H,·]; k, v [B,P+T,H,·]; query t is position P + t and
    // sees keys 0..P+t. P = 0 equals attn_fwd.
    void (*attn_prefix_fwd)(real *o, const real *q, const real *k, const real *v, int B, int T, int P, int H,
                            int Dqk, int Dv, real scale);
    // per-head maximum over all sequences of the causal logits scale·q_t·k_s (s ≤ t):
    //   out [H] in HOST memory (consumed by QK-Clip after the optimizer step); q, k as attn_fwd
    void (*attn_max_logit)(real *out_host, const real *q, const real *k, int B, int T, int H, int Dqk, real scale);
    // decode in the absorbed form over the latent cache (inference only, no backward).
    // With kv_b_proj weight W_kvb [H·(Dn+Dv), R] (kv = c·W_kvbᵀ), head h's rows
    // h·(Dn+Dv) … +Dn are W_uk_h [Dn,R] and the next Dv rows are W_uv_h [Dv,R]; since NoPE
    // k_h = [W_uk_h c, kpe], q_h·k_h = (W_uk_hᵀ q_nope_h)·c + q_pe_h·kpe. So per step:
    //   q_lat = head_matmul(q_nope [B,H,Dn], W_kvb, C=Dn, OC=R, stride (Dn+Dv)·R, transpose=1)
    //   mla_decode(o_lat, q_lat, q_pe, c_cache, kpe_cache, lens, ...)
    //   o     = head_matmul(o_lat [B,H,R], W_kvb + Dn·R, C=R, OC=Dv, stride (Dn+Dv)·R, transpose=0)
    // which equals attn_fwd over k, v from mla_split (kv = c·W_kvbᵀ), at the last position.
    //
    // head_matmul: out [N,H,OC] (overwritten); inp [N,H,C]; head h uses the row-major slice
    //   W_h = W + h·w_head_stride: transpose = 0: W_h [OC,C], out[:,h] = inp[:,h]·W_hᵀ;
    //                              transpose = 1: W_h [C,OC], out[:,h] = inp[:,h]·W_h.
    void (*head_matmul)(real *out, const real *inp, const real *W, int N, int H, int C, int OC,
                        long w_head_stride, int transpose);
    // mla_decode, per sequence b and head h, over the lens[b] valid cached tokens (the current
    //   token included, written to the cache by the caller first; 0 ≤ lens[b] ≤ Tmax, 0 gives o_lat = 0):
    //   score_t = scale·(q_lat·c_t + q_pe·kpe_t),  o_lat = Σ_{t<lens[b]} softmax_t(score) c_t
    //   o_lat, q_lat [B,H,R]; q_pe [B,H,De]; c_cache [B,Tmax,R] (latents after the latent RMSNorm);
    //   kpe_cache [B,Tmax,De]; lens [B] int32 in backend memory; scale = (Dn+De)^-1/2 as in training;
    //   bf16: the caches hold bf16 values (row stride R, De elements; see mla_cache_bf16)
    void (*mla_decode)(real *o_lat, const real *q_lat, const real *q_pe, const real *c_cache,
                       const real *kpe_cache, const int *lens, int B, int H, int R, int De, int Tmax, real scale,
                       int bf16);
    // appends T rows per sequence to a cache [B, Tmax, W]: rows lens[b] − T … lens[b] − 1 of
    //   sequence b ← x [B, T, W]; lens [B] int32 in backend memory already counting them (read
    //   by the device, so that a recorded decode step appends where the cache ends when replayed);
    //   bf16: the cache holds bf16 (x's values rounded to nearest even), W elements a row
    void (*cache_append)(real *cache, const real *x, const int *lens, int B, int T, int W, int Tmax, int bf16);
    // dst [rows, W] (fp32) ← rows 0 … rows − 1 of sequence b of a cache [B, Tmax, W] (bf16 as above)
    void (*cache_rows)(real *dst, const real *cache, int b, int rows, int W, int Tmax, int bf16);
    // optional (NULL: never): 1 when the backend keeps an MLA latent cache of these dims (H heads,
    //   rank R, extra key dims De) in bf16 — half the bytes its decode reads; lm_cache asks once
    int (*mla_cache_bf16)(int H, int R, int De);

    // ---- MoE ----
    // router: s = sigmoid(z), z [N,E] router logits; selection = top-(k+1) of s + bias
    //   (ties broken by the lower expert index); idx [N,k] the first k in descending
    //   order; gate [N,k] = route_scale · s / Σ_selected s (renorm) or route_scale · s;
    //   alpha [N] = the (k+1)-th largest biased score (the QB cutoff; when k == E, the
    //   k-th biased score − 1), s [N,E] saved.
    //   The bias decides selection only and never enters gate values or gradients.
    void (*moe_route_fwd)(int *idx, real *gate, real *s, real *alpha, const real *z, const real *bias,
                          int N, int E, int k, real route_scale, int renorm);
    void (*moe_route_bwd)(real *dz, const real *dgate, const real *s, const int *idx,
                          int N, int E, int k, real route_scale, int renorm);
    // dispatch plan, rows grouped by expert and, inside an expert, by token index:
    //   counts [E] assignments routed to each expert (before any dropping);
    //   offsets [E+1] row ranges after dropping (offsets[E] = rows used, ≤ N·k);
    //   row_token [N·k] source token of each used row (−1 past offsets[E]);
    //   slot_row [N·k] row of (token, slot), −1 if dropped.
    //   capacity < 0: dropless; else each expert keeps its `capacity` highest-s tokens
    //   (ties: lower token index).
    void (*moe_plan)(int *counts, int *offsets, int *row_token, int *slot_row, const int *idx,
                     const real *s, int N, int E, int k, int capacity);
    // xp[r] = x[row_token[r]] for r < rows (rows read from offsets[E]); bwd: dx[row_token[r]] += dxp[r].
    // R: rows allocated in row_token/dxp (N·k, ≥ offsets[E]; row_token is −1 past offsets[E]),
    // so a backend can size its work without reading offsets[E] back to the host
    void (*moe_gather_fwd)(real *xp, const real *x, const int *row_token, const int *offsets, int E, int C);
    void (*moe_gather_bwd)(real *dx, const real *dxp, const int *row_token, const int *offsets, int E, int C, int R);
    // grouped GEMM: rows [offsets[e], offsets[e+1]) of inp [R,C] times W[e]ᵀ, W [E, OC, C] → out [R, OC].
    // Offsets are read from backend memory (no host round trip). R: rows allocated in inp/out
    // (≥ offsets[E]; the CPU checks it, the CUDA backend cannot without reading offsets back:
    // it rounds and copies rows < R only).
    void (*grouped_matmul_fwd)(real *out, const real *inp, const real *W, const int *offsets, int E, int C, int OC,
                               int R);
    void (*grouped_matmul_bwd)(real *dinp, real *dW, const real *dout, const real *inp, const real *W,
                               const int *offsets, int E, int C, int OC, int R);
    // two grouped GEMMs of one input (the experts' gate and up projections): out1 = inp·W1[e]ᵀ,
    // out2 = inp·W2[e]ᵀ; bwd: dinp += dout1·W1[e] + dout2·W2[e], dW1 += dout1ᵀ·inp,
    // dW2 += dout2ᵀ·inp. The same results as two single calls (a backend may share work:
    // the CUDA one rounds inp to bf16 once)
    void (*grouped_matmul2_fwd)(real *out1, real *out2, const real *inp, const real *W1, const real *W2,
                                const int *offsets, int E, int C, int OC, int R);
    void (*grouped_matmul2_bwd)(real *dinp, real *dW1, real *dW2, const real *dout1, const real *dout2,
                                const real *inp, const real *W1, const real *W2, const int *offsets, int E, int C,
                                int OC, int R);
    // combine: y[i] += Σ_slot gate[i,slot] · yp[slot_row[i,slot]] (dropped slots add nothing)
    void (*moe_combine_fwd)(real *y, const real *yp, const real *gate, const int *slot_row, int N, int k, int C);
    void (*moe_combine_bwd)(real *dyp, real *dgate, const real *dy, const real *yp, const real *gate,
                            const int *slot_row, int N, int k, int C);
    // the routed experts as one op: gather, the three grouped GEMMs with the GLU, combine
    // (lm_experts above). fwd: y [N, C] += the routed sum for x [N, C]. bwd: dx [N, C] +=,
    // the parameter and gate gradients +=, from dy [N, C]. The CPU runs the ops above in turn
    // (ops_experts.h); the CUDA backend does the same in its fp32 modes
    void (*moe_experts_fwd)(const lm_experts *ex, real *y, const real *x);
    void (*moe_experts_bwd)(const lm_experts *ex, const lm_experts_grads *g, real *dx, const real *dy);
    // QB statistics: hist [E, nbins] += counts of r_ij = alpha_i − s_ij in bins of width
    //   `width` starting at `lo` (values outside go to the end bins)
    void (*qb_hist_accum)(int *hist, const real *s, const real *alpha, real lo, real width,
                          int N, int E, int nbins);
    // the QB update's search, per expert j: the first bin h of row hist[j] whose cumulative
    //   count reaches target (≥ 1); sel [E, 3] = (h, count before h, hist[j, h]), or
    //   (nbins, row total, 0) when the row holds fewer than target. Exact integer arithmetic:
    //   only these 3·E ints travel to the host, not the histogram
    void (*qb_hist_select)(int *sel, const int *hist, int E, int nbins, int target);
    // auxiliary balance loss (Switch style) a·E·Σ_j f_j P_j with f_j = counts_j/(N·k),
    //   P_j = mean_i s_ij / Σ_l s_il; returns the loss; bwd: dz += dloss · ∂loss/∂z
    double (*moe_aux_fwd)(const real *s, const int *counts, int N, int E, int k, real coef);
    void (*moe_aux_bwd)(real *dz, const real *s, const int *counts, int N, int E, int k, real coef, real dloss);
    // router z-loss coef · mean_i (logsumexp_j z_ij)²; bwd: dz += dloss · ∂loss/∂z
    double (*moe_zloss_fwd)(const real *z, int N, int E, real coef);
    void (*moe_zloss_bwd)(real *dz, const real *z, int N, int E, real coef, real dloss);

    // ---- Block AttnRes mixer (SPEC §1.4), per token over sources u_0..u_{n-1} [N,C]:
    //   s_j = ((γ⊙w) · u_j) · (mean(u_j²) + eps)^-1/2, α = softmax_j(s), out = Σ α_j u_j;
    //   alpha [N, n] saved. n = 1 is the identity.
    void (*attnres_fwd)(real *out, real *alpha, lm_sources src, const real *w, const real *gamma,
                        int N, int C, real eps);
    void (*attnres_bwd)(lm_source_grads dsrc, real *dw, real *dgamma, const real *dout, lm_sources src,
                        const real *alpha, const real *w, const real *gamma, int N, int C, real eps);
    // The mixer fused with the RMSNorm that reads its output (the next sublayer's input norm,
    //   or the final norm; SPEC §1.4's fused mixer): xn = RMSNorm(attnres(src)) ⊙ gain [N,C],
    //   rstd [N], alpha [N,n] as attnres_fwd's, lo as rmsnorm_fwd's (xn NULL as its out). x [N,C] is the backend's:
    //   it may hold the mix there for its backward, or nothing (a fused kernel recomputes the
    //   mix from the sources and α); the caller keeps it unchanged until that backward.
    void (*attnres_norm_fwd)(real *xn, real *rstd, void *lo, real *alpha, real *x, lm_sources src,
                             const real *w, const real *gamma, const real *gain, int N, int C, real eps);
    //   bwd from dxn [N,C]: dgain [C] += (NULL allowed), then dsrc, dw, dgamma as attnres_bwd's.
    //   dx [N,C]: the backend's scratch for the mix's gradient (its contents on entry do not matter)
    void (*attnres_norm_bwd)(lm_source_grads dsrc, real *dw, real *dgamma, real *dgain, real *dx,
                             const real *dxn, const real *x, lm_sources src, const real *alpha, const real *rstd,
                             const real *w, const real *gamma, const real *gain, int N, int C, real eps);

    // ---- loss: softmax cross-entropy, logits [N,V], targets [N] (< 0 = ignored) ----
    //   losses [N] (0 where ignored), lse [N] saved
    void (*xent_fwd)(real *losses, real *lse, const real *logits, const int *targets, int N, int V);
    //   dlogits += dloss · (softmax − onehot) on counted rows
    void (*xent_bwd)(real *dlogits, const real *logits, const real *lse, const int *targets,
                     real dloss, int N, int V);

    // ---- optimiser ----
    // AdamW with decoupled weight decay on the gradient gscale·g (gscale: the clipping
    // factor, folded in so that clipping needs no pass of its own); bc1 = 1 − β1^t, bc2 = 1 − β2^t;
    // over the spans of the arenas p, g, m, v — an optimizer step is one call (the CUDA backend
    // updates up to 64 tensors a launch: a step of the `small` preset was 417 launches)
    void (*adamw)(real *p, const real *g, real *m, real *v, const lm_adamw_span *spans, int nspans, real lr,
                  real b1, real b2, real eps, real bc1, real bc2, real gscale);
    // Muon on `count` stacked matrices [rows, cols]: m = μm + g; u = g + μm (Nesterov);
    //   O = NewtonSchulz5(u); p ← p − lr·(0.2·sqrt(max(rows,cols))·O + wd·p)
    void (*muon)(real *p, const real *g, real *m, int count, int rows, int cols, real lr, real mu, real wd);

    // ---- recording (optional: NULL on a backend that runs every op as it is called) ----
    // graph_begin: the ops called until graph_end are recorded, not run; graph_end returns a
    // replayable handle, or NULL when the recording was spoiled (an op needed to allocate, or
    // to remake a cached weight copy, while recording: run the same ops again as they come).
    // graph_run queues the recorded work again: the same kernels on the same memory with the
    // same arguments (only the contents of memory may differ), valid while graph_epoch() is
    // the value it had at graph_end (every allocation, free and weight-copy change bumps it).
    // No op may read back to the host while recording.
    void (*graph_begin)(void);
    void *(*graph_end)(void);
    void (*graph_run)(void *graph);
    void (*graph_free)(void *graph);
    unsigned long (*graph_epoch)(void);

    // ---- profiling (optional: NULL where nothing can listen) ----
    // on = 1 / 0 opens / closes a region for a profiler started with collection off (CUDA:
    // cudaProfilerStart / Stop, for `ncu --profile-from-start off`)
    void (*profile_range)(int on);
} lm_ops;

extern const lm_ops lm_cpu_ops;
#ifdef LM_CUDA
extern const lm_ops lm_cuda_ops;
#endif

#endif
