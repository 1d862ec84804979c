// test_attnres.c — the Block AttnRes mixer: forward against a double-precision reference
// written here, the w = 0 (uniform mix) and n = 1 (identity) edge cases, finite-difference
// gradients of every source, w and γ, the bilinear zero-query property, a source listed
// twice with shared gradient buffers, accumulation/NULL gradients, and thread-count
// independence of the results.
#include <omp.h>
#include "harness.h"
#include "cpu/cpu.h"

static const lm_ops *ops = &lm_cpu_ops;

#define EPS 1e-5
#define MAXN 10

// A mixer problem: n sources [N,C] (some entries may share a tensor), query parameters,
// and a fixed projection P so that loss = Σ out ⊙ P.
typedef struct {
    int N, C, n;
    real *u[MAXN];          // the distinct tensors live in own[]; u[j] may repeat one
    real *own[MAXN];
    int n_own;
    real *w, *gamma, *out, *alpha, *P;
} mix;

static lm_sources sources(const mix *m) {
    lm_sources s = {.n = m->n};
    for (int j = 0; j < m->n; j++) s.p[j] = m->u[j];
    return s;
}

static double mix_loss(void *p) {
    mix *m = p;
    ops->attnres_fwd(m->out, m->alpha, sources(m), m->w, m->gamma, m->N, m->C, EPS);
    return tu_dot(m->out, m->P, (size_t)m->N * m->C);
}

// n distinct sources, source j scaled by scale[j % nscale]; w ~ N(0, (wstd/√C)²) so the
// scores are O(wstd); γ uniform in [0.5, 1.5] (≠ 1, so γ and w are told apart)
static void mix_init(mix *m, int N, int C, int n, const double *scale, int nscale, double wstd, lm_rng *r) {
    memset(m, 0, sizeof *m);
    m->N = N; m->C = C; m->n = n; m->n_own = n;
    size_t sz = (size_t)N * C;
    for (int j = 0; j < n; j++) m->u[j] = m->own[j] = tu_randn(sz, r, scale[j % nscale]);
    m->w = tu_randn(C, r, wstd / sqrt((double)C));
    m->gamma = tu_rand_uniform(C, r, 0.5, 1.5);
    m->out = tu_alloc(sz);
    m->alpha = tu_alloc((size_t)N * n);
    m->P = tu_randn(sz, r, 1);
}

static void mix_free(mix *m) {
    for (int j = 0; j < m->n_own; j++) free(m->own[j]);
    free(m->w); free(m->gamma); free(m->out); free(m->alpha); free(m->P);
}

// out [N,C], alpha [N,n] of the mixer in double precision, from the stored inputs
static void reference(double *out, double *alpha, const mix *m) {
    for (int i = 0; i < m->N; i++) {
        double s[MAXN], mx = -INFINITY, sum = 0;
        for (int j = 0; j < m->n; j++) {
            const real *x = m->u[j] + (size_t)i * m->C;
            double ss = 0, dot = 0;
            for (int c = 0; c < m->C; c++) {
                ss += (double)x[c] * x[c];
                dot += (double)m->gamma[c] * m->w[c] * x[c];
            }
            s[j] = dot / sqrt(ss / m->C + EPS);
            mx = tu_worst(mx, s[j]);
        }
        for (int j = 0; j < m->n; j++) sum += exp(s[j] - mx);
        for (int j = 0; j < m->n; j++) alpha[(size_t)i * m->n + j] = exp(s[j] - mx) / sum;
        for (int c = 0; c < m->C; c++) {
            double acc = 0;
            for (int j = 0; j < m->n; j++) acc += alpha[(size_t)i * m->n + j] * m->u[j][(size_t)i * m->C + c];
            out[(size_t)i * m->C + c] = acc;
        }
    }
}

