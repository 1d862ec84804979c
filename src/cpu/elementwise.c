// elementwise.c — add, accumulate, scale, sum of squares, finiteness.
#include "cpu.h"

void cpu_add(real *out, const real *a, const real *b, size_t n) {
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void cpu_acc(real *acc, const real *x, size_t n) {
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) acc[i] += x[i];
}

void cpu_scale(real *x, real s, size_t n) {
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

// Summed in fixed blocks of 4096, then the block sums in order: the result depends
// only on n, never on the thread count.
double cpu_sumsq(const real *x, size_t n) {
    const size_t BS = 4096;
    size_t nb = (n + BS - 1) / BS;
    if (nb == 0) return 0.0;
    double *part = lm_malloc(nb * sizeof(double));
    #pragma omp parallel for schedule(static)
    for (size_t b = 0; b < nb; b++) {
        double s = 0;
        size_t end = (b + 1) * BS < n ? (b + 1) * BS : n;
        for (size_t i = b * BS; i < end; i++) s += (double)x[i] * (double)x[i];
        part[b] = s;
    }
    double s = 0;
    for (size_t b = 0; b < nb; b++) s += part[b];
    free(part);
    return s;
}

int cpu_all_finite(const real *x, size_t n) {
    int ok = 1;
    #pragma omp parallel for schedule(static) reduction(&& : ok)
    for (size_t i = 0; i < n; i++) ok = ok && isfinite(x[i]);
    return ok;
}
