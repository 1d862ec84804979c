// mla.c — the MLA attention core for training and prefill: per-head keys/values from
// the up-projected latent (mla_split) and causal softmax attention without positions
// (attn), computed blockwise with an online softmax in the flash-attention style so
// that no T×T matrix is ever materialised.
//
// Layout: q, k [B,T,H,Dqk], v, o [B,T,H,Dv]; one (b,h) head is a strided set of rows,
// each row contiguous. Inner loops are written as axpy over a contiguous dimension
// (keys of a block, or feature channels) so that they vectorise without reordering a
// float reduction: every result is a fixed sequence of operations, independent of the
// number of threads.
#include "cpu.h"

// queries and keys are cut into blocks of ATTN_BLOCK rows; the same size for both so
// that the diagonal block (i == j) starts at the same position for queries and keys
#define ATTN_BLOCK 64

// kv [N,H,Dn+Dv], kpe [N,De] → k [N,H,Dn+De], v [N,H,Dv]
void cpu_mla_split_fwd(real *k, real *v, const real *kv, const real *kpe, int N, int H, int Dn, int De, int Dv) {
    int Dkv = Dn + Dv, Dk = Dn + De;
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        for (int h = 0; h < H; h++) {
            const real *src = kv + ((size_t)n * H + h) * Dkv;
            real *kr = k + ((size_t)n * H + h) * Dk;
            memcpy(kr, src, (size_t)Dn * sizeof(real));
            if (De > 0) memcpy(kr + Dn, kpe + (size_t)n * De, (size_t)De * sizeof(real));   // kpe is NULL when De = 0
            memcpy(v + ((size_t)n * H + h) * Dv, src + Dn, (size_t)Dv * sizeof(real));
        }
    }
}

// dk [N,H,Dn+De], dv [N,H,Dv] (either may be NULL = zero) → dkv [N,H,Dn+Dv] +=,
// dkpe [N,De] += Σ_h dk[..., Dn:] (heads summed in order 0..H-1, the shared extra dims
// receive every head's gradient); assign: = instead of +=
void cpu_mla_split_bwd(real *dkv, real *dkpe, const real *dk, const real *dv, int N, int H, int Dn, int De, int Dv,
                       int assign) {
    int Dkv = Dn + Dv, Dk = Dn + De;
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        if (dkpe && assign)
            for (int d = 0; d < De; d++) dkpe[(size_t)n * De + d] = 0;
        for (int h = 0; h < H; h++) {
            const real *gk = dk ? dk + ((size_t)n * H + h) * Dk : NULL;
            const real *gv = dv ? dv + ((size_t)n * H + h) * Dv : NULL;
            if (dkv) {
                real *g = dkv + ((size_t)n * H + h) * Dkv;
                for (int d = 0; d < Dn; d++) g[d] = (assign ? 0 : g[d]) + (gk ? gk[d] : 0);
                for (int d = 0; d < Dv; d++) g[Dn + d] = (assign ? 0 : g[Dn + d]) + (gv ? gv[d] : 0);
            }
            if (dkpe && gk) {
                real *g = dkpe + (size_t)n * De;
                for (int d = 0; d < De; d++) g[d] += gk[Dn + d];
            }
        }
    }
}

// Kt [D, nk] ← rows s0..s0+nk-1 of one head of x (row stride ld): the keys of a block
// transposed, so that a query row's scores over the block are D contiguous axpys.
static void pack_transposed(real *Kt, const real *x, size_t ld, int s0, int nk, int D) {
    for (int c = 0; c < nk; c++) {
        const real *row = x + (size_t)(s0 + c) * ld;
        for (int d = 0; d < D; d++) Kt[(size_t)d * nk + c] = row[d];
    }
}

// s[0..nc) = scale · (qrow [D]) · Kt [D, nk] (first nc columns)
static void scores_row(real *s, const real *qrow, const real *Kt, int nk, int nc, int D, real scale) {
    for (int c = 0; c < nc; c++) s[c] = 0;
    for (int d = 0; d < D; d++) {
        real a = qrow[d];
        const real *kt = Kt + (size_t)d * nk;
        #pragma omp simd
        for (int c = 0; c < nc; c++) s[c] += a * kt[c];
    }
    for (int c = 0; c < nc; c++) s[c] *= scale;
}

