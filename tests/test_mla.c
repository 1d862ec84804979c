// test_mla.c — the MLA attention core: mla_split, blockwise causal softmax attention
// (forward against a materialised O(T²) reference, causality, online-softmax stability,
// finite-difference and reference gradients, thread-count determinism) and the absorbed
// decode over the latent cache against the non-absorbed path.
#include "harness.h"
#include "cpu/cpu.h"
#include <omp.h>

static const lm_ops *ops = &lm_cpu_ops;

// ---------------------------------------------------------------------------
// materialised reference, in double from the same (real) inputs:
// o [B,T,H,Dv], lse [B,H,T]; every row's scores are formed in full, then a max-shifted softmax
static void ref_attn(double *o, double *lse, const real *q, const real *k, const real *v,
                     int B, int T, int H, int Dqk, int Dv, double scale) {
    double *sc = malloc(sizeof(double) * (size_t)T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                const real *qt = q + (((size_t)b * T + t) * H + h) * Dqk;
                double mx = -INFINITY;
                for (int s = 0; s <= t; s++) {
                    const real *ks = k + (((size_t)b * T + s) * H + h) * Dqk;
                    double d = 0;
                    for (int c = 0; c < Dqk; c++) d += (double)qt[c] * ks[c];
                    sc[s] = scale * d;
                    mx = tu_worst(mx, sc[s]);
                }
                double l = 0;
                for (int s = 0; s <= t; s++) l += exp(sc[s] - mx);
                double *ot = o + (((size_t)b * T + t) * H + h) * Dv;
                for (int c = 0; c < Dv; c++) ot[c] = 0;
                for (int s = 0; s <= t; s++) {
                    double p = exp(sc[s] - mx) / l;
                    const real *vs = v + (((size_t)b * T + s) * H + h) * Dv;
                    for (int c = 0; c < Dv; c++) ot[c] += p * vs[c];
                }
                lse[((size_t)b * H + h) * T + t] = mx + log(l);
            }
    free(sc);
}

// materialised reference backward (plain softmax Jacobian, no D_t shortcut):
//   dv_s = Σ_t P_ts do_t;  dP_ts = do_t·v_s;  dS_ts = P_ts (dP_ts − Σ_u P_tu dP_tu);
//   dq_t = scale Σ_s dS_ts k_s;  dk_s = scale Σ_t dS_ts q_t      (outputs overwritten)
static void ref_attn_bwd(double *dq, double *dk, double *dv, const real *d_o, const real *q, const real *k,
                         const real *v, int B, int T, int H, int Dqk, int Dv, double scale) {
    memset(dq, 0, sizeof(double) * (size_t)B * T * H * Dqk);
    memset(dk, 0, sizeof(double) * (size_t)B * T * H * Dqk);
    memset(dv, 0, sizeof(double) * (size_t)B * T * H * Dv);
    double *P = malloc(sizeof(double) * (size_t)T), *dP = malloc(sizeof(double) * (size_t)T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++) {
                size_t it = ((size_t)b * T + t) * H + h;
                double mx = -INFINITY;
                for (int s = 0; s <= t; s++) {
                    size_t is = ((size_t)b * T + s) * H + h;
                    double d = 0;
                    for (int c = 0; c < Dqk; c++) d += (double)q[it * Dqk + c] * k[is * Dqk + c];
                    P[s] = scale * d;
                    mx = tu_worst(mx, P[s]);
                }
                double l = 0, corr = 0;
                for (int s = 0; s <= t; s++) l += (P[s] = exp(P[s] - mx));
                for (int s = 0; s <= t; s++) {
                    size_t is = ((size_t)b * T + s) * H + h;
                    P[s] /= l;
                    double d = 0;
                    for (int c = 0; c < Dv; c++) d += (double)d_o[it * Dv + c] * v[is * Dv + c];
                    dP[s] = d;
                    corr += P[s] * d;
                    for (int c = 0; c < Dv; c++) dv[is * Dv + c] += P[s] * d_o[it * Dv + c];
                }
                for (int s = 0; s <= t; s++) {
                    size_t is = ((size_t)b * T + s) * H + h;
                    double ds = scale * P[s] * (dP[s] - corr);
                    for (int c = 0; c < Dqk; c++) {
                        dq[it * Dqk + c] += ds * k[is * Dqk + c];
                        dk[is * Dqk + c] += ds * q[it * Dqk + c];
                    }
                }
            }
    free(P); free(dP);
}

