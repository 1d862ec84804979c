// test_util.c — see harness.h.
#include "harness.h"

real *tu_alloc(size_t n) { return lm_malloc((n ? n : 1) * sizeof(real)); }

real *tu_randn(size_t n, lm_rng *r, double std) {
    real *x = tu_alloc(n);
    for (size_t i = 0; i < n; i++) x[i] = (real)(std * lm_rng_normal(r));
    return x;
}

real *tu_rand_uniform(size_t n, lm_rng *r, double lo, double hi) {
    real *x = tu_alloc(n);
    for (size_t i = 0; i < n; i++) x[i] = (real)(lo + (hi - lo) * lm_rng_uniform(r));
    return x;
}

real *tu_copy(const real *x, size_t n) {
    real *y = tu_alloc(n);
    memcpy(y, x, n * sizeof(real));
    return y;
}

double tu_dot(const real *a, const real *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * (double)b[i];
    return s;
}

void tu_check(const char *what, double err, double tol) {
    printf("measured [%s] %s = %.3e (tol %.1e)%s\n", LM_REAL_NAME, what, err, tol,
           err <= tol ? "" : "  <-- FAIL");
    fflush(stdout);
    if (!(err <= tol)) fail_msg("%s: error %.3e exceeds tolerance %.1e", what, err, tol);
}

double tu_gradcheck(real *x, const real *grad, size_t n, tu_loss_fn loss, void *ctx, double h,
                    int max_checks, lm_rng *r) {
    size_t m = n <= (size_t)max_checks ? n : (size_t)max_checks;
    double num = 0, den = 0;
    for (size_t c = 0; c < m; c++) {
        size_t i = n <= (size_t)max_checks ? c : lm_rng_below(r, (uint32_t)n);
        real keep = x[i];
        x[i] = keep + (real)h;
        double lp = loss(ctx);
        x[i] = keep - (real)h;
        double lmn = loss(ctx);
        x[i] = keep;
        double fd = (lp - lmn) / (2 * h);
        double d = fd - (double)grad[i];
        num += d * d;
        den += fd * fd;
    }
    if (num != num) return INFINITY;
    if (den == 0) return num == 0 ? 0 : sqrt(num);
    return sqrt(num / den);
}
