// norm.c — RMSNorm with gain, and the headwise gated RMSNorm of the KDA output.
#include "cpu.h"

// out, inp [N,C]; gain [C]; rstd [N]; lo unused (the CPU's linears read out itself)
void cpu_rmsnorm_fwd(real *out, real *rstd, const real *inp, const real *gain, int N, int C, real eps, void *lo) {
    LM_CHECK(out, "rmsnorm_fwd: no output (this backend keeps no GEMM-precision copies)");
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const real *x = inp + (size_t)i * C;
        real *y = out + (size_t)i * C;
        real ss = 0;
        for (int c = 0; c < C; c++) ss += x[c] * x[c];
        real r = 1 / sqrt(ss / C + eps);
        rstd[i] = r;
        for (int c = 0; c < C; c++) y[c] = x[c] * r * gain[c];
    }
}

// With y = g·x·r, r = (mean x² + eps)^-1/2:
//   dx = r·g⊙dy − (r³/C)·x·Σ_c(dy·g·x),  dgain = Σ_rows dy·x·r
void cpu_rmsnorm_bwd(real *dinp, real *dgain, const real *dout, const real *inp, const real *gain,
                     const real *rstd, int N, int C, int assign) {
    if (dinp) {
        #pragma omp parallel for schedule(static)
        for (int i = 0; i < N; i++) {
            const real *x = inp + (size_t)i * C, *dy = dout + (size_t)i * C;
            real *dx = dinp + (size_t)i * C;
            real r = rstd[i], dot = 0;
            for (int c = 0; c < C; c++) dot += dy[c] * gain[c] * x[c];
            real k = r * r * r * dot / C;
            if (assign) memset(dx, 0, (size_t)C * sizeof(real));   // written = added onto zeros
            for (int c = 0; c < C; c++) dx[c] += r * gain[c] * dy[c] - k * x[c];
        }
    }
    if (dgain) {
        #pragma omp parallel for schedule(static)
        for (int c = 0; c < C; c++) {
            real s = 0;
            for (int i = 0; i < N; i++) s += dout[(size_t)i * C + c] * inp[(size_t)i * C + c] * rstd[i];
            dgain[c] += s;
        }
    }
}

// x, z, out [N, H·V]; w [V]; rstd [N·H]: out = x·rstd·w ⊙ sigmoid(z), per head
void cpu_gated_rmsnorm_fwd(real *out, real *rstd, const real *x, const real *z, const real *w,
                           int N, int H, int V, real eps, void *lo, const void *x_lo) {
    LM_CHECK(!x_lo, "cpu gated_rmsnorm_fwd: no GEMM-precision inputs on the CPU");
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < N * H; r++) {
        const real *xr = x + (size_t)r * V, *zr = z + (size_t)r * V;
        real *yr = out + (size_t)r * V;
        real ss = 0;
        for (int c = 0; c < V; c++) ss += xr[c] * xr[c];
        real rs = 1 / sqrt(ss / V + eps);
        rstd[r] = rs;
        for (int c = 0; c < V; c++) yr[c] = xr[c] * rs * w[c] * lm_sigmoid(zr[c]);
    }
}

// a = dy ⊙ σ(z) is the gradient of the normalised, scaled value; then the RMSNorm
// rule per head, and dz = dy · (x·r·w) · σ(z)(1 − σ(z)).
void cpu_gated_rmsnorm_bwd(real *dx, real *dz, real *dw, const real *dout, const real *x, const real *z,
                           const real *w, const real *rstd, int N, int H, int V, int assign, void *dx_lo,
                           void *dz_lo, const void *x_lo) {
    LM_CHECK(!dx_lo && !dz_lo && !x_lo, "cpu gated_rmsnorm_bwd: no GEMM-precision tensors on the CPU");
    if (assign) {   // written = added onto zeros
        if (dx) memset(dx, 0, (size_t)N * H * V * sizeof(real));
        if (dz) memset(dz, 0, (size_t)N * H * V * sizeof(real));
    }
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < N * H; r++) {
        const real *xr = x + (size_t)r * V, *zr = z + (size_t)r * V, *dy = dout + (size_t)r * V;
        real rs = rstd[r], dot = 0;
        for (int c = 0; c < V; c++) {
            real sg = lm_sigmoid(zr[c]);
            dot += dy[c] * sg * w[c] * xr[c];
            if (dz) dz[(size_t)r * V + c] += dy[c] * xr[c] * rs * w[c] * sg * (1 - sg);
        }
        if (dx) {
            real k = rs * rs * rs * dot / V;
            for (int c = 0; c < V; c++)
                dx[(size_t)r * V + c] += rs * w[c] * dy[c] * lm_sigmoid(zr[c]) - k * xr[c];
        }
    }
    if (dw) {
        #pragma omp parallel for schedule(static)
        for (int c = 0; c < V; c++) {
            real s = 0;
            for (int r = 0; r < N * H; r++) {
                size_t i = (size_t)r * V + c;
                s += dout[i] * lm_sigmoid(z[i]) * x[i] * rstd[r];
            }
            dw[c] += s;
        }
    }
}