static double max_abs_vs_ref(const real *x, const double *ref, size_t n, double *max_ref) {
    double m = 0, mr = 0;
    if (max_ref) *max_ref = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)x[i] - ref[i]);
        if (d != d) return INFINITY;
        m = tu_worst(m, d);
        mr = tu_worst(mr, fabs(ref[i]));
    }
    if (max_ref) *max_ref = mr;
    return m;
}

static double rel_rms_vs_ref(const real *x, const double *ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)x[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    return num != num ? INFINITY : sqrt(num / den);
}

// ---------------------------------------------------------------------------
// forward against the materialised reference, T on and across block boundaries (64)
static void test_attn_fwd_vs_reference(void **state) {
    (void)state;
    const int Ts[] = {1, 5, 64, 65, 200};
    const int B = 2, H = 3, Dqk = 20, Dv = 12;
    const real scale = (real)(1 / sqrt((double)Dqk));
    double worst_o = 0, worst_lse = 0;
    for (int it = 0; it < 5; it++) {
        int T = Ts[it];
        lm_rng r; lm_rng_seed(&r, 100 + T);
        size_t nq = (size_t)B * T * H * Dqk, nv = (size_t)B * T * H * Dv, nl = (size_t)B * H * T;
        real *q = tu_randn(nq, &r, 1.5), *k = tu_randn(nq, &r, 1.5), *v = tu_randn(nv, &r, 1);
        real *o = tu_alloc(nv), *lse = tu_alloc(nl);
        double *oref = malloc(sizeof(double) * nv), *lref = malloc(sizeof(double) * nl);
        ops->attn_fwd(o, lse, q, k, v, B, T, H, Dqk, Dv, scale);
        ref_attn(oref, lref, q, k, v, B, T, H, Dqk, Dv, scale);
        double mo = 0, ml = 0;
        double eo = max_abs_vs_ref(o, oref, nv, &mo), el = max_abs_vs_ref(lse, lref, nl, &ml);
        // f64: absolute; f32: relative to the largest reference value
        worst_o = tu_worst(worst_o, eo / TOL(1, mo));
        worst_lse = tu_worst(worst_lse, el / TOL(1, ml));
        if (T == 1) {
            // one key: softmax weight exactly 1, o = v bit for bit
            tu_check("attn T=1: o == v (exact)", tu_max_abs_diff(o, v, nv), 0);
        }
        free(q); free(k); free(v); free(o); free(lse); free(oref); free(lref);
    }
    tu_check(TOL("attn fwd o vs materialised, T in {1,5,64,65,200}: max abs diff",
                 "attn fwd o vs materialised, T in {1,5,64,65,200}: max abs diff / max|o|"),
             worst_o, TOL(1e-12, 1e-5));
    tu_check(TOL("attn fwd lse vs materialised: max abs diff", "attn fwd lse vs materialised: max abs diff / max|lse|"),
             worst_lse, TOL(1e-12, 1e-5));
}

// all keys of a head equal ⇒ uniform weights: o_t = mean_{s≤t} v_s, lse_t = scale·q_t·k + log(t+1)
static void test_attn_equal_keys(void **state) {
    (void)state;
    const int B = 1, T = 150, H = 2, Dqk = 8, Dv = 5;
    const real scale = (real)0.7;
    lm_rng r; lm_rng_seed(&r, 5);
    size_t nq = (size_t)B * T * H * Dqk, nv = (size_t)B * T * H * Dv;
    real *q = tu_randn(nq, &r, 1), *k = tu_alloc(nq), *v = tu_randn(nv, &r, 1);
    real *kh = tu_randn((size_t)H * Dqk, &r, 1);
    for (int t = 0; t < T; t++) memcpy(k + (size_t)t * H * Dqk, kh, sizeof(real) * H * Dqk);
    real *o = tu_alloc(nv), *lse = tu_alloc((size_t)H * T);
    ops->attn_fwd(o, lse, q, k, v, B, T, H, Dqk, Dv, scale);
    double eo = 0, el = 0;
    for (int h = 0; h < H; h++)
        for (int t = 0; t < T; t++) {
            for (int c = 0; c < Dv; c++) {
                double m = 0;
                for (int s = 0; s <= t; s++) m += v[((size_t)s * H + h) * Dv + c];
                eo = tu_worst(eo, fabs(m / (t + 1) - o[((size_t)t * H + h) * Dv + c]));
            }
            double d = 0;
            for (int c = 0; c < Dqk; c++) d += (double)q[((size_t)t * H + h) * Dqk + c] * kh[h * Dqk + c];
            el = tu_worst(el, fabs(scale * d + log(t + 1.0) - lse[(size_t)h * T + t]));
        }
    tu_check("attn equal keys: o = prefix mean of v, max abs diff", eo, TOL(1e-13, 2e-6));
    tu_check("attn equal keys: lse = s + log(t+1), max abs diff", el, TOL(1e-13, 2e-6));
    free(q); free(k); free(v); free(kh); free(o); free(lse);
}

