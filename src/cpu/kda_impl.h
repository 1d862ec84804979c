// kda_impl.h — pieces shared by the CPU KDA files (kda.c: forward dispatch, naive
// recurrence and decode; kda_chunk.c: the chunkwise forms; kda_bwd.c: the backward).
// Internal to the CPU backend. Everything here works on one (sequence b, head h) at a
// time: the op parallelises over (b, h), whose states and outputs are independent.
#ifndef LM_CPU_KDA_IMPL_H
#define LM_CPU_KDA_IMPL_H
#include "cpu.h"

#if defined(__x86_64__) || defined(__SSE__)
#include <xmmintrin.h>
#endif

#define KDA_L2_EPS 1e-6   // inside the sqrt of the q/k L2 norm
#define KDA_SUB 16        // sub-chunk length of the chunked forms

// Subnormal numbers are flushed to zero (MXCSR FTZ + DAZ) while a thread runs the KDA
// core, and the mode is restored afterwards. Decay products e^{G} go far below the
// normal range (a 64-token chunk at g ≈ −2.5 reaches e^{−160}; fp32 goes subnormal
// below e^{−87}), and on x86 every operation with a subnormal operand or result costs
// ~100 cycles: without this the fp32 chunked forward runs several times slower. Only
// values below 1.2e-38 (fp32) / 2.2e-308 (fp64) change; the factored diagonal blocks
// keep every factor within e^{±42.5} (kda_chunk.c), so whatever is flushed weighs less
// than ~1e-21 of a unit term. Overflow (the unbounded-gate hazard) is unaffected.
static inline unsigned kda_fpmode_enter(void) {
#if defined(__x86_64__) || defined(__SSE__)
    unsigned old = _mm_getcsr();
    _mm_setcsr(old | 0x8040u);   // FTZ (bit 15) | DAZ (bit 6)
    return old;
#else
    return 0;
#endif
}
static inline void kda_fpmode_leave(unsigned old) {
#if defined(__x86_64__) || defined(__SSE__)
    _mm_setcsr(old);
#else
    (void)old;
#endif
}

// a·b + c with one rounding where the target has FMA (twice the multiply-add
// throughput); the plain expression elsewhere. Either way the same bits on every run.
#ifdef __FMA__
#define KDA_FMA(a, b, c) fma(a, b, c)
#else
#define KDA_FMA(a, b, c) ((a) * (b) + (c))
#endif

// the conv of lm_kda_args.conv_W (kda.c): runs it into qkv_out when run_conv and returns the
// arguments of the op on those q, k, v without the conv
lm_kda_args kda_conv_inputs(const lm_kda_args *a, int run_conv);

// row index of (b, t, h) in the [B,T,H,·] input tensors
static inline size_t kda_row(const lm_kda_args *a, int b, int t, int h) {
    return ((size_t)b * a->T + t) * a->H + h;
}

// Σ x·y over n elements with 16 independent lanes summed in a fixed order: vectorises
// without an OpenMP float reduction and gives the same bits on every run.
static inline real kda_dot(const real *x, const real *y, int n) {
    real acc[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        #pragma omp simd
        for (int l = 0; l < 16; l++) acc[l] = KDA_FMA(x[i + l], y[i + l], acc[l]);
    }
    for (int l = 0; l < 8; l++) acc[l] += acc[l + 8];
    real s = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    for (; i < n; i++) s = KDA_FMA(x[i], y[i], s);
    return s;
}

// y[n] += c · x[n]
static inline void kda_axpy(real *y, real c, const real *x, int n) {
    #pragma omp simd
    for (int i = 0; i < n; i++) y[i] = KDA_FMA(c, x[i], y[i]);
}

// The gate of one channel from x = f + dt_bias[h,c] and eA = exp(A_log[h]):
//   bounded   g = lb · σ(eA · x)          ∈ (lb, 0)
//   unbounded g = −eA · softplus(x)       ∈ (−∞, 0)
static inline real kda_gate(int mode, real lb, real eA, real x) {
    return mode == LM_GATE_BOUNDED ? lb * lm_sigmoid(eA * x) : -eA * lm_softplus(x);
}

// One token of one head, ready for the core: q̂ = scale·q/‖q‖, k̂ = k/‖k‖ with
// ‖x‖ = sqrt(Σx² + 1e-6); the gate g and α = e^g per channel; β = σ(beta_logit).
// rq, rk (the reciprocal norms) are kept for the backward. qh, kh, g, al [K]
typedef struct { real beta, rq, rk; } kda_tok;
static inline kda_tok kda_prep(const lm_kda_args *a, int b, int t, int h, real *qh, real *kh, real *g, real *al) {
    int K = a->K;
    size_t row = kda_row(a, b, t, h);
    const real *q = a->q + row * K, *k = a->k + row * K, *f = a->f + row * K;
    const real *db = a->dt_bias + (size_t)h * K;
    kda_tok tk;
    tk.rq = 1 / sqrt(kda_dot(q, q, K) + (real)KDA_L2_EPS);
    tk.rk = 1 / sqrt(kda_dot(k, k, K) + (real)KDA_L2_EPS);
    tk.beta = lm_sigmoid(a->beta_logit[row]);
    real sq = a->scale * tk.rq, eA = exp(a->A_log[h]);
    for (int c = 0; c < K; c++) {
        qh[c] = q[c] * sq;
        kh[c] = k[c] * tk.rk;
        real gc = kda_gate(a->gate_mode, a->lb, eA, f[c] + db[c]);
        if (g) g[c] = gc;
        al[c] = exp(gc);
    }
    return tk;
}

// Dies with a clear message on a bad shape, gate mode, lower bound or form.
void kda_check_args(const lm_kda_args *a);

// One step of the recurrence on S [K,V] (the definition of the op):
//   S ← Diag(α) S;  r = v − Sᵀk;  S ← S + β k rᵀ;  o = Sᵀq̂
// Snew may equal S (in place). r [V] receives the unscaled residual when non-NULL
// (the backward keeps it); o [V] may be NULL; p [V] is scratch.
void kda_step(real *Snew, const real *S, const real *qh, const real *kh, const real *al, real beta,
              const real *v, real *o, real *r, real *p, int K, int V);

// The chunked forms over the T tokens of one (b, h): S [K,V] is the incoming state on
// entry and the final state on return; writes a->o rows of this (b, h), or, when ckpt
// is given, no outputs but the state entering each chunk c at ckpt + c·K·V.
// factored = 1: diagonal 16×16 blocks as products of e^{+(G−anchor)} and e^{−(G−anchor)}
// factored = 0: diagonal blocks per position with the exact decay between the two tokens
typedef struct kda_chunk_ws kda_chunk_ws;
kda_chunk_ws *kda_chunk_ws_new(int C, int K, int V);
void kda_chunk_ws_free(kda_chunk_ws *w);
void kda_chunk_seq(const lm_kda_args *a, int b, int h, real *S, int factored, kda_chunk_ws *w, real *ckpt);

// The form that runs: AUTO = factored diagonal blocks for the bounded gate (safe: 16
// steps of g ≥ −5 span ≤ 80 nats), exact per-position blocks otherwise.
static inline int kda_resolve_form(const lm_kda_args *a) {
    if (a->form != LM_KDA_AUTO) return a->form;
    return a->gate_mode == LM_GATE_BOUNDED ? LM_KDA_CHUNK_FACTORED : LM_KDA_CHUNK_EXACT;
}

#endif
