// attnres.c — the Block Attention Residuals mixer (SPEC §1.4, reference/attnres.md §5–6.1).
//
// Per token, over n sources u_j (rows of [N,C] tensors) with the effective query q = γ⊙w:
//   ρ_j = (mean_c u_jc² + eps)^-1/2,  s_j = ρ_j (q·u_j),  α = softmax_j(s),  out = Σ_j α_j u_j.
// The RMSNorm lives only on the key path; the values are the raw sources, so sources of
// very different magnitude (embedding, block sums, a young partial sum) compete on
// direction alone but are mixed at their true scale. No 1/sqrt(C) temperature: the
// sharpness is carried by the learned size of q.
#include "cpu.h"

// channels per task in the ∂q reduction: each task owns a disjoint channel range and
// sums tokens and sources in a fixed order, so ∂w/∂γ do not depend on the thread count
#define DQ_BLOCK 64

// rho, s [n]: ρ_j and s_j of one token; u[j] points at the token's row of source j
static void scores(real *rho, real *s, const real *const *u, int n, const real *w, const real *gamma,
                   int C, real eps) {
    for (int j = 0; j < n; j++) {
        const real *x = u[j];
        real ss = 0, dot = 0;
        for (int c = 0; c < C; c++) {
            ss += x[c] * x[c];
            dot += gamma[c] * w[c] * x[c];
        }
        rho[j] = 1 / sqrt(ss / C + eps);
        s[j] = rho[j] * dot;
    }
}

// out [N,C]; alpha [N,n]; src.p[j] [N,C] for j < n = src.n; w, gamma [C].
// out may alias a source: each out[c] is written after every u_j[c] has been read.
void cpu_attnres_fwd(real *out, real *alpha, lm_sources src, const real *w, const real *gamma, int N, int C,
                     real eps) {
    const int n = src.n;
    LM_ASSERT(n >= 1 && n <= LM_MAX_SOURCES);
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const size_t row = (size_t)i * C;
        real *y = out + row;
        if (n == 1) {   // one source: softmax over one score is exactly 1, out = u_0
            alpha[i] = 1;
            const real *x = src.p[0] + row;
            for (int c = 0; c < C; c++) y[c] = x[c];
            continue;
        }
        const real *u[LM_MAX_SOURCES];
        real rho[LM_MAX_SOURCES], s[LM_MAX_SOURCES];
        for (int j = 0; j < n; j++) u[j] = src.p[j] + row;
        scores(rho, s, u, n, w, gamma, C, eps);
        real m = s[0], sum = 0;
        for (int j = 1; j < n; j++) m = s[j] > m ? s[j] : m;
        for (int j = 0; j < n; j++) { s[j] = exp(s[j] - m); sum += s[j]; }
        real *a = alpha + (size_t)i * n;
        for (int j = 0; j < n; j++) a[j] = s[j] / sum;
        for (int c = 0; c < C; c++) {
            real acc = 0;
            for (int j = 0; j < n; j++) acc += a[j] * u[j][c];
            y[c] = acc;
        }
    }
}

