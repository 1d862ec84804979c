// ops_math.h — math that both backends run, written once: the router's per-token
// top-(k+1) selection and gates, and the GLU activations with their derivatives.
// Compiles as C11 (CPU backend, `real` = float or double) and as CUDA device code
// (`real` = float; exp/tanh resolve to the float overloads).
#ifndef LM_OPS_MATH_H
#define LM_OPS_MATH_H
#include "ops.h"
#include <math.h>

#ifdef __CUDACC__
#define LM_HD static __host__ __device__ __forceinline__
#else
#define LM_HD static inline
#endif

#define LM_MAX_TOPK 63           // the largest k the router supports (K3 uses 16)
#define LM_SITU_B1 ((real)4)     // SiTU-GLU caps (Kimi K3)
#define LM_SITU_B2 ((real)25)

LM_HD real lm_sigm(real x) { return (real)1 / ((real)1 + exp(-x)); }

// One token of the router. z, s [E]: logits in, sigmoid scores out; bias [E] or NULL.
// The k+1 largest biased scores are kept in a list sorted by value, descending; experts
// are scanned in increasing index and a newcomer is placed after every entry of equal
// value, so ties go to the lower expert index. A NaN biased score ranks as −inf (below
// every number, then by index): the order stays total, so the CUDA warp router's parallel
// argmax agrees with this scan and never picks an expert twice. idx, gate [k]; *alpha = the
// (k+1)-th biased score (as ranked), or (k == E) the k-th minus 1, below every biased score.
// Gates use the raw scores only, summed in slot order.
LM_HD void lm_route_token(int *idx, real *gate, real *s, real *alpha, const real *z, const real *bias, int E, int k,
                          real route_scale, int renorm) {
    const int m = k < E ? k + 1 : E;
    int top[LM_MAX_TOPK + 1];
    real val[LM_MAX_TOPK + 1];
    int len = 0;
    for (int j = 0; j < E; j++) {
        real sj = lm_sigm(z[j]);
        s[j] = sj;
        real v = sj + (bias ? bias[j] : 0);
        if (v != v) v = -(real)INFINITY;   // NaN ranks last
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
    *alpha = k < E ? val[k] : val[k - 1] - 1;
    real sum = 0;
    for (int t = 0; t < k; t++) sum += s[top[t]];
    for (int t = 0; t < k; t++) {
        idx[t] = top[t];
        gate[t] = renorm ? route_scale * (s[top[t]] / sum) : route_scale * s[top[t]];
    }
}

// GLU h = a(g)·b(u): SwiGLU a = g·σ(g), b = u; SiTU a = b1·tanh(g/b1)·σ(g), b = b2·tanh(u/b2).
// Fills a, a' = da/dg, b, b' = db/du.
LM_HD void lm_glu_parts(real g, real u, int act, real *a, real *da, real *b, real *db) {
    real s = lm_sigm(g);
    if (act == LM_ACT_SITU) {
        real tg = tanh(g / LM_SITU_B1), tu = tanh(u / LM_SITU_B2);
        *a = LM_SITU_B1 * tg * s;
        *da = (1 - tg * tg) * s + LM_SITU_B1 * tg * s * (1 - s);
        *b = LM_SITU_B2 * tu;
        *db = 1 - tu * tu;
    } else {
        *a = g * s;
        *da = s * (1 + g * (1 - s));
        *b = u;
        *db = 1;
    }
}

#endif
