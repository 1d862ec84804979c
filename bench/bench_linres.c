// bench_linres.c — a sublayer's output linear added onto the residual stream (lm_linears.res)
// against the same linear and a separate add pass, at the `small` preset's output linears
// (N = 16,384 tokens → d 1024 from C = 1024: KDA / MLA o_proj; 4096: the dense FFN; 256: the
// shared expert), the input's bf16 copy given (lm_linears.lo_filled). Medians of 30 samples of 10 calls back to back (the host clock around
// device waits).
//
// Usage: bench_linres   (needs a CUDA GPU)
#include "core/rng.h"
#include "cuda/cuda_backend.h"
#include <stdio.h>
#include <stdlib.h>

static const lm_ops *OPS = &lm_cuda_ops;

static int cmp_d(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static float *dev_randn(lm_rng *r, size_t n, float s) {
    float *h = lm_malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = s * (float)lm_rng_normal(r);
    float *d = OPS->alloc(n * sizeof(float));
    OPS->to_device(d, h, n * sizeof(float));
    free(h);
    return d;
}
// median µs of `reps` calls of linears_fwd (L) then, with add, the add op
static double time_us(const lm_linears *L, const float *x, int N, int C, const float *res, int add) {
    double t[30];
    const int reps = 30;
    for (int i = -3; i < reps; i++) {
        lm_cuda_sync();
        const double t0 = lm_time_sec();
        for (int k = 0; k < 10; k++) {
            OPS->linears_fwd(L, x, N, C);
            if (add) OPS->add(L->out[0], res, L->out[0], (size_t)N * L->OC[0]);
        }
        lm_cuda_sync();
        if (i >= 0) t[i] = (lm_time_sec() - t0) * 1e5;
    }
    qsort(t, reps, sizeof *t, cmp_d);
    return t[reps / 2];
}

int main(void) {
    lm_rng r;
    lm_rng_seed(&r, 1);
    const int N = 16384, OC = 1024, Cs[3] = {1024, 4096, 256};
    printf("output linear N %d -> %d, GEMM mode %s\n", N, OC, lm_cuda_gemm_name(lm_cuda_gemm_mode()));
    for (int ci = 0; ci < 3; ci++) {
        const int C = Cs[ci];
        float *x = dev_randn(&r, (size_t)N * C, 1), *W = dev_randn(&r, (size_t)OC * C, 0.03f);
        float *res = dev_randn(&r, (size_t)N * OC, 1), *out = OPS->alloc((size_t)N * OC * sizeof(float));
        // the input's bf16 copy filled once, as the norm or GLU before these linears fills it
        void *lo = OPS->alloc(OPS->linears_lo_bytes(N, C));
        lm_linears plain = {.n = 1, .OC = {OC}, .W = {W}, .out = {out}, .lo = lo};
        OPS->linears_fwd(&plain, x, N, C);
        plain.lo_filled = 1;
        lm_linears fused = plain;
        fused.res[0] = res;
        const double a = time_us(&plain, x, N, C, NULL, 0), b = time_us(&plain, x, N, C, res, 1);
        const double c = time_us(&fused, x, N, C, NULL, 0);
        printf("C %4d: linear %.1f us | linear + add op %.1f us | linear with res %.1f us (saves %.1f us)\n", C, a, b,
               c, b - c);
        OPS->free(x); OPS->free(W); OPS->free(res); OPS->free(out); OPS->free(lo);
    }
    return 0;
}