// ---------------------------------------------------------------------------
static void test_forward_reference(void **state) {
    (void)state;
    lm_rng r; lm_rng_seed(&r, 11);
    const double scale[3] = {0.01, 1, 100};
    const int ns[] = {1, 2, 3, 5, 10}, Cs[] = {8, 64};
    double worst_out = 0, worst_alpha = 0, worst_row = 0;
    for (int a = 0; a < 5; a++)
        for (int b = 0; b < 2; b++) {
            mix m;
            mix_init(&m, 37, Cs[b], ns[a], scale, 3, 2.0, &r);
            mix_loss(&m);
            size_t sz = (size_t)m.N * m.C;
            double *out = malloc(sz * sizeof(double)), *alpha = malloc((size_t)m.N * m.n * sizeof(double));
            reference(out, alpha, &m);
            // per row: |out − ref| relative to Σ_j α_j |u_j| (the size of the terms being
            // summed, so rows where sources cancel are judged by their rounding scale and
            // rows of small sources are not hidden behind rows of large ones); plus α error
            for (int i = 0; i < m.N; i++) {
                double num = 0, den = 0;
                for (int c = 0; c < m.C; c++) {
                    size_t k = (size_t)i * m.C + c;
                    double d = m.out[k] - out[k], mag = 0;
                    for (int j = 0; j < m.n; j++) mag += alpha[(size_t)i * m.n + j] * fabs((double)m.u[j][k]);
                    num += d * d;
                    den += mag * mag;
                }
                worst_row = tu_worst(worst_row, sqrt(num / den));
                for (int j = 0; j < m.n; j++)
                    worst_alpha = tu_worst(worst_alpha, fabs(m.alpha[(size_t)i * m.n + j] - alpha[(size_t)i * m.n + j]));
            }
            double num = 0, den = 0;
            for (size_t k = 0; k < sz; k++) {
                num += (m.out[k] - out[k]) * (m.out[k] - out[k]);
                den += out[k] * out[k];
            }
            worst_out = tu_worst(worst_out, sqrt(num / den));
            free(out); free(alpha);
            mix_free(&m);
        }
    // in f32 a score s = Σ_c q_c û_c of size ~5 carries rounding ~ε·Σ_c|q_c û_c| ≈ 1e-6, and
    // α inherits it as a relative error (dα/α = ds), hence the f32 bounds on α and rows
    tu_check("attnres fwd out rel rms (n in 1..10, C in 8,64, scales 0.01/1/100)", worst_out, TOL(1e-14, 2e-6));
    tu_check("attnres fwd worst row err / rms(sum_j alpha_j |u_j|)", worst_row, TOL(1e-14, 1e-5));
    tu_check("attnres fwd alpha max abs diff", worst_alpha, TOL(1e-14, 1e-5));
}

// the scores really spread: with these w the reference α is far from uniform, so the
// forward test above compares a non-trivial softmax (guards against a test that passes
// because every α ≈ 1/n)
static void test_forward_is_sharp(void **state) {
    (void)state;
    lm_rng r; lm_rng_seed(&r, 12);
    const double scale[3] = {0.01, 1, 100};
    mix m;
    mix_init(&m, 37, 64, 5, scale, 3, 2.0, &r);
    mix_loss(&m);
    double amax = 0;
    for (size_t k = 0; k < (size_t)m.N * m.n; k++) amax = tu_worst(amax, m.alpha[k]);
    printf("measured [%s] attnres largest alpha with n = 5 = %.3f (must exceed 0.6)\n", LM_REAL_NAME, amax);
    assert_true(amax > 0.6);
    // α rows sum to one
    double worst = 0;
    for (int i = 0; i < m.N; i++) {
        double s = 0;
        for (int j = 0; j < m.n; j++) s += m.alpha[(size_t)i * m.n + j];
        worst = tu_worst(worst, fabs(s - 1));
    }
    tu_check("attnres alpha rows sum to 1", worst, TOL(1e-15, 1e-6));
    mix_free(&m);
}

// ---------------------------------------------------------------------------
// w = 0: every score is exactly 0, α = 1/n exactly, out = mean of the sources
static void test_zero_query_uniform(void **state) {
    (void)state;
    lm_rng r; lm_rng_seed(&r, 13);
    const double scale[3] = {0.01, 1, 100};
    const int ns[] = {2, 3, 7};
    double worst_alpha = 0, worst_out = 0;
    for (int a = 0; a < 3; a++) {
        mix m;
        mix_init(&m, 9, 24, ns[a], scale, 3, 1.0, &r);
        memset(m.w, 0, (size_t)m.C * sizeof(real));
        mix_loss(&m);
        for (size_t k = 0; k < (size_t)m.N * m.n; k++)
            worst_alpha = tu_worst(worst_alpha, fabs((double)m.alpha[k] - (double)((real)1 / (real)m.n)));
        // |out − mean| relative to Σ|u|/n, the size of the rounding of the mean itself
        for (size_t k = 0; k < (size_t)m.N * m.C; k++) {
            double mean = 0, mag = 0;
            for (int j = 0; j < m.n; j++) mean += m.u[j][k], mag += fabs((double)m.u[j][k]);
            worst_out = tu_worst(worst_out, fabs(m.out[k] - mean / m.n) / (mag / m.n));
        }
        mix_free(&m);
    }
    tu_check("attnres w=0: alpha == 1/n exactly", worst_alpha, 0);
    tu_check("attnres w=0: out = mean of sources (rel to mean |u|)", worst_out, TOL(1e-15, 1e-6));
}

