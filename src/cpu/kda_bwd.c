// kda_bwd.c — exact gradients of the fused KDA op (L2 norms, gate, β and the delta-rule
// recurrence), recomputing everything from the inputs.
//
// Per (b, h), backward through the recurrence itself:
// 1. a forward sweep keeps the state at every chunk boundary (T/C checkpoints of K·V);
// 2. chunks in reverse: recompute the C+1 states inside the chunk from its checkpoint
//    (C·K·V scratch) together with the residuals r_t, then step back token by token.
// Work O(T·K·V), memory O(C·K·V) per thread + O((T/C)·K·V) per sequence in flight.
//
// One token, with A = Diag(α) S_{t−1}, r = v − Aᵀk̂, S_t = A + β k̂ rᵀ, o = S_tᵀq̂, given
// dS = ∂/∂S_t (from later tokens) and do = ∂/∂o_t, and dŜ = dS + q̂ doᵀ:
//   u = dŜ r = dS r + q̂ (do·r)            w = dŜᵀ k̂ = dSᵀ k̂ + do (q̂·k̂)
//   dβ = k̂·u        dr = β w = dv
//   dq̂ = S_t do = α ⊙ (S_{t−1} do) + β k̂ (r·do)
//   dk̂ = β u − A dr = β u − α ⊙ (S_{t−1} dr)
//   dA = dŜ − k̂ drᵀ;   dg = α ⊙ rowsum(dA ⊙ S_{t−1});   ∂/∂S_{t−1} = Diag(α) dA
// then through the L2 norms, the gate activation and the β sigmoid to the raw inputs.
#include "kda_impl.h"

