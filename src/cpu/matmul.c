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

// linears of one input (lm_linears): the loop the op interface describes
// (out_i = res_i + the product: the product first, then the same sum an add op would form)
void cpu_linears_fwd(const lm_linears *L, const real *inp, int N, int C) {
    for (int i = 0; i < L->n; i++) {
        real *out = L->out[i];
        const real *res = L->res[i];
        LM_CHECK(!res || res != out, "linears_fwd: res aliases its output");
        cpu_matmul_fwd(out, inp, L->W[i], NULL, N, C, L->OC[i]);
        if (res) cpu_add(out, res, out, (size_t)N * L->OC[i]);
    }
}
void cpu_linears_bwd(const lm_linears *L, real *dinp, const real *inp, int N, int C) {
    if (L->dinp_assign && dinp) memset(dinp, 0, (size_t)N * C * sizeof(real));   // written = added onto zeros
    for (int i = 0; i < L->n; i++) cpu_matmul_bwd(dinp, L->dW[i], NULL, L->dout[i], inp, L->W[i], N, C, L->OC[i]);
}