// n = 1: α = 1 and out = u_0 bit for bit, whatever w and γ are
static void test_identity(void **state) {
    (void)state;
    lm_rng r; lm_rng_seed(&r, 14);
    const double scale[1] = {3};
    mix m;
    mix_init(&m, 11, 40, 1, scale, 1, 4.0, &r);
    mix_loss(&m);
    double da = 0;
    for (int i = 0; i < m.N; i++) da = tu_worst(da, fabs(m.alpha[i] - 1));
    tu_check("attnres n=1: alpha == 1", da, 0);
    tu_check("attnres n=1: out == u_0", tu_max_abs_diff(m.out, m.u[0], (size_t)m.N * m.C), 0);
    // backward: ∂u_0 = g exactly, nothing reaches w or γ
    size_t sz = (size_t)m.N * m.C;
    real *du = tu_alloc(sz), *dw = tu_alloc(m.C), *dg = tu_alloc(m.C);
    lm_source_grads d = {.n = 1, .p = {du}};
    ops->attnres_bwd(d, dw, dg, m.P, sources(&m), m.alpha, m.w, m.gamma, m.N, m.C, EPS);
    tu_check("attnres n=1: du_0 == dout", tu_max_abs_diff(du, m.P, sz), 0);
    real *zero = tu_alloc(m.C);
    tu_check("attnres n=1: dw == 0", tu_max_abs_diff(dw, zero, m.C), 0);
    tu_check("attnres n=1: dgamma == 0", tu_max_abs_diff(dg, zero, m.C), 0);
    free(du); free(dw); free(dg); free(zero);
    mix_free(&m);
}

// ---------------------------------------------------------------------------
// FD gradients of every source, w and γ. Sources have scales 0.3..30 (so the RMSNorm
// key-path term matters) and each FD step is proportional to its source's scale.
static void check_grads(int n) {
    lm_rng r; lm_rng_seed(&r, 100 + n);
    const double scale[4] = {0.3, 1, 30, 3};
    mix m;
    mix_init(&m, 5, 12, n, scale, 4, 1.5, &r);
    size_t sz = (size_t)m.N * m.C;
    mix_loss(&m);
    real *du[MAXN], *dw = tu_alloc(m.C), *dg = tu_alloc(m.C);
    lm_source_grads d = {.n = n};
    for (int j = 0; j < n; j++) d.p[j] = du[j] = tu_alloc(sz);
    ops->attnres_bwd(d, dw, dg, m.P, sources(&m), m.alpha, m.w, m.gamma, m.N, m.C, EPS);
    char what[128];
    double worst = 0, keyshare = 0;
    for (int j = 0; j < n; j++) {
        double e = tu_gradcheck(m.u[j], du[j], sz, mix_loss, &m, TU_H * scale[j % 4], 400, &r);
        worst = tu_worst(worst, e);
        // size of the key-path part ∂u_j − α_j g relative to ∂u_j: the FD check above
        // would not notice a wrong key path if this part were negligible
        double num = 0, den = 0;
        for (int i = 0; i < m.N; i++)
            for (int c = 0; c < m.C; c++) {
                size_t k = (size_t)i * m.C + c;
                double v = du[j][k] - (double)m.alpha[(size_t)i * n + j] * m.P[k];
                num += v * v;
                den += (double)du[j][k] * du[j][k];
            }
        keyshare = tu_worst(keyshare, sqrt(num / den));
    }
    snprintf(what, sizeof what, "attnres n=%d d_sources (all %d)", n, n);
    tu_check(what, worst, TOL(1e-6, 2e-2));
    if (n > 1) {
        printf("measured [%s] attnres n=%d largest |d_source - alpha_j dout| / |d_source| = %.3f (must exceed 0.05)\n",
               LM_REAL_NAME, n, keyshare);
        assert_true(keyshare > 0.05);
    }
    double ew = tu_gradcheck(m.w, dw, m.C, mix_loss, &m, TU_H, 400, &r);
    snprintf(what, sizeof what, "attnres n=%d d_w", n);
    tu_check(what, ew, TOL(1e-6, 2e-2));
    double eg = tu_gradcheck(m.gamma, dg, m.C, mix_loss, &m, TU_H, 400, &r);
    snprintf(what, sizeof what, "attnres n=%d d_gamma", n);
    tu_check(what, eg, TOL(1e-6, 2e-2));
    for (int j = 0; j < n; j++) free(du[j]);
    free(dw); free(dg);
    mix_free(&m);
}
static void test_grads_n1(void **state) { (void)state; check_grads(1); }
static void test_grads_n3(void **state) { (void)state; check_grads(3); }
static void test_grads_n6(void **state) { (void)state; check_grads(6); }

