// test_conv.c — the short convolution (causal depthwise conv + SiLU) and its decode cache:
// exact values for hand-derivable weights, finite-difference gradients of inp and w with
// and without a cache, and one-shot versus piecewise runs carried by conv_cache_update.
#include "harness.h"
#include "cpu/cpu.h"

static const lm_ops *ops = &lm_cpu_ops;

// ---------------------------------------------------------------------------
// exact values: w = e_{W-1} gives silu(x_t); w = e_0 gives silu(x_{t-(W-1)}) read
// from the cache for the first W-1 positions
static void test_conv_exact_shifts(void **state) {
    (void)state;
    lm_rng r; lm_rng_seed(&r, 11);
    enum { B = 2, T = 6, C = 3, W = 4 };
    real *x = tu_randn(B * T * C, &r, 1), *cache = tu_randn(B * (W - 1) * C, &r, 1);
    real *out = tu_alloc(B * T * C), w[C * W] = {0};
    for (int c = 0; c < C; c++) w[c * W + W - 1] = 1;
    ops->conv_silu_fwd(out, x, w, cache, B, T, C, W);
    double md = 0;
    for (int i = 0; i < B * T * C; i++) md = tu_worst(md, fabs((double)out[i] - (double)lm_silu(x[i])));
    tu_check("conv identity tap = silu(x) (max abs)", md, 0);
    memset(w, 0, sizeof w);
    for (int c = 0; c < C; c++) w[c * W] = 1;
    ops->conv_silu_fwd(out, x, w, cache, B, T, C, W);
    md = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++) {
                int p = t - (W - 1);
                real src = p >= 0 ? x[(b * T + p) * C + c] : cache[(b * (W - 1) + W - 1 + p) * C + c];
                md = tu_worst(md, fabs((double)out[(b * T + t) * C + c] - (double)lm_silu(src)));
            }
    tu_check("conv oldest tap = silu(x[t-3]) incl. cache (max abs)", md, 0);
    // without a cache the first W-1 outputs of the shifted conv are silu(0) = 0
    ops->conv_silu_fwd(out, x, w, NULL, B, T, C, W);
    md = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < W - 1; t++)
            for (int c = 0; c < C; c++) md = tu_worst(md, fabs((double)out[(b * T + t) * C + c]));
    tu_check("conv no cache = zero left padding (max abs)", md, 0);
    free(x); free(cache); free(out);
}

// ---------------------------------------------------------------------------
// gradients: loss = Σ out ⊙ P
typedef struct { int B, T, C, W; real *x, *w, *cache, *out, *P; } cv_ctx;
static double cv_loss(void *p) {
    cv_ctx *c = p;
    ops->conv_silu_fwd(c->out, c->x, c->w, c->cache, c->B, c->T, c->C, c->W);
    return tu_dot(c->out, c->P, (size_t)c->B * c->T * c->C);
}
static void check_conv_grads(int with_cache, int T) {
    lm_rng r; lm_rng_seed(&r, 12 + with_cache + 7 * T);
    cv_ctx c = {.B = 2, .T = T, .C = 5, .W = 4};
    size_t n = (size_t)c.B * c.T * c.C;
    c.x = tu_randn(n, &r, 1.5); c.w = tu_randn(c.C * c.W, &r, 0.7);
    c.cache = with_cache ? tu_randn((size_t)c.B * (c.W - 1) * c.C, &r, 1.5) : NULL;
    c.out = tu_alloc(n); c.P = tu_randn(n, &r, 1);
    real *dx = tu_alloc(n), *dw = tu_alloc(c.C * c.W);
    ops->conv_silu_bwd(dx, dw, c.P, c.x, c.w, c.cache, c.B, c.T, c.C, c.W, 0);
    char what[96];
    snprintf(what, sizeof what, "conv d_inp (T=%d, %s)", T, with_cache ? "cache" : "no cache");
    tu_check(what, tu_gradcheck(c.x, dx, n, cv_loss, &c, TU_H, 300, &r), TOL(1e-8, 2e-2));
    snprintf(what, sizeof what, "conv d_w (T=%d, %s)", T, with_cache ? "cache" : "no cache");
    tu_check(what, tu_gradcheck(c.w, dw, c.C * c.W, cv_loss, &c, TU_H, 300, &r), TOL(1e-8, 2e-2));
    // accumulation and NULL gradients: a second call with dinp only doubles dinp, leaves dw
    real *dx2 = tu_copy(dx, n), *dw2 = tu_copy(dw, c.C * c.W);
    ops->conv_silu_bwd(dx2, NULL, c.P, c.x, c.w, c.cache, c.B, c.T, c.C, c.W, 0);
    real *dx3 = tu_alloc(n);   // the written form replaces whatever dinp held (NaN here)
    for (size_t i = 0; i < n; i++) dx3[i] = NAN;
    ops->conv_silu_bwd(dx3, NULL, c.P, c.x, c.w, c.cache, c.B, c.T, c.C, c.W, 1);
    tu_check("conv bwd assign writes dinp (max abs diff)", tu_max_abs_diff(dx3, dx, n), 0);
    free(dx3);
    for (size_t i = 0; i < n; i++) dx[i] *= 2;
    tu_check("conv bwd accumulates into dinp", tu_rel_rms(dx2, dx, n), TOL(1e-15, 1e-7));
    tu_check("conv bwd NULL dinp leaves dw", tu_max_abs_diff(dw2, dw, c.C * c.W), 0);
    free(c.x); free(c.w); free(c.cache); free(c.out); free(c.P); free(dx); free(dw); free(dx2); free(dw2);
}
static void test_conv_grads(void **state) {
    (void)state;
    check_conv_grads(0, 7);
    check_conv_grads(1, 7);
    check_conv_grads(1, 2);   // shorter than W-1: every output reads the cache
}