#define LANES 16
// Σ of 16 lanes in a fixed order (the same tree as kda_dot)
static inline real lanes_sum(real *acc) {
    for (int l = 0; l < 8; l++) acc[l] += acc[l + 8];
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

// The token step above: dS [K,V] is updated in place to ∂/∂S_{t−1}. Sp = S_{t−1} [K,V];
// qh, kh, al [K]; r, dout [V] (zeros when there is no output gradient). Outputs dqh,
// dkh, dg [K], dv [V] (assigned); wv, dr [V] scratch. Returns dβ.
// Two sweeps over the rows, each a single pass over a row with lane accumulators:
//   1. u_i = dS_i·r, w += k̂_i dS_i
//   2. x_i = S_i·do, y_i = S_i·dr, dA_i = dS_i + q̂_i do − k̂_i dr, z_i = dA_i·S_i, dS_i = α_i dA_i
static real kda_step_bwd(real *dS, const real *Sp, const real *qh, const real *kh, const real *al, real beta,
                         const real *r, const real *dout, real *dqh, real *dkh, real *dg, real *dv,
                         real *wv, real *dr, int K, int V) {
    real dor = kda_dot(dout, r, V), qk = kda_dot(qh, kh, K);
    int V16 = V - V % LANES;
    for (int j = 0; j < V; j++) wv[j] = qk * dout[j];
    real dbeta = 0;
    for (int i = 0; i < K; i++) {
        const real *dSi = dS + (size_t)i * V;
        real ki = kh[i], au[LANES] = {0};
        for (int j0 = 0; j0 < V16; j0 += LANES) {
            #pragma omp simd
            for (int l = 0; l < LANES; l++) {
                real d = dSi[j0 + l];
                au[l] = KDA_FMA(d, r[j0 + l], au[l]);
                wv[j0 + l] = KDA_FMA(ki, d, wv[j0 + l]);
            }
        }
        real ui = lanes_sum(au);
        for (int j = V16; j < V; j++) {
            ui = KDA_FMA(dSi[j], r[j], ui);
            wv[j] = KDA_FMA(ki, dSi[j], wv[j]);
        }
        ui = KDA_FMA(qh[i], dor, ui);
        dkh[i] = beta * ui;
        dbeta = KDA_FMA(ki, ui, dbeta);
    }
    for (int j = 0; j < V; j++) dv[j] = dr[j] = beta * wv[j];
    for (int i = 0; i < K; i++) {
        const real *Si = Sp + (size_t)i * V;
        real *dSi = dS + (size_t)i * V, ai = al[i], qi = qh[i], mki = -kh[i];
        real ax[LANES] = {0}, ay[LANES] = {0}, az[LANES] = {0};
        for (int j0 = 0; j0 < V16; j0 += LANES) {
            #pragma omp simd
            for (int l = 0; l < LANES; l++) {
                int j = j0 + l;
                real sv = Si[j], d = KDA_FMA(qi, dout[j], KDA_FMA(mki, dr[j], dSi[j]));
                ax[l] = KDA_FMA(sv, dout[j], ax[l]);
                ay[l] = KDA_FMA(sv, dr[j], ay[l]);
                az[l] = KDA_FMA(d, sv, az[l]);
                dSi[j] = ai * d;
            }
        }
        real x = lanes_sum(ax), y = lanes_sum(ay), z = lanes_sum(az);
        for (int j = V16; j < V; j++) {
            real sv = Si[j], d = KDA_FMA(qi, dout[j], KDA_FMA(mki, dr[j], dSi[j]));
            x = KDA_FMA(sv, dout[j], x);
            y = KDA_FMA(sv, dr[j], y);
            z = KDA_FMA(d, sv, z);
            dSi[j] = ai * d;
        }
        dqh[i] = KDA_FMA(ai, x, beta * kh[i] * dor);
        dkh[i] -= ai * y;
        dg[i] = ai * z;
    }
    return dbeta;
}

// d/dx of x·rx with rx = (Σx² + eps)^-1/2, given dn = ∂/∂(x·rx): rx·(dn − n (n·dn)).
// x, dn, dx [n] (dx accumulated)
static void kda_l2_bwd(real *dx, const real *x, real rx, const real *dn, int n) {
    real nd = 0;
    for (int c = 0; c < n; c++) nd += x[c] * rx * dn[c];
    for (int c = 0; c < n; c++) dx[c] += rx * (dn[c] - x[c] * rx * nd);
}

// Gradients of everything in lm_kda_args that has one, accumulated (+=); any may be NULL.
// d_o [B,T,H,V] and dS_out [B,H,K,V] may be NULL (zero). S0 is read, so it must still
// hold the initial state (not overwritten by an in-place forward).
void cpu_kda_bwd(const lm_kda_args *a) {
    LM_CHECK(!a->df_lo && !a->d_o_lo && !a->dqkv_pre_lo, "cpu kda_bwd: no GEMM-precision gradients on the CPU");
    if (a->conv_W) {   // the op with its conv: q, k, v are the forward's qkv_out; dq, dk, dv work buffers
        lm_kda_args in = kda_conv_inputs(a, 0);
        real *d[3] = {a->dq, a->dk, a->dv};
        const int C[3] = {a->H * a->K, a->H * a->K, a->H * a->V};
        for (int j = 0; j < 3; j++)
            LM_CHECK(d[j] || (!a->dqkv_pre[j] && !a->dconv_w[j]), "kda_bwd: conv gradient %d without its work buffer", j);
        if (!a->grads_assign)   // dq, dk, dv are written either way (work buffers); df, dβ follow grads_assign
            for (int j = 0; j < 3; j++)
                if (d[j]) memset(d[j], 0, (size_t)a->B * a->T * C[j] * sizeof(real));
        cpu_kda_bwd(&in);
        for (int j = 0; j < 3; j++)
            if (a->dqkv_pre[j] || a->dconv_w[j])
                cpu_conv_silu_bwd(a->dqkv_pre[j], a->dconv_w[j], d[j], a->qkv_pre[j], a->conv_w[j], NULL, a->B, a->T,
                                  C[j], a->conv_W, a->grads_assign);
        return;
    }
    kda_check_args(a);
    int B = a->B, T = a->T, H = a->H, K = a->K, V = a->V;
    if (a->grads_assign) {   // written = added onto zeros
        const size_t nk = (size_t)B * T * H * K * sizeof(real);
        if (a->dq) memset(a->dq, 0, nk);
        if (a->dk) memset(a->dk, 0, nk);
        if (a->df) memset(a->df, 0, nk);
        if (a->dv) memset(a->dv, 0, (size_t)B * T * H * V * sizeof(real));
        if (a->dbeta_logit) memset(a->dbeta_logit, 0, (size_t)B * T * H * sizeof(real));
    }
    // checkpoints every C tokens, taken by the forward's own form (the chunked forms
    // are faster than the recurrence; NAIVE keeps the recurrence)
    int form = kda_resolve_form(a);
    int C = form == LM_KDA_NAIVE ? 64 : a->chunk;
    LM_CHECK(C == 16 || C == 32 || C == 64, "kda_bwd: chunk %d not in {16, 32, 64}", C);
    int nck = lm_cdiv(T, C);
    size_t KV = (size_t)K * V;
    // per-(b,h) partial parameter gradients, summed over b in a fixed order below
    real *pA = a->dA_log ? lm_malloc((size_t)B * H * sizeof(real)) : NULL;
    real *pdb = a->ddt_bias ? lm_malloc((size_t)B * H * K * sizeof(real)) : NULL;
    #pragma omp parallel
    {
        unsigned fpm = kda_fpmode_enter();
        real *ck = lm_malloc(((size_t)nck + 1) * KV * sizeof(real));   // chunk-start states
        real *st = lm_malloc(((size_t)C + 1) * KV * sizeof(real));     // states inside one chunk
        real *dS = lm_malloc(KV * sizeof(real));
        real *qh = lm_malloc((size_t)C * K * sizeof(real)), *kh = lm_malloc((size_t)C * K * sizeof(real));
        real *g = lm_malloc((size_t)C * K * sizeof(real)), *al = lm_malloc((size_t)C * K * sizeof(real));
        real *rr = lm_malloc((size_t)C * V * sizeof(real));
        kda_tok *tok = lm_malloc((size_t)C * sizeof(kda_tok));
        kda_chunk_ws *cw = form == LM_KDA_NAIVE ? NULL : kda_chunk_ws_new(C, K, V);
        real *vec = lm_malloc((4 * (size_t)K + 5 * (size_t)V) * sizeof(real));   // zeroed
        real *dqh = vec, *dkh = dqh + K, *dg = dkh + K, *tmp = dg + K;
        real *dv = tmp + K, *wv = dv + V, *dr = wv + V, *p = dr + V, *zero_do = p + V;
        #pragma omp for schedule(static)
        for (int bh = 0; bh < B * H; bh++) {
            int b = bh / H, h = bh % H;
            real eA = exp(a->A_log[h]), accA = 0;
            real *accb = pdb ? pdb + (size_t)bh * K : NULL;
            if (accb) memset(accb, 0, (size_t)K * sizeof(real));
            // 1. forward sweep: checkpoints at chunk starts
            if (a->S0) memcpy(st, a->S0 + bh * KV, KV * sizeof(real));
            else memset(st, 0, KV * sizeof(real));
            if (cw) {
                kda_chunk_seq(a, b, h, st, form == LM_KDA_CHUNK_FACTORED, cw, ck);
            } else {
                for (int c = 0; c < nck; c++) {
                    memcpy(ck + c * KV, st, KV * sizeof(real));
                    for (int t = c * C; t < lm_min(T, (c + 1) * C); t++) {
                        kda_tok tk = kda_prep(a, b, t, h, qh, kh, NULL, al);
                        kda_step(st, st, qh, kh, al, tk.beta, a->v + kda_row(a, b, t, h) * V, NULL, NULL, p, K, V);
                    }
                }
            }
            // 2. reverse over chunks
            if (a->dS_out) memcpy(dS, a->dS_out + bh * KV, KV * sizeof(real));
            else memset(dS, 0, KV * sizeof(real));
            for (int c = nck - 1; c >= 0; c--) {
                int t0 = c * C, n = lm_min(C, T - t0);
                memcpy(st, ck + c * KV, KV * sizeof(real));
                for (int j = 0; j < n; j++) {   // st[j] = state before token t0+j
                    size_t row = kda_row(a, b, t0 + j, h);
                    tok[j] = kda_prep(a, b, t0 + j, h, qh + (size_t)j * K, kh + (size_t)j * K, g + (size_t)j * K,
                                      al + (size_t)j * K);
                    kda_step(st + (j + 1) * KV, st + j * KV, qh + (size_t)j * K, kh + (size_t)j * K, al + (size_t)j * K,
                             tok[j].beta, a->v + row * V, NULL, rr + (size_t)j * V, p, K, V);
                }
                for (int j = n - 1; j >= 0; j--) {
                    int t = t0 + j;
                    size_t row = kda_row(a, b, t, h);
                    const real *qj = qh + (size_t)j * K, *kj = kh + (size_t)j * K, *gj = g + (size_t)j * K;
                    real beta = tok[j].beta;
                    real dbeta = kda_step_bwd(dS, st + j * KV, qj, kj, al + (size_t)j * K, beta, rr + (size_t)j * V,
                                              a->d_o ? a->d_o + row * V : zero_do, dqh, dkh, dg, dv, wv, dr, K, V);
                    if (a->dv) kda_axpy(a->dv + row * V, 1, dv, V);
                    if (a->dbeta_logit) a->dbeta_logit[row] += dbeta * beta * (1 - beta);
                    if (a->dq) {   // q̂ = scale · q·rq
                        for (int i = 0; i < K; i++) tmp[i] = dqh[i] * a->scale;
                        kda_l2_bwd(a->dq + row * K, a->q + row * K, tok[j].rq, tmp, K);
                    }
                    if (a->dk) kda_l2_bwd(a->dk + row * K, a->k + row * K, tok[j].rk, dkh, K);
                    // gate: df = dg · ∂g/∂x with x = f + dt_bias; dA_log and dt_bias collect over tokens
                    const real *f = a->f + row * K, *dtb = a->dt_bias + (size_t)h * K;
                    for (int i = 0; i < K; i++) {
                        real x = f[i] + dtb[i], df, dA;
                        if (a->gate_mode == LM_GATE_BOUNDED) {
                            real s = lm_sigmoid(eA * x);
                            df = dg[i] * a->lb * s * (1 - s) * eA;
                            dA = df * x;
                        } else {
                            df = -dg[i] * eA * lm_sigmoid(x);
                            dA = dg[i] * gj[i];
                        }
                        if (a->df) a->df[row * K + i] += df;
                        accA += dA;
                        if (accb) accb[i] += df;
                    }
                }
            }
            if (a->dS0) kda_axpy(a->dS0 + bh * KV, 1, dS, (int)KV);
            if (pA) pA[bh] = accA;
        }
        free(ck); free(st); free(dS); free(qh); free(kh); free(g); free(al); free(rr); free(tok); free(vec);
        kda_chunk_ws_free(cw);
        kda_fpmode_leave(fpm);
    }
    for (int h = 0; h < H; h++) {
        if (pA) {
            real s = 0;
            for (int b = 0; b < B; b++) s += pA[b * H + h];
            a->dA_log[h] += s;
        }
        if (pdb)
            for (int i = 0; i < K; i++) {
                real s = 0;
                for (int b = 0; b < B; b++) s += pdb[((size_t)b * H + h) * K + i];
                a->ddt_bias[(size_t)h * K + i] += s;
            }
    }
    free(pA);
    free(pdb);
}
