// balance.c — NOT YET IMPLEMENTED (placeholder so the tree links).
#include "cpu.h"

void cpu_qb_hist_accum(int *hist, const real *s, const real *alpha, real lo, real width, int N, int E, int nbins) {
    (void)hist; (void)s; (void)alpha; (void)lo; (void)width; (void)N; (void)E; (void)nbins;
    lm_die("cpu_qb_hist_accum: not implemented");
}

double cpu_moe_aux_fwd(const real *s, const int *counts, int N, int E, int k, real coef) {
    (void)s; (void)counts; (void)N; (void)E; (void)k; (void)coef;
    lm_die("cpu_moe_aux_fwd: not implemented");
}

void cpu_moe_aux_bwd(real *dz, const real *s, const int *counts, int N, int E, int k, real coef, real dloss) {
    (void)dz; (void)s; (void)counts; (void)N; (void)E; (void)k; (void)coef; (void)dloss;
    lm_die("cpu_moe_aux_bwd: not implemented");
}

double cpu_moe_zloss_fwd(const real *z, int N, int E, real coef) {
    (void)z; (void)N; (void)E; (void)coef;
    lm_die("cpu_moe_zloss_fwd: not implemented");
}

void cpu_moe_zloss_bwd(real *dz, const real *z, int N, int E, real coef, real dloss) {
    (void)dz; (void)z; (void)N; (void)E; (void)coef; (void)dloss;
    lm_die("cpu_moe_zloss_bwd: not implemented");
}