// ---------------------------------------------------------------------------
// w = 0 (the initialisation): ∂γ = ∂q ⊙ w is exactly 0, ∂w = ∂q ⊙ γ is not (and matches
// FD), and the key path vanishes: ∂u_j = g / n
static void test_zero_query_grads(void **state) {
    (void)state;
    lm_rng r; lm_rng_seed(&r, 15);
    const double scale[3] = {0.5, 1, 4};
    mix m;
    mix_init(&m, 6, 16, 3, scale, 3, 1.0, &r);
    memset(m.w, 0, (size_t)m.C * sizeof(real));
    size_t sz = (size_t)m.N * m.C;
    mix_loss(&m);
    real *du[3], *dw = tu_alloc(m.C), *dg = tu_alloc(m.C), *zero = tu_alloc(m.C);
    lm_source_grads d = {.n = 3};
    for (int j = 0; j < 3; j++) d.p[j] = du[j] = tu_alloc(sz);
    ops->attnres_bwd(d, dw, dg, m.P, sources(&m), m.alpha, m.w, m.gamma, m.N, m.C, EPS);
    tu_check("attnres w=0: dgamma == 0 exactly", tu_max_abs_diff(dg, zero, m.C), 0);
    double nw = sqrt(tu_dot(dw, dw, m.C));
    printf("measured [%s] attnres w=0: |dw| = %.3e (must be > 0.1)\n", LM_REAL_NAME, nw);
    assert_true(nw > 0.1);
    tu_check("attnres w=0: d_w vs FD", tu_gradcheck(m.w, dw, m.C, mix_loss, &m, TU_H, 400, &r), TOL(1e-6, 2e-2));
    double worst = 0;
    for (int j = 0; j < 3; j++)
        for (size_t k = 0; k < sz; k++) worst = tu_worst(worst, fabs(du[j][k] - m.P[k] / 3) / fabs(m.P[k]));
    tu_check("attnres w=0: d_source == dout / n (rel)", worst, TOL(1e-15, 1e-6));
    for (int j = 0; j < 3; j++) free(du[j]);
    free(dw); free(dg); free(zero);
    mix_free(&m);
}

// ---------------------------------------------------------------------------
// A tensor listed twice, with both gradient slots pointing at one buffer: the sum of the
// two contributions must equal the FD gradient of the shared tensor.
static void test_aliasing(void **state) {
    (void)state;
    lm_rng r; lm_rng_seed(&r, 16);
    const double scale[3] = {1, 2, 0.5};
    mix m;
    mix_init(&m, 7, 12, 3, scale, 3, 1.5, &r);
    // source list [A, B, A]: own[2] is not used as a source any more (still freed)
    m.u[2] = m.u[0];
    size_t sz = (size_t)m.N * m.C;
    mix_loss(&m);
    real *dA = tu_alloc(sz), *dB = tu_alloc(sz), *dw = tu_alloc(m.C), *dg = tu_alloc(m.C);
    lm_source_grads d = {.n = 3, .p = {dA, dB, dA}};
    ops->attnres_bwd(d, dw, dg, m.P, sources(&m), m.alpha, m.w, m.gamma, m.N, m.C, EPS);
    tu_check("attnres [A,B,A] d_A (shared buffer) vs FD", tu_gradcheck(m.u[0], dA, sz, mix_loss, &m, TU_H, 400, &r),
             TOL(1e-6, 2e-2));
    tu_check("attnres [A,B,A] d_B vs FD", tu_gradcheck(m.u[1], dB, sz, mix_loss, &m, TU_H, 400, &r), TOL(1e-6, 2e-2));
    tu_check("attnres [A,B,A] d_w vs FD", tu_gradcheck(m.w, dw, m.C, mix_loss, &m, TU_H, 400, &r), TOL(1e-6, 2e-2));
    tu_check("attnres [A,B,A] d_gamma vs FD", tu_gradcheck(m.gamma, dg, m.C, mix_loss, &m, TU_H, 400, &r),
             TOL(1e-6, 2e-2));
    // [A, A]: equal scores, α = ½ each (exact in binary), out = ½A + ½A = A and c_j = 0,
    // so ∂A = ½g + ½g = dout bit for bit
    m.n = 2; m.u[1] = m.u[0];
    mix_loss(&m);
    tu_check("attnres [A,A] out == A", tu_max_abs_diff(m.out, m.u[0], sz), 0);
    memset(dA, 0, sz * sizeof(real));
    lm_source_grads d2 = {.n = 2, .p = {dA, dA}};
    ops->attnres_bwd(d2, NULL, NULL, m.P, sources(&m), m.alpha, m.w, m.gamma, m.N, m.C, EPS);
    tu_check("attnres [A,A] d_A == dout", tu_max_abs_diff(dA, m.P, sz), 0);
    free(dA); free(dB); free(dw); free(dg);
    mix_free(&m);
}