// the chunked-prefill form: T queries after P cached positions (k, v hold P + T per sequence)
// equal the last T rows of full causal attention over P + T, bit for bit (the same key
// blocks, the same operations per row); P not a multiple of the block, T spanning blocks
static void test_attn_prefix(void **state) {
    (void)state;
    const int B = 2, P = 83, T = 70, H = 3, Dqk = 10, Dv = 6, L = P + T;
    const real scale = (real)0.4;
    lm_rng r; lm_rng_seed(&r, 9);
    size_t nq = (size_t)B * L * H * Dqk, nv = (size_t)B * L * H * Dv;
    real *q = tu_randn(nq, &r, 1.5), *k = tu_randn(nq, &r, 1.5), *v = tu_randn(nv, &r, 1);
    real *o = tu_alloc(nv), *lse = tu_alloc((size_t)B * H * L);
    ops->attn_fwd(o, lse, q, k, v, B, L, H, Dqk, Dv, scale);
    real *qc = tu_alloc((size_t)B * T * H * Dqk), *oc = tu_alloc((size_t)B * T * H * Dv);
    for (int b = 0; b < B; b++)
        memcpy(qc + (size_t)b * T * H * Dqk, q + ((size_t)b * L + P) * H * Dqk, sizeof(real) * T * H * Dqk);
    ops->attn_prefix_fwd(oc, qc, k, v, B, T, P, H, Dqk, Dv, scale);
    double d = 0;
    for (int b = 0; b < B; b++)
        d = tu_worst(d, tu_max_abs_diff(oc + (size_t)b * T * H * Dv, o + ((size_t)b * L + P) * H * Dv, (size_t)T * H * Dv));
    tu_check("attn prefix (P 83, T 70) == last T rows of attn over P + T (max abs)", d, 0);
    free(q); free(k); free(v); free(o); free(lse); free(qc); free(oc);
}

// changing q, k, v after position t0 leaves o and lse at positions ≤ t0 bit-identical
static void test_attn_causal(void **state) {
    (void)state;
    const int B = 2, T = 150, H = 2, Dqk = 12, Dv = 7, t0 = 70;
    const real scale = (real)0.3;
    lm_rng r; lm_rng_seed(&r, 6);
    size_t nq = (size_t)B * T * H * Dqk, nv = (size_t)B * T * H * Dv, nl = (size_t)B * H * T;
    real *q = tu_randn(nq, &r, 1), *k = tu_randn(nq, &r, 1), *v = tu_randn(nv, &r, 1);
    real *o1 = tu_alloc(nv), *l1 = tu_alloc(nl), *o2 = tu_alloc(nv), *l2 = tu_alloc(nl);
    ops->attn_fwd(o1, l1, q, k, v, B, T, H, Dqk, Dv, scale);
    for (int b = 0; b < B; b++)
        for (int t = t0 + 1; t < T; t++) {
            for (int i = 0; i < H * Dqk; i++) {
                q[((size_t)b * T + t) * H * Dqk + i] = (real)(3 * lm_rng_normal(&r));
                k[((size_t)b * T + t) * H * Dqk + i] = (real)(3 * lm_rng_normal(&r));
            }
            for (int i = 0; i < H * Dv; i++) v[((size_t)b * T + t) * H * Dv + i] = (real)(3 * lm_rng_normal(&r));
        }
    ops->attn_fwd(o2, l2, q, k, v, B, T, H, Dqk, Dv, scale);
    double before = 0, after = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            size_t at = ((size_t)b * T + t) * H * Dv;
            double d = tu_max_abs_diff(o1 + at, o2 + at, (size_t)H * Dv);
            for (int h = 0; h < H; h++) d = tu_worst(d, fabs(l1[((size_t)b * H + h) * T + t] - l2[((size_t)b * H + h) * T + t]));
            if (t <= t0) before = tu_worst(before, d);
            else after = tu_worst(after, d);
        }
    tu_check("attn causality: max change of o, lse at t <= t0 (bit-exact)", before, 0);
    // and the perturbation was real: the later outputs did move
    tu_check("attn causality: outputs after t0 changed (1 / max change)", 1 / after, 1e3);
    free(q); free(k); free(v); free(o1); free(l1); free(o2); free(l2);
}