// Forward, one task per (b, h, query block i): for each key block the block's queries see,
// the scores update a running max m, sum l and unnormalised output acc per query row:
//   m' = max(m, max_c s_c);  acc ← acc·e^{m−m'} + Σ_c e^{s_c−m'} v_c;  l ← l·e^{m−m'} + Σ_c e^{s_c−m'}
// then o = acc / l and lse = m + log l. Every row sees key 0 (block 0), so m is finite
// after the first block and no −∞ − (−∞) arises; a row that sees no key of a later block
// (possible only with a prefix) skips it.
// With a prefix of P positions: q, o [B,T,H,·]; k, v [B,P+T,H,·]; query t is position P + t
// and sees keys 0..P+t. P = 0 is plain causal attention (the same operations in the same
// order as without the prefix logic).
static void attn_fwd_prefix(real *o, real *lse, const real *q, const real *k, const real *v,
                            int B, int T, int P, int H, int Dqk, int Dv, real scale) {
    if (B == 0 || T == 0 || H == 0) return;
    const int BS = ATTN_BLOCK, nb = lm_cdiv(T, BS), Tk = P + T;
    const size_t ldq = (size_t)H * Dqk, ldv = (size_t)H * Dv;
    const long ntask = (long)B * H * nb;
    #pragma omp parallel
    {
        real *Kt = lm_malloc((size_t)Dqk * BS * sizeof(real));
        real *acc = lm_malloc((size_t)BS * Dv * sizeof(real));
        real *m = lm_malloc((size_t)BS * sizeof(real));
        real *l = lm_malloc((size_t)BS * sizeof(real));
        real *s = lm_malloc((size_t)BS * sizeof(real));
        #pragma omp for schedule(static)
        for (long task = 0; task < ntask; task++) {
            int i = (int)(task % nb), h = (int)(task / nb % H), b = (int)(task / nb / H);
            const real *qh = q + (size_t)b * T * ldq + (size_t)h * Dqk;
            const real *kh = k + (size_t)b * Tk * ldq + (size_t)h * Dqk;
            const real *vh = v + (size_t)b * Tk * ldv + (size_t)h * Dv;
            int t0 = i * BS, nq = lm_min(BS, T - t0), last = P + t0 + nq - 1;   // the block's last key
            for (int r = 0; r < nq; r++) m[r] = -INFINITY, l[r] = 0;
            memset(acc, 0, (size_t)nq * Dv * sizeof(real));
            for (int s0 = 0; s0 <= last; s0 += BS) {
                int nk = lm_min(BS, Tk - s0);
                pack_transposed(Kt, kh, ldq, s0, nk, Dqk);
                for (int r = 0; r < nq; r++) {
                    int nc = lm_min(nk, P + t0 + r - s0 + 1);   // causal: keys s ≤ P + t only
                    if (nc <= 0) continue;
                    scores_row(s, qh + (size_t)(t0 + r) * ldq, Kt, nk, nc, Dqk, scale);
                    real mx = s[0];
                    for (int c = 1; c < nc; c++) mx = s[c] > mx ? s[c] : mx;
                    real *a = acc + (size_t)r * Dv;
                    if (mx > m[r]) {   // new running max: rescale what was summed so far
                        real alpha = exp(m[r] - mx);
                        for (int d = 0; d < Dv; d++) a[d] *= alpha;
                        l[r] *= alpha;
                        m[r] = mx;
                    }
                    real sum = 0;
                    for (int c = 0; c < nc; c++) {
                        real p = exp(s[c] - m[r]);
                        sum += p;
                        const real *vr = vh + (size_t)(s0 + c) * ldv;
                        #pragma omp simd
                        for (int d = 0; d < Dv; d++) a[d] += p * vr[d];
                    }
                    l[r] += sum;
                }
            }
            for (int r = 0; r < nq; r++) {
                real inv = 1 / l[r];
                real *orow = o + ((size_t)b * T + t0 + r) * ldv + (size_t)h * Dv;
                for (int d = 0; d < Dv; d++) orow[d] = acc[(size_t)r * Dv + d] * inv;
                if (lse) lse[((size_t)b * H + h) * T + t0 + r] = m[r] + log(l[r]);
            }
        }
        free(Kt); free(acc); free(m); free(l); free(s);
    }
}

