// matmul.c — the linear layer through BLAS (OpenBLAS, OpenMP build).
#include "cpu.h"
#include <cblas.h>

#ifdef LM_DOUBLE
#define GEMM cblas_dgemm
#else
#define GEMM cblas_sgemm
#endif

// out [N,OC] = inp [N,C] · W [OC,C]ᵀ + bias [OC]
void cpu_matmul_fwd(real *out, const real *inp, const real *W, const real *bias, int N, int C, int OC) {
    if (N == 0) return;
    GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1, inp, C, W, C, 0, out, OC);
    if (bias) {
        #pragma omp parallel for schedule(static)
        for (int i = 0; i < N; i++)
            for (int o = 0; o < OC; o++) out[(size_t)i * OC + o] += bias[o];
    }
}

// dinp [N,C] += dout · W ; dW [OC,C] += doutᵀ · inp ; dbias [OC] += Σ_rows dout
void cpu_matmul_bwd(real *dinp, real *dW, real *dbias, const real *dout, const real *inp, const real *W,
                    int N, int C, int OC) {
    if (N == 0) return;
    if (dinp) GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1, dout, OC, W, C, 1, dinp, C);
    if (dW) GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1, dout, OC, inp, C, 1, dW, C);
    if (dbias) {
        #pragma omp parallel for schedule(static)
        for (int o = 0; o < OC; o++) {
            real s = 0;
            for (int i = 0; i < N; i++) s += dout[(size_t)i * OC + o];
            dbias[o] += s;
        }
    }
}
