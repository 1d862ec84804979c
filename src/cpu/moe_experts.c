// moe_experts.c — NOT YET IMPLEMENTED (placeholder so the tree links).
#include "cpu.h"

void cpu_moe_plan(int *counts, int *offsets, int *row_token, int *slot_row, const int *idx, const real *s, int N, int E, int k, int capacity) {
    (void)counts; (void)offsets; (void)row_token; (void)slot_row; (void)idx; (void)s; (void)N; (void)E; (void)k; (void)capacity;
    lm_die("cpu_moe_plan: not implemented");
}

void cpu_moe_gather_fwd(real *xp, const real *x, const int *row_token, const int *offsets, int E, int C) {
    (void)xp; (void)x; (void)row_token; (void)offsets; (void)E; (void)C;
    lm_die("cpu_moe_gather_fwd: not implemented");
}

void cpu_moe_gather_bwd(real *dx, const real *dxp, const int *row_token, const int *offsets, int E, int C) {
    (void)dx; (void)dxp; (void)row_token; (void)offsets; (void)E; (void)C;
    lm_die("cpu_moe_gather_bwd: not implemented");
}

void cpu_grouped_matmul_fwd(real *out, const real *inp, const real *W, const int *offsets, int E, int C, int OC) {
    (void)out; (void)inp; (void)W; (void)offsets; (void)E; (void)C; (void)OC;
    lm_die("cpu_grouped_matmul_fwd: not implemented");
}

void cpu_grouped_matmul_bwd(real *dinp, real *dW, const real *dout, const real *inp, const real *W, const int *offsets, int E, int C, int OC) {
    (void)dinp; (void)dW; (void)dout; (void)inp; (void)W; (void)offsets; (void)E; (void)C; (void)OC;
    lm_die("cpu_grouped_matmul_bwd: not implemented");
}

void cpu_moe_combine_fwd(real *y, const real *yp, const real *gate, const int *slot_row, int N, int k, int C) {
    (void)y; (void)yp; (void)gate; (void)slot_row; (void)N; (void)k; (void)C;
    lm_die("cpu_moe_combine_fwd: not implemented");
}

void cpu_moe_combine_bwd(real *dyp, real *dgate, const real *dy, const real *yp, const real *gate, const int *slot_row, int N, int k, int C) {
    (void)dyp; (void)dgate; (void)dy; (void)yp; (void)gate; (void)slot_row; (void)N; (void)k; (void)C;
    lm_die("cpu_moe_combine_bwd: not implemented");
}