// o [B,T,H,Dv], lse [B,H,T], q, k [B,T,H,Dqk], v [B,T,H,Dv]
void cpu_attn_fwd(real *o, real *lse, const real *q, const real *k, const real *v,
                  int B, int T, int H, int Dqk, int Dv, real scale) {
    attn_fwd_prefix(o, lse, q, k, v, B, T, 0, H, Dqk, Dv, scale);
}

// q, o [B,T,H,·]; k, v [B,P+T,H,·]: the T queries follow P earlier positions (inference)
void cpu_attn_prefix_fwd(real *o, const real *q, const real *k, const real *v, int B, int T, int P, int H,
                         int Dqk, int Dv, real scale) {
    attn_fwd_prefix(o, NULL, q, k, v, B, T, P, H, Dqk, Dv, scale);
}

// Backward, one task per (b, h), flash-attention-2 order: outer loop over key blocks j
// whose dK_j, dV_j tiles are accumulated locally and added once; inner loop over the
// query rows t of blocks i ≥ j, recomputing the probabilities from the saved lse:
//   P_ts = exp(scale·q_t·k_s − lse_t),  D_t = do_t·o_t,
//   dv_s += Σ_t P_ts do_t;  dS_ts = scale·P_ts (do_t·v_s − D_t);
//   dk_s += Σ_t dS_ts q_t;  dq_t += Σ_s dS_ts k_s  (dq of a row is only touched by its task).
// (D_t = Σ_s P_ts do_t·v_s, the softmax Jacobian's correction term, read off o.)
// Gradients [like their inputs] are accumulated (assign: written); any of dq, dk, dv may be NULL.
void cpu_attn_bwd(real *dq, real *dk, real *dv, const real *d_o, const real *q, const real *k,
                  const real *v, const real *o, const real *lse, int B, int T, int H, int Dqk, int Dv, real scale,
                  int assign) {
    if (B == 0 || T == 0 || H == 0 || (!dq && !dk && !dv)) return;
    const int BS = ATTN_BLOCK, nb = lm_cdiv(T, BS);
    const size_t ldq = (size_t)H * Dqk, ldv = (size_t)H * Dv;
    const int need_ds = dq || dk;
    #pragma omp parallel
    {
        real *Kt = lm_malloc((size_t)Dqk * BS * sizeof(real));
        real *Vt = lm_malloc((size_t)Dv * BS * sizeof(real));
        real *dKj = lm_malloc((size_t)BS * Dqk * sizeof(real));
        real *dVj = lm_malloc((size_t)BS * Dv * sizeof(real));
        real *s = lm_malloc((size_t)BS * sizeof(real));
        real *dp = lm_malloc((size_t)BS * sizeof(real));
        real *D = lm_malloc((size_t)T * sizeof(real));
        #pragma omp for schedule(static)
        for (int bh = 0; bh < B * H; bh++) {
            int b = bh / H, h = bh % H;
            size_t qoff = (size_t)b * T * ldq + (size_t)h * Dqk, voff = (size_t)b * T * ldv + (size_t)h * Dv;
            const real *qh = q + qoff, *kh = k + qoff, *vh = v + voff, *oh = o + voff, *doh = d_o + voff;
            const real *lh = lse + (size_t)bh * T;
            if (dq && assign)   // this task's rows of dq, added into block by block below
                for (int t = 0; t < T; t++) memset(dq + qoff + (size_t)t * ldq, 0, (size_t)Dqk * sizeof(real));
            for (int t = 0; t < T; t++) {
                const real *a = doh + (size_t)t * ldv, *c = oh + (size_t)t * ldv;
                real sum = 0;
                for (int d = 0; d < Dv; d++) sum += a[d] * c[d];
                D[t] = sum;
            }
            for (int j = 0; j < nb; j++) {
                int s0 = j * BS, nk = lm_min(BS, T - s0);
                pack_transposed(Kt, kh, ldq, s0, nk, Dqk);
                pack_transposed(Vt, vh, ldv, s0, nk, Dv);
                memset(dKj, 0, (size_t)nk * Dqk * sizeof(real));
                memset(dVj, 0, (size_t)nk * Dv * sizeof(real));
                for (int t = s0; t < T; t++) {
                    int nc = lm_min(nk, t - s0 + 1);   // causal: keys s ≤ t only
                    const real *qt = qh + (size_t)t * ldq, *dot = doh + (size_t)t * ldv;
                    scores_row(s, qt, Kt, nk, nc, Dqk, scale);
                    for (int c = 0; c < nc; c++) s[c] = exp(s[c] - lh[t]);   // s now holds P_t·
                    if (dv) {
                        for (int c = 0; c < nc; c++) {
                            real p = s[c], *g = dVj + (size_t)c * Dv;
                            #pragma omp simd
                            for (int d = 0; d < Dv; d++) g[d] += p * dot[d];
                        }
                    }
                    if (!need_ds) continue;
                    // dp_c = do_t · v_c, as Dv axpys over the block's keys
                    for (int c = 0; c < nc; c++) dp[c] = 0;
                    for (int d = 0; d < Dv; d++) {
                        real a = dot[d];
                        const real *vt = Vt + (size_t)d * nk;
                        #pragma omp simd
                        for (int c = 0; c < nc; c++) dp[c] += a * vt[c];
                    }
                    for (int c = 0; c < nc; c++) dp[c] = scale * s[c] * (dp[c] - D[t]);   // dS_t·
                    if (dk) {
                        for (int c = 0; c < nc; c++) {
                            real g0 = dp[c], *g = dKj + (size_t)c * Dqk;
                            #pragma omp simd
                            for (int d = 0; d < Dqk; d++) g[d] += g0 * qt[d];
                        }
                    }
                    if (dq) {
                        real *g = dq + qoff + (size_t)t * ldq;
                        for (int c = 0; c < nc; c++) {
                            real g0 = dp[c];
                            const real *kr = kh + (size_t)(s0 + c) * ldq;
                            #pragma omp simd
                            for (int d = 0; d < Dqk; d++) g[d] += g0 * kr[d];
                        }
                    }
                }
                for (int c = 0; c < nk; c++) {
                    if (dk) {
                        real *g = dk + qoff + (size_t)(s0 + c) * ldq;
                        for (int d = 0; d < Dqk; d++) g[d] = (assign ? 0 : g[d]) + dKj[(size_t)c * Dqk + d];
                    }
                    if (dv) {
                        real *g = dv + voff + (size_t)(s0 + c) * ldv;
                        for (int d = 0; d < Dv; d++) g[d] = (assign ? 0 : g[d]) + dVj[(size_t)c * Dv + d];
                    }
                }
            }
        }
        free(Kt); free(Vt); free(dKj); free(dVj); free(s); free(dp); free(D);
    }
}

// out [H]: max over (b, t, s ≤ t) of scale·q[b,t,h]·k[b,s,h]. One thread per head, so
// the result does not depend on the thread count.
void cpu_attn_max_logit(real *out_host, const real *q, const real *k, int B, int T, int H, int Dqk, real scale) {
    #pragma omp parallel for schedule(static)
    for (int h = 0; h < H; h++) {
        real mx = -INFINITY;
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++) {
                const real *qt = q + (((size_t)b * T + t) * H + h) * Dqk;
                for (int s = 0; s <= t; s++) {
                    const real *ks = k + (((size_t)b * T + s) * H + h) * Dqk;
                    real d = 0;
                    for (int c = 0; c < Dqk; c++) d += qt[c] * ks[c];
                    if (scale * d > mx) mx = scale * d;
                }
            }
        out_host[h] = mx;
    }
}