// scores scale·q·k far beyond exp's range in fp32 (|s| > 88): the online softmax stays
// finite and matches the max-shifted reference
static void test_attn_large_scores(void **state) {
    (void)state;
    const int B = 2, T = 130, H = 2, Dqk = 16, Dv = 6;
    const real scale = (real)0.25;
    lm_rng r; lm_rng_seed(&r, 7);
    size_t nq = (size_t)B * T * H * Dqk, nv = (size_t)B * T * H * Dv, nl = (size_t)B * H * T;
    real *q = tu_randn(nq, &r, 6), *k = tu_randn(nq, &r, 6), *v = tu_randn(nv, &r, 1);
    real *o = tu_alloc(nv), *lse = tu_alloc(nl);
    double *oref = malloc(sizeof(double) * nv), *lref = malloc(sizeof(double) * nl);
    ops->attn_fwd(o, lse, q, k, v, B, T, H, Dqk, Dv, scale);
    ref_attn(oref, lref, q, k, v, B, T, H, Dqk, Dv, scale);
    double smax = 0;   // the largest |score| the test reached
    for (size_t i = 0; i < nl; i++) smax = tu_worst(smax, fabs(lref[i]));
    printf("measured [%s] large scores: max |lse| = %.1f (scores beyond fp32 exp range)\n", LM_REAL_NAME, smax);
    assert_true(smax > 90);
    assert_true(ops->all_finite(o, nv) && ops->all_finite(lse, nl));
    double mo = 0, ml = 0;
    double eo = max_abs_vs_ref(o, oref, nv, &mo), el = max_abs_vs_ref(lse, lref, nl, &ml);
    // fp32: the scores themselves carry ~|s|·eps rounding, so the error scales with |s|
    tu_check("attn large scores: o max abs diff / max|o|", eo / mo, TOL(1e-12, 2e-4));
    tu_check("attn large scores: lse max abs diff / max|lse|", el / ml, TOL(1e-14, 1e-6));
    free(q); free(k); free(v); free(o); free(lse); free(oref); free(lref);
}

// ---------------------------------------------------------------------------
// gradients: loss = Σ o ⊙ P
typedef struct { int B, T, H, Dqk, Dv; real scale; real *q, *k, *v, *o, *lse, *P; } at_ctx;
static double at_loss(void *p) {
    at_ctx *c = p;
    ops->attn_fwd(c->o, c->lse, c->q, c->k, c->v, c->B, c->T, c->H, c->Dqk, c->Dv, c->scale);
    return tu_dot(c->o, c->P, (size_t)c->B * c->T * c->H * c->Dv);
}

static void test_attn_grads(void **state) {
    (void)state;
    lm_rng r; lm_rng_seed(&r, 8);
    at_ctx c = {.B = 2, .T = 130, .H = 2, .Dqk = 10, .Dv = 6, .scale = (real)0.45};   // 3 key blocks
    size_t nq = (size_t)c.B * c.T * c.H * c.Dqk, nv = (size_t)c.B * c.T * c.H * c.Dv;
    c.q = tu_randn(nq, &r, 1); c.k = tu_randn(nq, &r, 1); c.v = tu_randn(nv, &r, 1);
    c.o = tu_alloc(nv); c.lse = tu_alloc((size_t)c.B * c.H * c.T); c.P = tu_randn(nv, &r, 1);
    at_loss(&c);
    real *dq = tu_alloc(nq), *dk = tu_alloc(nq), *dv = tu_alloc(nv);
    ops->attn_bwd(dq, dk, dv, c.P, c.q, c.k, c.v, c.o, c.lse, c.B, c.T, c.H, c.Dqk, c.Dv, c.scale, 0);

    // against the materialised reference backward (sharp in both builds)
    double *rq = malloc(sizeof(double) * nq), *rk = malloc(sizeof(double) * nq), *rv = malloc(sizeof(double) * nv);
    ref_attn_bwd(rq, rk, rv, c.P, c.q, c.k, c.v, c.B, c.T, c.H, c.Dqk, c.Dv, c.scale);
    tu_check("attn bwd dq vs materialised (rel rms)", rel_rms_vs_ref(dq, rq, nq), TOL(1e-12, 1e-5));
    tu_check("attn bwd dk vs materialised (rel rms)", rel_rms_vs_ref(dk, rk, nq), TOL(1e-12, 1e-5));
    tu_check("attn bwd dv vs materialised (rel rms)", rel_rms_vs_ref(dv, rv, nv), TOL(1e-12, 1e-5));

    tu_check("attn d_q (FD)", tu_gradcheck(c.q, dq, nq, at_loss, &c, TU_H, 200, &r), TOL(1e-6, 2e-2));
    tu_check("attn d_k (FD)", tu_gradcheck(c.k, dk, nq, at_loss, &c, TU_H, 200, &r), TOL(1e-6, 2e-2));
    tu_check("attn d_v (FD)", tu_gradcheck(c.v, dv, nv, at_loss, &c, TU_H, 200, &r), TOL(1e-6, 2e-2));

    // accumulation, and NULL gradients: a second call with only dk adds the same dk again
    at_loss(&c);
    real *dk2 = tu_copy(dk, nq);
    ops->attn_bwd(NULL, dk2, NULL, c.P, c.q, c.k, c.v, c.o, c.lse, c.B, c.T, c.H, c.Dqk, c.Dv, c.scale, 0);
    for (size_t i = 0; i < nq; i++) dk[i] *= 2;
    tu_check("attn bwd accumulates (dk only, dq = dv = NULL)", tu_rel_rms(dk2, dk, nq), TOL(1e-15, 1e-6));
    real *dv2 = tu_copy(dv, nv);
    ops->attn_bwd(NULL, NULL, dv2, c.P, c.q, c.k, c.v, c.o, c.lse, c.B, c.T, c.H, c.Dqk, c.Dv, c.scale, 0);
    for (size_t i = 0; i < nv; i++) dv[i] *= 2;
    tu_check("attn bwd accumulates (dv only)", tu_rel_rms(dv2, dv, nv), TOL(1e-15, 1e-6));
    free(c.q); free(c.k); free(c.v); free(c.o); free(c.lse); free(c.P);
    free(dq); free(dk); free(dv); free(dk2); free(dv2); free(rq); free(rk); free(rv);
}