// ---------------------------------------------------------------------------
// one-shot versus pieces: [cache0 ++ x] in one call equals running the pieces in
// order, each with the cache left by conv_cache_update of the previous pieces; the
// final caches agree too. Pieces shorter than W-1 exercise the in-place shift.
static void check_split(const int *pieces, int np, int with_cache0) {
    lm_rng r; lm_rng_seed(&r, 21 + np);
    enum { B = 3, C = 7, W = 4 };
    int T = 0;
    for (int i = 0; i < np; i++) T += pieces[i];
    real *x = tu_randn((size_t)B * T * C, &r, 1), *w = tu_randn(C * W, &r, 0.8);
    real *cache0 = with_cache0 ? tu_randn(B * (W - 1) * C, &r, 1) : tu_alloc(B * (W - 1) * C);
    real *full = tu_alloc((size_t)B * T * C), *part = tu_alloc((size_t)B * T * C);
    ops->conv_silu_fwd(full, x, w, with_cache0 ? cache0 : NULL, B, T, C, W);
    real *cfull = tu_copy(cache0, B * (W - 1) * C);
    ops->conv_cache_update(cfull, x, B, T, C, W);
    real *cache = tu_copy(cache0, B * (W - 1) * C);
    int t0 = 0;
    for (int i = 0; i < np; i++) {
        int Tp = pieces[i];
        real *xp = tu_alloc((size_t)B * Tp * C), *yp = tu_alloc((size_t)B * Tp * C);
        for (int b = 0; b < B; b++) memcpy(xp + (size_t)b * Tp * C, x + ((size_t)b * T + t0) * C, (size_t)Tp * C * sizeof(real));
        ops->conv_silu_fwd(yp, xp, w, cache, B, Tp, C, W);
        ops->conv_cache_update(cache, xp, B, Tp, C, W);
        for (int b = 0; b < B; b++) memcpy(part + ((size_t)b * T + t0) * C, yp + (size_t)b * Tp * C, (size_t)Tp * C * sizeof(real));
        t0 += Tp;
        free(xp); free(yp);
    }
    char what[128], *p = what;
    p += snprintf(p, sizeof what, "conv split [");
    for (int i = 0; i < np; i++) p += snprintf(p, sizeof what - (p - what), i ? ",%d" : "%d", pieces[i]);
    snprintf(p, sizeof what - (p - what), "]%s: outputs (max abs)", with_cache0 ? " +cache0" : "");
    tu_check(what, tu_max_abs_diff(part, full, (size_t)B * T * C), 0);
    tu_check("conv split: final cache (max abs)", tu_max_abs_diff(cache, cfull, B * (W - 1) * C), 0);
    // and the final cache is literally the last W-1 inputs (T ≥ W-1 here)
    double md = 0;
    for (int b = 0; b < B; b++)
        for (int i = 0; i < W - 1; i++)
            for (int c = 0; c < C; c++)
                md = tu_worst(md, fabs((double)cache[(b * (W - 1) + i) * C + c] - x[((size_t)b * T + T - (W - 1) + i) * C + c]));
    tu_check("conv cache = last W-1 inputs (max abs)", md, 0);
    free(x); free(w); free(cache0); free(full); free(part); free(cfull); free(cache);
}
static void test_conv_split(void **state) {
    (void)state;
    int a[] = {5, 8};
    int b[] = {1, 2, 1, 9, 2};
    int c[] = {2, 2, 2, 2, 1, 1, 3};
    check_split(a, 2, 0);
    check_split(b, 5, 1);
    check_split(c, 7, 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_conv_exact_shifts),
        cmocka_unit_test(test_conv_grads),
        cmocka_unit_test(test_conv_split),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
