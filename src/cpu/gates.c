// gates.c — sigmoid output gate (gated MLA) and the GLU activations of the FFNs.
#include "cpu.h"

void cpu_sigmoid_gate_fwd(real *out, const real *x, const real *z, size_t n) {
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = x[i] * lm_sigmoid(z[i]);
}

void cpu_sigmoid_gate_bwd(real *dx, real *dz, const real *dout, const real *x, const real *z, size_t n) {
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        real s = lm_sigmoid(z[i]);
        if (dx) dx[i] += dout[i] * s;
        if (dz) dz[i] += dout[i] * x[i] * s * (1 - s);
    }
}

// SiTU-GLU (Kimi K3): h = [b1·tanh(g/b1)·σ(g)] · [b2·tanh(u/b2)], b1 = 4, b2 = 25;
// equal to SwiGLU to first order near 0 and bounded by b1·b2 = 100.
#define SITU_B1 4.0
#define SITU_B2 25.0

void cpu_glu_fwd(real *h, const real *g, const real *u, size_t n, int act) {
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        if (act == LM_ACT_SITU)
            h[i] = (real)SITU_B1 * tanh(g[i] / (real)SITU_B1) * lm_sigmoid(g[i]) *
                   ((real)SITU_B2 * tanh(u[i] / (real)SITU_B2));
        else
            h[i] = lm_silu(g[i]) * u[i];
    }
}

void cpu_glu_bwd(real *dg, real *du, const real *dh, const real *g, const real *u, size_t n, int act) {
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        real s = lm_sigmoid(g[i]);
        real ag, dag, bu, dbu;   // act(g), act'(g), gate-side of u and its derivative
        if (act == LM_ACT_SITU) {
            real tg = tanh(g[i] / (real)SITU_B1), tu = tanh(u[i] / (real)SITU_B2);
            ag = (real)SITU_B1 * tg * s;
            dag = (1 - tg * tg) * s + (real)SITU_B1 * tg * s * (1 - s);
            bu = (real)SITU_B2 * tu;
            dbu = 1 - tu * tu;
        } else {
            ag = g[i] * s;
            dag = s * (1 + g[i] * (1 - s));
            bu = u[i];
            dbu = 1;
        }
        if (dg) dg[i] += dh[i] * bu * dag;
        if (du) du[i] += dh[i] * ag * dbu;
    }
}