// the same forward and backward, bit for bit, with 1 and with 2 threads
static void test_attn_thread_determinism(void **state) {
    (void)state;
    const int B = 2, T = 100, H = 3, Dqk = 12, Dv = 8;
    const real scale = (real)0.3;
    lm_rng r; lm_rng_seed(&r, 9);
    size_t nq = (size_t)B * T * H * Dqk, nv = (size_t)B * T * H * Dv, nl = (size_t)B * H * T;
    real *q = tu_randn(nq, &r, 1), *k = tu_randn(nq, &r, 1), *v = tu_randn(nv, &r, 1), *g = tu_randn(nv, &r, 1);
    real *o[2], *l[2], *dq[2], *dk[2], *dv[2];
    int keep = omp_get_max_threads();
    for (int run = 0; run < 2; run++) {
        omp_set_num_threads(run + 1);
        o[run] = tu_alloc(nv); l[run] = tu_alloc(nl);
        dq[run] = tu_alloc(nq); dk[run] = tu_alloc(nq); dv[run] = tu_alloc(nv);
        ops->attn_fwd(o[run], l[run], q, k, v, B, T, H, Dqk, Dv, scale);
        ops->attn_bwd(dq[run], dk[run], dv[run], g, q, k, v, o[run], l[run], B, T, H, Dqk, Dv, scale, 0);
    }
    omp_set_num_threads(keep);
    double d = tu_worst(tu_max_abs_diff(o[0], o[1], nv), tu_max_abs_diff(l[0], l[1], nl));
    d = tu_worst(d, tu_worst(tu_max_abs_diff(dq[0], dq[1], nq), tu_max_abs_diff(dk[0], dk[1], nq)));
    d = tu_worst(d, tu_max_abs_diff(dv[0], dv[1], nv));
    tu_check("attn fwd+bwd 1 thread vs 2 threads: max abs diff (bit-exact)", d, 0);
    for (int run = 0; run < 2; run++) { free(o[run]); free(l[run]); free(dq[run]); free(dk[run]); free(dv[run]); }
    free(q); free(k); free(v); free(g);
}

// ---------------------------------------------------------------------------
// mla_split: values, then gradients of kv and kpe through attention:
//   loss = Σ attn(q, split(kv, kpe)) ⊙ P, Dqk = Dn + De ≠ Dv
typedef struct {
    int B, T, H, Dn, De, Dv; real scale;
    real *q, *kv, *kpe, *k, *v, *o, *lse, *P;
} sp_ctx;
static double sp_loss(void *p) {
    sp_ctx *c = p;
    int N = c->B * c->T;
    ops->mla_split_fwd(c->k, c->v, c->kv, c->kpe, N, c->H, c->Dn, c->De, c->Dv);
    ops->attn_fwd(c->o, c->lse, c->q, c->k, c->v, c->B, c->T, c->H, c->Dn + c->De, c->Dv, c->scale);
    return tu_dot(c->o, c->P, (size_t)N * c->H * c->Dv);
}

