// moe_router.c — the sigmoid top-k router with a selection-only balancing bias.
//
// Selection uses the biased score s + b; the gates use the raw score s only, so the
// bias (a balancing control, not a parameter) never reaches the gate values or any
// gradient. The router also returns alpha, the (k+1)-th biased score of each token:
// the cutoff an expert's biased score has to beat to enter that token's top-k, which
// Quantile Balancing needs (reference/moe.md §4.2).
#include "cpu.h"
#include "ops_math.h"

// z, s [N,E]; bias [E] (NULL = zeros); idx, gate [N,k]; alpha [N]: one token at a time,
// lm_route_token (ops_math.h, shared with the CUDA backend).
void cpu_moe_route_fwd(int *idx, real *gate, real *s, real *alpha, const real *z, const real *bias,
                       int N, int E, int k, real route_scale, int renorm) {
    LM_CHECK(k >= 1 && k <= E && k <= LM_MAX_TOPK, "moe_route: need 1 <= k <= min(E, %d), got k=%d E=%d",
             LM_MAX_TOPK, k, E);
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++)
        lm_route_token(idx + (size_t)i * k, gate + (size_t)i * k, s + (size_t)i * E, alpha + i, z + (size_t)i * E,
                       bias, E, k, route_scale, renorm);
}

// dgate, idx [N,k]; s, dz [N,E]. With S = Σ_t s_t over the chosen experts,
//   renorm:  g_t = λ s_t / S  ⇒  ∂L/∂s_t = (λ/S) (dg_t − Σ_u dg_u s_u / S)
//   plain:   g_t = λ s_t      ⇒  ∂L/∂s_t = λ dg_t
// then dz += ∂L/∂s · s(1 − s). Experts that were not chosen get nothing (the
// selection is piecewise constant in z), and the bias is absent by construction.
void cpu_moe_route_bwd(real *dz, const real *dgate, const real *s, const int *idx,
                       int N, int E, int k, real route_scale, int renorm) {
    if (!dz) return;
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const real *si = s + (size_t)i * E;
        const real *dg = dgate + (size_t)i * k;
        const int *id = idx + (size_t)i * k;
        real *dzi = dz + (size_t)i * E;
        real sum = 0, dot = 0;
        for (int t = 0; t < k; t++) {
            sum += si[id[t]];
            dot += dg[t] * si[id[t]];
        }
        for (int t = 0; t < k; t++) {
            real st = si[id[t]];
            real ds = renorm ? route_scale / sum * (dg[t] - dot / sum) : route_scale * dg[t];
            dzi[id[t]] += ds * st * (1 - st);
        }
    }
}
