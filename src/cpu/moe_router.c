// moe_router.c — the sigmoid top-k router with a selection-only balancing bias.
//
// Selection uses the biased score s + b; the gates use the raw score s only, so the
// bias (a balancing control, not a parameter) never reaches the gate values or any
// gradient. The router also returns alpha, the (k+1)-th biased score of each token:
// the cutoff an expert's biased score has to beat to enter that token's top-k, which
// Quantile Balancing needs (reference/moe.md §4.2).
#include "cpu.h"

// the largest k the router supports (K3 uses 16); bounds a per-token stack list
#define MOE_MAX_TOPK 63

// z, s [N,E]; bias [E] (NULL = zeros); idx, gate [N,k]; alpha [N].
// Per token, the k+1 largest biased scores are kept in a list sorted by value
// descending. Experts are scanned in increasing index and a newcomer is placed only
// after every entry of equal value, so ties go to the lower expert index.
// When k == E there is no (k+1)-th score; alpha is then the k-th (smallest) biased
// score minus 1, a value below every biased score: every expert counts as "in", and
// the QB margins alpha − s stay finite (any below the histogram range clamp into its
// lowest bin).
void cpu_moe_route_fwd(int *idx, real *gate, real *s, real *alpha, const real *z, const real *bias,
                       int N, int E, int k, real route_scale, int renorm) {
    LM_CHECK(k >= 1 && k <= E && k <= MOE_MAX_TOPK, "moe_route: need 1 <= k <= min(E, %d), got k=%d E=%d",
             MOE_MAX_TOPK, k, E);
    const int m = k < E ? k + 1 : E;   // list length
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const real *zi = z + (size_t)i * E;
        real *si = s + (size_t)i * E;
        int top[MOE_MAX_TOPK + 1] = {0};
        real val[MOE_MAX_TOPK + 1] = {0};
        int len = 0;
        for (int j = 0; j < E; j++) {
            real sj = lm_sigmoid(zi[j]);
            si[j] = sj;
            real v = sj + (bias ? bias[j] : 0);
            if (len == m && !(v > val[m - 1])) continue;   // not strictly better than the last kept
            int p = len < m ? len : m - 1;                 // slot freed at the end
            while (p > 0 && v > val[p - 1]) {              // strict: equal values keep their place
                val[p] = val[p - 1];
                top[p] = top[p - 1];
                p--;
            }
            val[p] = v;
            top[p] = j;
            if (len < m) len++;
        }
        alpha[i] = k < E ? val[k] : val[k - 1] - 1;
        // gates from the raw scores of the first k, summed in slot order
        real sum = 0;
        for (int t = 0; t < k; t++) sum += si[top[t]];
        for (int t = 0; t < k; t++) {
            idx[(size_t)i * k + t] = top[t];
            real st = si[top[t]];
            gate[(size_t)i * k + t] = renorm ? route_scale * (st / sum) : route_scale * st;
        }
    }
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