static void test_mla_split(void **state) {
    (void)state;
    lm_rng r; lm_rng_seed(&r, 10);
    sp_ctx c = {.B = 2, .T = 70, .H = 3, .Dn = 6, .De = 4, .Dv = 5};
    int N = c.B * c.T, Dk = c.Dn + c.De;
    c.scale = (real)(1 / sqrt((double)Dk));
    size_t nkv = (size_t)N * c.H * (c.Dn + c.Dv), nk = (size_t)N * c.H * Dk, nv = (size_t)N * c.H * c.Dv;
    c.q = tu_randn(nk, &r, 1.5); c.kv = tu_randn(nkv, &r, 1.5); c.kpe = tu_randn((size_t)N * c.De, &r, 1.5);
    c.k = tu_alloc(nk); c.v = tu_alloc(nv); c.o = tu_alloc(nv); c.lse = tu_alloc((size_t)N * c.H);
    c.P = tu_randn(nv, &r, 1);
    sp_loss(&c);
    // values: an exact copy by definition
    double d = 0;
    for (int n = 0; n < N; n++)
        for (int h = 0; h < c.H; h++) {
            const real *src = c.kv + ((size_t)n * c.H + h) * (c.Dn + c.Dv);
            const real *kr = c.k + ((size_t)n * c.H + h) * Dk, *vr = c.v + ((size_t)n * c.H + h) * c.Dv;
            for (int i = 0; i < c.Dn; i++) d = tu_worst(d, fabs(kr[i] - src[i]));
            for (int i = 0; i < c.De; i++) d = tu_worst(d, fabs(kr[c.Dn + i] - c.kpe[(size_t)n * c.De + i]));
            for (int i = 0; i < c.Dv; i++) d = tu_worst(d, fabs(vr[i] - src[c.Dn + i]));
        }
    tu_check("mla_split values (exact)", d, 0);

    real *dk = tu_alloc(nk), *dv = tu_alloc(nv), *dkv = tu_alloc(nkv), *dkpe = tu_alloc((size_t)N * c.De);
    ops->attn_bwd(NULL, dk, dv, c.P, c.q, c.k, c.v, c.o, c.lse, c.B, c.T, c.H, Dk, c.Dv, c.scale, 0);
    ops->mla_split_bwd(dkv, dkpe, dk, dv, N, c.H, c.Dn, c.De, c.Dv, 0);
    tu_check("mla_split+attn d_kv (FD)", tu_gradcheck(c.kv, dkv, nkv, sp_loss, &c, TU_H, 200, &r), TOL(1e-6, 2e-2));
    tu_check("mla_split+attn d_kpe (FD, summed over heads)",
             tu_gradcheck(c.kpe, dkpe, (size_t)N * c.De, sp_loss, &c, TU_H, 200, &r), TOL(1e-6, 2e-2));

    // NULL upstream/outputs: dk only reaches dkv[:Dn] and dkpe, dv only dkv[Dn:]; accumulation
    real *a = tu_copy(dkv, nkv), *ap = tu_copy(dkpe, (size_t)N * c.De);
    ops->mla_split_bwd(a, NULL, dk, NULL, N, c.H, c.Dn, c.De, c.Dv, 0);
    ops->mla_split_bwd(a, ap, NULL, dv, N, c.H, c.Dn, c.De, c.Dv, 0);
    ops->mla_split_bwd(NULL, ap, dk, dv, N, c.H, c.Dn, c.De, c.Dv, 0);
    for (size_t i = 0; i < nkv; i++) dkv[i] *= 2;
    for (size_t i = 0; i < (size_t)N * c.De; i++) dkpe[i] *= 2;
    tu_check("mla_split bwd accumulates, NULL pieces (dkv)", tu_rel_rms(a, dkv, nkv), TOL(1e-14, 1e-6));
    tu_check("mla_split bwd accumulates, NULL pieces (dkpe)", tu_rel_rms(ap, dkpe, (size_t)N * c.De), TOL(1e-14, 1e-6));

    // written (assign): what the outputs held (NaN here) replaced, the result equal to adding
    // into zeros — attention's dq, dk, dv and the split's dkv, dkpe; without dv, dkv[Dn:] = 0
    {
        const size_t npe = (size_t)N * c.De;
        real *dq0 = tu_alloc(nk), *dk0 = tu_alloc(nk), *dv0 = tu_alloc(nv), *kv0 = tu_alloc(nkv), *pe0 = tu_alloc(npe);
        real *dqw = tu_alloc(nk), *dkw = tu_alloc(nk), *dvw = tu_alloc(nv), *kvw = tu_alloc(nkv), *pew = tu_alloc(npe);
        ops->attn_bwd(dq0, dk0, dv0, c.P, c.q, c.k, c.v, c.o, c.lse, c.B, c.T, c.H, Dk, c.Dv, c.scale, 0);
        ops->mla_split_bwd(kv0, pe0, dk0, dv0, N, c.H, c.Dn, c.De, c.Dv, 0);
        for (size_t i = 0; i < nk; i++) dqw[i] = dkw[i] = NAN;
        for (size_t i = 0; i < nv; i++) dvw[i] = NAN;
        for (size_t i = 0; i < nkv; i++) kvw[i] = NAN;
        for (size_t i = 0; i < npe; i++) pew[i] = NAN;
        ops->attn_bwd(dqw, dkw, dvw, c.P, c.q, c.k, c.v, c.o, c.lse, c.B, c.T, c.H, Dk, c.Dv, c.scale, 1);
        ops->mla_split_bwd(kvw, pew, dkw, dvw, N, c.H, c.Dn, c.De, c.Dv, 1);
        double m = 0;
        for (size_t i = 0; i < nk; i++) m = tu_worst(tu_worst(m, fabs(dqw[i] - dq0[i])), fabs(dkw[i] - dk0[i]));
        for (size_t i = 0; i < nv; i++) m = tu_worst(m, fabs(dvw[i] - dv0[i]));
        for (size_t i = 0; i < nkv; i++) m = tu_worst(m, fabs(kvw[i] - kv0[i]));
        for (size_t i = 0; i < npe; i++) m = tu_worst(m, fabs(pew[i] - pe0[i]));
        tu_check("attn and mla_split bwd written (assign) == added into zeros (max abs)", m, 0);
        for (size_t i = 0; i < nkv; i++) kvw[i] = NAN;
        ops->mla_split_bwd(kvw, NULL, dkw, NULL, N, c.H, c.Dn, c.De, c.Dv, 1);
        m = 0;
        for (size_t i = 0; i < nkv; i++) {
            const int d = (int)(i % (size_t)(c.Dn + c.Dv));
            m = tu_worst(m, fabs(kvw[i] - (d < c.Dn ? kv0[i] : 0)));
        }
        tu_check("mla_split bwd written without dv: zeros there (max abs)", m, 0);
        free(dq0); free(dk0); free(dv0); free(kv0); free(pe0); free(dqw); free(dkw); free(dvw); free(kvw); free(pew);
    }
    free(c.q); free(c.kv); free(c.kpe); free(c.k); free(c.v); free(c.o); free(c.lse); free(c.P);
    free(dk); free(dv); free(dkv); free(dkpe); free(a); free(ap);
}

