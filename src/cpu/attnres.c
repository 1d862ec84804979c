// attnres.c — NOT YET IMPLEMENTED (placeholder so the tree links).
#include "cpu.h"

void cpu_attnres_fwd(real *out, real *alpha, lm_sources src, const real *w, const real *gamma, int N, int C, real eps) {
    (void)out; (void)alpha; (void)src; (void)w; (void)gamma; (void)N; (void)C; (void)eps;
    lm_die("cpu_attnres_fwd: not implemented");
}

void cpu_attnres_bwd(lm_source_grads dsrc, real *dw, real *dgamma, const real *dout, lm_sources src, const real *alpha, const real *w, const real *gamma, int N, int C, real eps) {
    (void)dsrc; (void)dw; (void)dgamma; (void)dout; (void)src; (void)alpha; (void)w; (void)gamma; (void)N; (void)C; (void)eps;
    lm_die("cpu_attnres_bwd: not implemented");
}
