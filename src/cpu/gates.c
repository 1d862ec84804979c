// gates.c — sigmoid output gate (gated MLA) and the GLU activations of the FFNs.
#include "cpu.h"
#include "ops_math.h"

void cpu_sigmoid_gate_fwd(real *out, const real *x, const real *z, size_t n, void *lo) {   // (lo unused)
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = x[i] * lm_sigmoid(z[i]);
}

void cpu_sigmoid_gate_bwd(real *dx, real *dz, const real *dout, const real *x, const real *z, size_t n, int assign) {
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        real s = lm_sigmoid(z[i]), gx = dout[i] * s, gz = dout[i] * x[i] * s * (1 - s);
        if (dx) dx[i] = assign ? gx : dx[i] + gx;
        if (dz) dz[i] = assign ? gz : dz[i] + gz;
    }
}

// GLU h = a(g)·b(u) (SwiGLU or Kimi K3's SiTU-GLU, bounded by 4·25 = 100): the scalar
// parts come from lm_glu_parts (ops_math.h, shared with the CUDA backend).
void cpu_glu_fwd(real *h, const real *g, const real *u, size_t n, int act, void *lo) {
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        real a, da, b, db;
        lm_glu_parts(g[i], u[i], act, &a, &da, &b, &db);
        h[i] = a * b;
    }
}

void cpu_glu_bwd(real *dg, real *du, const real *dh, const real *g, const real *u, size_t n, int act) {
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        real a, da, b, db;
        lm_glu_parts(g[i], u[i], act, &a, &da, &b, &db);
        if (dg) dg[i] += dh[i] * b * da;
        if (du) du[i] += dh[i] * a * db;
    }
}