// ---------------------------------------------------------------------------
// head_matmul against direct loops, both orientations, with head slices that leave gaps
static void test_head_matmul(void **state) {
    (void)state;
    lm_rng r; lm_rng_seed(&r, 11);
    const int N = 5, H = 3, C = 7, OC = 4;
    const long stride = (long)C * OC + 9;   // slices do not tile W: the gaps must not be read
    real *inp = tu_randn((size_t)N * H * C, &r, 1), *W = tu_randn((size_t)H * stride, &r, 1);
    real *out = tu_alloc((size_t)N * H * OC);
    for (int tr = 0; tr < 2; tr++) {
        ops->head_matmul(out, inp, W, N, H, C, OC, stride, tr);
        double d = 0;
        for (int n = 0; n < N; n++)
            for (int h = 0; h < H; h++)
                for (int o = 0; o < OC; o++) {
                    double s = 0;
                    for (int i = 0; i < C; i++) {
                        double w = tr ? W[h * stride + (long)i * OC + o] : W[h * stride + (long)o * C + i];
                        s += (double)inp[((size_t)n * H + h) * C + i] * w;
                    }
                    d = tu_worst(d, fabs(s - out[((size_t)n * H + h) * OC + o]));
                }
        tu_check(tr ? "head_matmul transpose=1 (out = inp W) max abs diff"
                    : "head_matmul transpose=0 (out = inp W^T) max abs diff", d, TOL(1e-13, 1e-5));
    }
    free(inp); free(W); free(out);
}

