// optim.c — AdamW and Muon (Newton–Schulz orthogonalised momentum) updates.
#include "cpu.h"
#include <cblas.h>

#ifdef LM_DOUBLE
#define GEMM cblas_dgemm
#else
#define GEMM cblas_sgemm
#endif

void cpu_adamw(real *p, const real *g, real *m, real *v, const lm_adamw_span *spans, int nspans, real lr, real b1,
               real b2, real eps, real bc1, real bc2, real gscale) {
    for (int s = 0; s < nspans; s++) {
        const size_t o = spans[s].offset, n = spans[s].n;
        const real wd = spans[s].wd;
        #pragma omp parallel for schedule(static)
        for (size_t i = o; i < o + n; i++) {
            const real gi = g[i] * gscale;   // rounded as a separate scaling pass would round it
            m[i] = b1 * m[i] + (1 - b1) * gi;
            v[i] = b2 * v[i] + (1 - b2) * gi * gi;
            real mh = m[i] / bc1, vh = v[i] / bc2;
            p[i] -= lr * (mh / (sqrt(vh) + eps) + wd * p[i]);
        }
    }
}

// Quintic Newton–Schulz iteration (Keller Jordan's coefficients) on X [r, c], r ≤ c:
//   A = X Xᵀ;  X ← a·X + (b·A + c·A²)·X, five times, after X ← X / ‖X‖_F.
static void newton_schulz5(real *X, int r, int c, real *A, real *A2, real *T) {
    const real a = 3.4445, b = -4.7750, cc = 2.0315;
    double nrm = 0;
    for (size_t i = 0; i < (size_t)r * c; i++) nrm += (double)X[i] * X[i];
    real inv = (real)(1.0 / (sqrt(nrm) + 1e-7));
    for (size_t i = 0; i < (size_t)r * c; i++) X[i] *= inv;
    for (int it = 0; it < 5; it++) {
        GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, r, r, c, 1, X, c, X, c, 0, A, r);
        GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, r, r, r, 1, A, r, A, r, 0, A2, r);
        for (size_t i = 0; i < (size_t)r * r; i++) A2[i] = b * A[i] + cc * A2[i];
        memcpy(T, X, (size_t)r * c * sizeof(real));
        GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, r, c, r, 1, A2, r, T, c, a, X, c);
    }
}

// p, g, m [count, rows, cols]. The update is scaled by 0.2·sqrt(max(rows, cols)) so
// its RMS matches AdamW's (Moonlight convention); weight decay is decoupled.
void cpu_muon(real *p, const real *g, real *m, int count, int rows, int cols, real lr, real mu, real wd) {
    int r = rows < cols ? rows : cols, c = rows < cols ? cols : rows;
    size_t mn = (size_t)rows * cols;
    real *X = lm_malloc(mn * sizeof(real)), *T = lm_malloc(mn * sizeof(real));
    real *A = lm_malloc((size_t)r * r * sizeof(real)), *A2 = lm_malloc((size_t)r * r * sizeof(real));
    real sc = (real)0.2 * sqrt((real)(rows > cols ? rows : cols));
    for (int e = 0; e < count; e++) {
        real *pe = p + e * mn, *me = m + e * mn;
        const real *ge = g + e * mn;
        for (size_t i = 0; i < mn; i++) me[i] = mu * me[i] + ge[i];
        // Nesterov look-ahead, stored transposed when rows > cols so that r ≤ c
        for (int i = 0; i < rows; i++)
            for (int j = 0; j < cols; j++) {
                size_t s = (size_t)i * cols + j;
                size_t d = rows <= cols ? s : (size_t)j * rows + i;
                X[d] = ge[s] + mu * me[s];
            }
        newton_schulz5(X, r, c, A, A2, T);
        for (int i = 0; i < rows; i++)
            for (int j = 0; j < cols; j++) {
                size_t s = (size_t)i * cols + j;
                size_t d = rows <= cols ? s : (size_t)j * rows + i;
                pe[s] -= lr * (sc * X[d] + wd * pe[s]);
            }
    }
    free(X); free(T); free(A); free(A2);
}