// ---------------------------------------------------------------------------
// Backward accumulates (a second call doubles every gradient), NULL gradient pointers
// leave the rest unchanged, and results are bit-identical for 1 and 2 threads.
static void test_accumulate_null_threads(void **state) {
    (void)state;
    lm_rng r; lm_rng_seed(&r, 17);
    const double scale[3] = {0.01, 1, 100};
    mix m;
    mix_init(&m, 70, 130, 4, scale, 3, 2.0, &r);   // C = 130 spans three ∂q channel blocks
    size_t sz = (size_t)m.N * m.C;
    lm_sources s = sources(&m);
    real *du[4], *dw = tu_alloc(m.C), *dg = tu_alloc(m.C);
    lm_source_grads d = {.n = 4};
    for (int j = 0; j < 4; j++) d.p[j] = du[j] = tu_alloc(sz);
    int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    mix_loss(&m);
    real *out1 = tu_copy(m.out, sz), *alpha1 = tu_copy(m.alpha, (size_t)m.N * 4);
    ops->attnres_bwd(d, dw, dg, m.P, s, m.alpha, m.w, m.gamma, m.N, m.C, EPS);
    real *du1 = tu_copy(du[2], sz), *dw1 = tu_copy(dw, m.C), *dg1 = tu_copy(dg, m.C);
    // second call, two threads, into the same buffers: must give exactly twice the first
    omp_set_num_threads(2);
    mix_loss(&m);
    tu_check("attnres fwd out: 2 threads == 1 thread (bitwise)", tu_max_abs_diff(m.out, out1, sz), 0);
    tu_check("attnres fwd alpha: 2 threads == 1 thread (bitwise)", tu_max_abs_diff(m.alpha, alpha1, (size_t)m.N * 4), 0);
    ops->attnres_bwd(d, dw, dg, m.P, s, m.alpha, m.w, m.gamma, m.N, m.C, EPS);
    for (size_t k = 0; k < sz; k++) du1[k] *= 2;
    for (int c = 0; c < m.C; c++) dw1[c] *= 2, dg1[c] *= 2;
    // x + x is exact, so accumulation and thread independence are checked bitwise
    tu_check("attnres bwd accumulates d_source (x2, 1 vs 2 threads, bitwise)", tu_max_abs_diff(du[2], du1, sz), 0);
    tu_check("attnres bwd accumulates d_w (x2, 1 vs 2 threads, bitwise)", tu_max_abs_diff(dw, dw1, m.C), 0);
    tu_check("attnres bwd accumulates d_gamma (x2, 1 vs 2 threads, bitwise)", tu_max_abs_diff(dg, dg1, m.C), 0);
    // only source 2 and γ requested: same values as the full call (halved)
    real *only = tu_alloc(sz), *dg_only = tu_alloc(m.C);
    lm_source_grads d_only = {.n = 4, .p = {NULL, NULL, only, NULL}};
    ops->attnres_bwd(d_only, NULL, dg_only, m.P, s, m.alpha, m.w, m.gamma, m.N, m.C, EPS);
    for (size_t k = 0; k < sz; k++) only[k] *= 2;
    for (int c = 0; c < m.C; c++) dg_only[c] *= 2;
    tu_check("attnres bwd with NULL grads: d_source unchanged", tu_max_abs_diff(only, du1, sz), 0);
    tu_check("attnres bwd with NULL grads: d_gamma unchanged", tu_max_abs_diff(dg_only, dg1, m.C), 0);
    omp_set_num_threads(threads);
    for (int j = 0; j < 4; j++) free(du[j]);
    free(dw); free(dg); free(out1); free(alpha1); free(du1); free(dw1); free(dg1); free(only); free(dg_only);
    mix_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_reference), cmocka_unit_test(test_forward_is_sharp),
        cmocka_unit_test(test_zero_query_uniform), cmocka_unit_test(test_identity),
        cmocka_unit_test(test_grads_n1),          cmocka_unit_test(test_grads_n3),
        cmocka_unit_test(test_grads_n6),          cmocka_unit_test(test_zero_query_grads),
        cmocka_unit_test(test_aliasing),          cmocka_unit_test(test_accumulate_null_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