// ---------------------------------------------------------------------------
// absorbed decode over the latent cache equals the non-absorbed path (kv = c·W_kvbᵀ,
// mla_split, attn_fwd on the whole prefix, last position), for several cache lengths
static void test_mla_decode_absorbed(void **state) {
    (void)state;
    lm_rng r; lm_rng_seed(&r, 12);
    const int B = 4, H = 3, Dn = 8, De = 4, Dv = 6, R = 16, Tmax = 80;
    const int lens[4] = {1, 37, 80, 0};   // 80 crosses a key block of the prefill attention
    const int Dk = Dn + De, Dkv = Dn + Dv;
    const real scale = (real)(1 / sqrt((double)Dk));
    real *Wkvb = tu_randn((size_t)H * Dkv * R, &r, 1 / sqrt((double)R));
    real *cc = tu_randn((size_t)B * Tmax * R, &r, 1), *kpe = tu_randn((size_t)B * Tmax * De, &r, 1);
    real *qall = tu_randn((size_t)B * Tmax * H * Dk, &r, 1.5);   // queries of every position
    // slots past lens[b] hold NaN: the decode must never read them
    for (int b = 0; b < B; b++) {
        for (size_t i = (size_t)lens[b] * R; i < (size_t)Tmax * R; i++) cc[(size_t)b * Tmax * R + i] = NAN;
        for (size_t i = (size_t)lens[b] * De; i < (size_t)Tmax * De; i++) kpe[(size_t)b * Tmax * De + i] = NAN;
    }

    // absorbed: the query of the last valid position of each sequence
    real *qn = tu_alloc((size_t)B * H * Dn), *qp = tu_alloc((size_t)B * H * De);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const real *src = qall + (((size_t)b * Tmax + lm_max(lens[b] - 1, 0)) * H + h) * Dk;
            memcpy(qn + ((size_t)b * H + h) * Dn, src, sizeof(real) * Dn);
            memcpy(qp + ((size_t)b * H + h) * De, src + Dn, sizeof(real) * De);
        }
    real *qlat = tu_alloc((size_t)B * H * R), *olat = tu_alloc((size_t)B * H * R), *oabs = tu_alloc((size_t)B * H * Dv);
    ops->head_matmul(qlat, qn, Wkvb, B, H, Dn, R, (long)Dkv * R, 1);
    ops->mla_decode(olat, qlat, qp, cc, kpe, lens, B, H, R, De, Tmax, scale, 0);
    ops->head_matmul(oabs, olat, Wkvb + (size_t)Dn * R, B, H, R, Dv, (long)Dkv * R, 0);

    // non-absorbed, per sequence over its prefix
    double worst = 0;
    for (int b = 0; b < B; b++) {
        int T = lens[b];
        if (T == 0) {
            tu_check("mla_decode lens = 0 gives o_lat = 0: |o_lat|", sqrt(ops->sumsq(olat + (size_t)b * H * R, (size_t)H * R)), 0);
            continue;
        }
        real *kv = tu_alloc((size_t)T * H * Dkv), *k = tu_alloc((size_t)T * H * Dk), *v = tu_alloc((size_t)T * H * Dv);
        real *o = tu_alloc((size_t)T * H * Dv), *lse = tu_alloc((size_t)H * T);
        ops->matmul_fwd(kv, cc + (size_t)b * Tmax * R, Wkvb, NULL, T, R, H * Dkv);
        ops->mla_split_fwd(k, v, kv, kpe + (size_t)b * Tmax * De, T, H, Dn, De, Dv);
        ops->attn_fwd(o, lse, qall + (size_t)b * Tmax * H * Dk, k, v, 1, T, H, Dk, Dv, scale);
        const real *last = o + (size_t)(T - 1) * H * Dv, *ab = oabs + (size_t)b * H * Dv;
        double m = 0;
        for (int i = 0; i < H * Dv; i++) m = tu_worst(m, fabs(last[i]));
        double d = tu_max_abs_diff(ab, last, (size_t)H * Dv) / TOL(1, m);
        printf("measured [%s]   len %d: %.3e\n", LM_REAL_NAME, T, d);
        worst = tu_worst(worst, d);
        free(kv); free(k); free(v); free(o); free(lse);
    }
    tu_check(TOL("mla absorbed decode vs split+attn (lens 1, 37, 80): max abs diff",
                 "mla absorbed decode vs split+attn (lens 1, 37, 80): max abs diff / max|o|"),
             worst, TOL(1e-12, 1e-5));
    free(Wkvb); free(cc); free(kpe); free(qall); free(qn); free(qp); free(qlat); free(olat); free(oabs);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attn_fwd_vs_reference), cmocka_unit_test(test_attn_equal_keys),
        cmocka_unit_test(test_attn_causal),           cmocka_unit_test(test_attn_large_scores),
        cmocka_unit_test(test_attn_prefix),
        cmocka_unit_test(test_attn_grads),            cmocka_unit_test(test_attn_thread_determinism),
        cmocka_unit_test(test_mla_split),             cmocka_unit_test(test_head_matmul),
        cmocka_unit_test(test_mla_decode_absorbed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