// dsrc.p[j] [N,C] += ∂L/∂u_j for j < dsrc.n (dsrc.n ≤ src.n; NULL entries skipped; = where
// bit j of dsrc.assign is set);
// dw, dgamma [C] += ∂L/∂w, ∂L/∂γ (NULL allowed); dout [N,C] = g; alpha [N,n] from the forward.
// Per token (attnres.md §6.1), with t_j = g·u_j and c_j = ∂L/∂s_j = α_j (t_j − Σ_l α_l t_l):
//   ∂u_j = α_j g + c_j (ρ_j q − (s_j ρ_j² / C) u_j)      (value path + RMSNorm key path)
//   ∂q   = Σ_tokens Σ_j c_j ρ_j u_j,   ∂w = ∂q ⊙ γ,   ∂γ = ∂q ⊙ w
// ρ and s are recomputed from the sources (one pass that also yields t_j).
// Two dsrc entries may point at the same buffer (a tensor listed twice) and dout may be
// one of the dsrc buffers: all coefficients of a token are computed before any write, and
// each element is updated source by source with g read once, so every += lands.
// dsrc must not alias a source tensor.
void cpu_attnres_bwd(lm_source_grads dsrc, real *dw, real *dgamma, const real *dout, lm_sources src,
                     const real *alpha, const real *w, const real *gamma, int N, int C, real eps) {
    const int n = src.n;
    LM_ASSERT(n >= 1 && n <= LM_MAX_SOURCES && dsrc.n >= 0 && dsrc.n <= n);
    int any_dsrc = 0;
    for (int j = 0; j < dsrc.n; j++) any_dsrc |= dsrc.p[j] != NULL;
    const int want_dq = dw != NULL || dgamma != NULL;
    if (N <= 0 || (!any_dsrc && !want_dq)) return;
    // cq [N,n] = c_j ρ_j per token, kept for the ∂q reduction over tokens below
    real *cq = want_dq ? lm_malloc((size_t)N * n * sizeof(real)) : NULL;

    #pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const size_t row = (size_t)i * C;
        const real *g = dout + row, *a = alpha + (size_t)i * n;
        const real *u[LM_MAX_SOURCES];
        real rho[LM_MAX_SOURCES], s[LM_MAX_SOURCES], t[LM_MAX_SOURCES];
        real kq[LM_MAX_SOURCES], ku[LM_MAX_SOURCES];   // coefficients of q and u_j in ∂u_j
        for (int j = 0; j < n; j++) {
            u[j] = src.p[j] + row;
            real dot = 0;
            for (int c = 0; c < C; c++) dot += g[c] * u[j][c];
            t[j] = dot;
        }
        scores(rho, s, u, n, w, gamma, C, eps);
        real gout = 0;   // g·out = Σ α_l t_l, without reading out
        for (int j = 0; j < n; j++) gout += a[j] * t[j];
        for (int j = 0; j < n; j++) {
            real cj = a[j] * (t[j] - gout);
            kq[j] = cj * rho[j];
            ku[j] = cj * s[j] * rho[j] * rho[j] / C;
            if (cq) cq[(size_t)i * n + j] = kq[j];
        }
        if (!any_dsrc) continue;
        for (int c = 0; c < C; c++) {
            const real gc = g[c], qc = gamma[c] * w[c];
            for (int j = 0; j < dsrc.n; j++) {
                if (!dsrc.p[j]) continue;
                const real v = a[j] * gc + kq[j] * qc - ku[j] * u[j][c];
                if (dsrc.assign >> j & 1) dsrc.p[j][row + c] = v;
                else dsrc.p[j][row + c] += v;
            }
        }
    }

    if (want_dq) {
        const int nblk = lm_cdiv(C, DQ_BLOCK);
        #pragma omp parallel for schedule(static)
        for (int b = 0; b < nblk; b++) {
            const int c0 = b * DQ_BLOCK, c1 = lm_min(C, c0 + DQ_BLOCK);
            real dq[DQ_BLOCK] = {0};
            for (int i = 0; i < N; i++)
                for (int j = 0; j < n; j++) {
                    const real k = cq[(size_t)i * n + j];
                    const real *x = src.p[j] + (size_t)i * C;
                    for (int c = c0; c < c1; c++) dq[c - c0] += k * x[c];
                }
            for (int c = c0; c < c1; c++) {
                if (dw) dw[c] += dq[c - c0] * gamma[c];
                if (dgamma) dgamma[c] += dq[c - c0] * w[c];
            }
        }
        free(cq);
    }
}

// The mixer and the RMSNorm of its output, in turn: x [N,C] keeps the mix for the backward,
// dx [N,C] takes its gradient. The reference for the CUDA backend's fused kernels.
void cpu_attnres_norm_fwd(real *xn, real *rstd, void *lo, real *alpha, real *x, lm_sources src, const real *w,
                          const real *gamma, const real *gain, int N, int C, real eps) {
    cpu_attnres_fwd(x, alpha, src, w, gamma, N, C, eps);
    cpu_rmsnorm_fwd(xn, rstd, x, gain, N, C, eps, lo);
}

void cpu_attnres_norm_bwd(lm_source_grads dsrc, real *dw, real *dgamma, real *dgain, real *dx, const real *dxn,
                          const real *x, lm_sources src, const real *alpha, const real *rstd, const real *w,
                          const real *gamma, const real *gain, int N, int C, real eps) {
    cpu_rmsnorm_bwd(dx, dgain, dxn, x, gain, rstd, N, C, 1);
    cpu_attnres_bwd(dsrc, dw, dgamma, dx, src, alpha, w, gamma, N, C, eps);
}
