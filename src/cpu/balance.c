// balance.c — load-balancing statistics and losses of the router: the Quantile
// Balancing margin histogram, the Switch-style auxiliary loss, and the router z-loss.
#include "cpu.h"

// hist [E, nbins] += counts of r_ij = alpha_i − s_ij; s [N,E], alpha [N].
// Bin b covers [lo + b·width, lo + (b+1)·width); values below lo (and NaN) go to bin 0,
// values at or above the top edge to bin nbins−1. Threads own blocks of experts, so
// every histogram row is written by one thread (counts are integers: exact anyway).
#define QB_HIST_EB 8
void cpu_qb_hist_accum(int *hist, const real *s, const real *alpha, real lo, real width,
                       int N, int E, int nbins) {
    const int nblk = lm_cdiv(E, QB_HIST_EB);
    const real inv = 1 / width;
    #pragma omp parallel for schedule(static)
    for (int b = 0; b < nblk; b++) {
        int j0 = b * QB_HIST_EB, j1 = lm_min(E, j0 + QB_HIST_EB);
        for (int i = 0; i < N; i++) {
            const real *si = s + (size_t)i * E;
            for (int j = j0; j < j1; j++) {
                real t = (alpha[i] - si[j] - lo) * inv;
                int bin = t >= (real)nbins ? nbins - 1 : (t >= 1 ? (int)t : 0);
                hist[(size_t)j * nbins + bin]++;
            }
        }
    }
}

// sel [E, 3] = per expert the first bin where the row's cumulative count reaches target
// (ops.h qb_hist_select)
void cpu_qb_hist_select(int *sel, const int *hist, int E, int nbins, int target) {
    LM_CHECK(nbins > 0 && target >= 1, "qb_hist_select: nbins %d, target %d", nbins, target);
    for (int j = 0; j < E; j++) {
        const int *row = hist + (size_t)j * nbins;
        int h = 0, before = 0;
        while (h < nbins && before + row[h] < target) before += row[h++];
        sel[3 * j] = h;
        sel[3 * j + 1] = before;
        sel[3 * j + 2] = h < nbins ? row[h] : 0;
    }
}

// Switch-style balance loss L = coef · E · Σ_j f_j P_j over s [N,E] with
// f_j = counts_j / (N·k) (a constant: the top-k indicator has no gradient) and
// P_j = (1/N) Σ_i s_ij / S_i, S_i = Σ_l s_il. Summed token by token in index order.
double cpu_moe_aux_fwd(const real *s, const int *counts, int N, int E, int k, real coef) {
    if (N == 0) return 0;
    double acc = 0;
    for (int i = 0; i < N; i++) {
        const real *si = s + (size_t)i * E;
        double S = 0, fs = 0;
        for (int j = 0; j < E; j++) {
            S += si[j];
            fs += (double)counts[j] * si[j];
        }
        acc += fs / S;   // Σ_j counts_j · s_ij / S_i
    }
    return (double)coef * E * acc / ((double)N * N * k);
}

// dz [N,E] += dloss · ∂L/∂z. With c = coef·E/N and F_i = Σ_l f_l s_il:
//   ∂L/∂s_ij = c · (f_j − F_i / S_i) / S_i,  ∂s/∂z = s(1 − s)
void cpu_moe_aux_bwd(real *dz, const real *s, const int *counts, int N, int E, int k, real coef, real dloss) {
    if (!dz || N == 0) return;
    const real c = dloss * coef * E / N;
    const real fscale = (real)1 / ((real)N * k);
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const real *si = s + (size_t)i * E;
        real S = 0, F = 0;
        for (int j = 0; j < E; j++) {
            S += si[j];
            F += counts[j] * fscale * si[j];
        }
        for (int j = 0; j < E; j++) {
            real ds = c * (counts[j] * fscale - F / S) / S;
            dz[(size_t)i * E + j] += ds * si[j] * (1 - si[j]);
        }
    }
}

// log Σ_j exp(z_j) of one row of E logits, shifted by the max for range safety
static real row_lse(const real *z, int E) {
    real m = z[0];
    for (int j = 1; j < E; j++) m = z[j] > m ? z[j] : m;
    real sum = 0;
    for (int j = 0; j < E; j++) sum += exp(z[j] - m);
    return m + log(sum);
}

// router z-loss L = coef · mean_i lse_i², z [N,E]; summed in token order
double cpu_moe_zloss_fwd(const real *z, int N, int E, real coef) {
    if (N == 0) return 0;
    double acc = 0;
    for (int i = 0; i < N; i++) {
        double l = row_lse(z + (size_t)i * E, E);
        acc += l * l;
    }
    return (double)coef * acc / N;
}

// dz += dloss · coef · (2 lse_i / N) · softmax(z_i)
void cpu_moe_zloss_bwd(real *dz, const real *z, int N, int E, real coef, real dloss) {
    if (!dz || N == 0) return;
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const real *zi = z + (size_t)i * E;
        real l = row_lse(zi, E);
        real c = dloss * coef * 2 * l / N;
        for (int j = 0; j < E; j++) dz[(size_t)i * E + j] += c * exp(zi[j] - l);
    }
}
