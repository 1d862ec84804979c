// kda.c — the fused KDA token-mixer core (SPEC §1.1): forward dispatch over the three
// forms, the naive recurrence (the definition), and the decode step on a state pool.
// The chunkwise forms are in kda_chunk.c and the backward in kda_bwd.c.
//
// Per (sequence b, head h) the state S [K,V] (K-first) evolves token by token:
//   S ← Diag(e^{g_t}) S;  r = v_t − Sᵀk̂_t;  S ← S + β_t k̂_t rᵀ;  o_t = Sᵀ(scale·q̂_t)
// with q̂, k̂ L2-normalised, g the activated gate and β = σ(beta_logit) (kda_impl.h).
#include "kda_impl.h"

// S, Snew [K,V]; qh, kh, al [K]; v, o, r, p [V]. Two sweeps over the state: decay
// fused with the prediction p = Sᵀk̂, then the rank-1 write fused with the read-out.
void kda_step(real *Snew, const real *S, const real *qh, const real *kh, const real *al, real beta,
              const real *v, real *o, real *r, real *p, int K, int V) {
    memset(p, 0, (size_t)V * sizeof(real));
    for (int i = 0; i < K; i++) {
        const real *Si = S + (size_t)i * V;
        real *Ni = Snew + (size_t)i * V, ai = al[i], ki = kh[i];
        #pragma omp simd
        for (int j = 0; j < V; j++) {
            real x = ai * Si[j];
            Ni[j] = x;
            p[j] = KDA_FMA(ki, x, p[j]);
        }
    }
    for (int j = 0; j < V; j++) {   // p ← β·(v − p): the scaled residual
        real rr = v[j] - p[j];
        if (r) r[j] = rr;
        p[j] = beta * rr;
    }
    if (o) memset(o, 0, (size_t)V * sizeof(real));
    for (int i = 0; i < K; i++) {
        real *Ni = Snew + (size_t)i * V, ki = kh[i];
        if (o) {
            real qi = qh[i];
            #pragma omp simd
            for (int j = 0; j < V; j++) {
                real x = KDA_FMA(ki, p[j], Ni[j]);
                Ni[j] = x;
                o[j] = KDA_FMA(qi, x, o[j]);
            }
        } else {
            kda_axpy(Ni, ki, p, V);
        }
    }
}

void kda_check_args(const lm_kda_args *a) {
    LM_CHECK(a->B >= 0 && a->T >= 0 && a->H > 0 && a->K > 0 && a->V > 0, "kda: bad shape B=%d T=%d H=%d K=%d V=%d",
             a->B, a->T, a->H, a->K, a->V);
    LM_CHECK(a->gate_mode == LM_GATE_BOUNDED || a->gate_mode == LM_GATE_UNBOUNDED, "kda: bad gate mode %d", a->gate_mode);
    LM_CHECK(a->gate_mode != LM_GATE_BOUNDED || (a->lb >= -5 && a->lb < 0), "kda: lower bound %g outside [-5, 0)",
             (double)a->lb);
    LM_CHECK(a->form >= LM_KDA_AUTO && a->form <= LM_KDA_CHUNK_EXACT, "kda: bad form %d", a->form);
}

// The op with its conv (lm_kda_args.conv_W): q, k, v = SiLU(conv(qkv_pre)) into qkv_out,
// then the op on them. Returns the arguments of that inner call (q, k, v = qkv_out, no conv).
lm_kda_args kda_conv_inputs(const lm_kda_args *a, int run_conv) {
    LM_CHECK(a->conv_W >= 1 && a->conv_W <= 8, "kda: conv width %d outside [1, 8]", a->conv_W);
    const int C[3] = {a->H * a->K, a->H * a->K, a->H * a->V};
    for (int j = 0; j < 3; j++) {
        LM_CHECK(a->qkv_pre[j] && a->conv_w[j] && a->qkv_out[j], "kda: conv input %d without its tensors", j);
        if (run_conv) cpu_conv_silu_fwd(a->qkv_out[j], a->qkv_pre[j], a->conv_w[j], NULL, a->B, a->T, C[j], a->conv_W);
    }
    lm_kda_args in = *a;
    in.conv_W = 0;
    in.q = a->qkv_out[0]; in.k = a->qkv_out[1]; in.v = a->qkv_out[2];
    return in;
}

// q, k, f [B,T,H,K]; v, o [B,T,H,V]; beta_logit [B,T,H]; S0, S_out [B,H,K,V] (see lm_kda_args)
void cpu_kda_fwd(const lm_kda_args *a) {
    if (a->conv_W) {
        const lm_kda_args in = kda_conv_inputs(a, 1);
        cpu_kda_fwd(&in);
        return;
    }
    kda_check_args(a);
    int form = kda_resolve_form(a);
    int B = a->B, T = a->T, H = a->H, K = a->K, V = a->V;
    if (form != LM_KDA_NAIVE)
        LM_CHECK(a->chunk == 16 || a->chunk == 32 || a->chunk == 64, "kda: chunk %d not in {16, 32, 64}", a->chunk);
    size_t KV = (size_t)K * V;
    #pragma omp parallel
    {
        unsigned fpm = kda_fpmode_enter();
        real *S = lm_malloc(KV * sizeof(real));
        real *qh = lm_malloc((3 * (size_t)K + V) * sizeof(real)), *kh = qh + K, *al = kh + K, *p = al + K;
        kda_chunk_ws *w = form == LM_KDA_NAIVE ? NULL : kda_chunk_ws_new(a->chunk, K, V);
        #pragma omp for schedule(static)
        for (int bh = 0; bh < B * H; bh++) {
            int b = bh / H, h = bh % H;
            // S0 is read in full before S_out is written, so S_out may equal S0
            if (a->S0) memcpy(S, a->S0 + bh * KV, KV * sizeof(real));
            else memset(S, 0, KV * sizeof(real));
            if (form == LM_KDA_NAIVE) {
                for (int t = 0; t < T; t++) {
                    size_t row = kda_row(a, b, t, h);
                    kda_tok tk = kda_prep(a, b, t, h, qh, kh, NULL, al);
                    kda_step(S, S, qh, kh, al, tk.beta, a->v + row * V, a->o + row * V, NULL, p, K, V);
                }
            } else {
                kda_chunk_seq(a, b, h, S, form == LM_KDA_CHUNK_FACTORED, w, NULL);
            }
            if (a->S_out) memcpy(a->S_out + bh * KV, S, KV * sizeof(real));
        }
        kda_chunk_ws_free(w);
        free(qh);
        free(S);
        kda_fpmode_leave(fpm);
    }
}

// The CPU backward always recomputes the forward's intermediates (lm_kda_args.saved unused).
size_t cpu_kda_saved_bytes(int B, int T, int H, int K, int V) {
    (void)B; (void)T; (void)H; (void)K; (void)V;
    return 0;
}

// One token for each of B sequences, on a->state [n_slots,H,K,V] in place: sequence b
// uses slot a->slots[b] (b when slots is NULL); slots must be distinct. Inputs are the
// [B,1,H,·] tensors of the forward; o [B,1,H,V]. The same step as the naive forward,
// so decoding after a prefill continues it exactly.
void cpu_kda_decode(const lm_kda_args *a) {
    kda_check_args(a);
    LM_CHECK(!a->conv_W, "kda_decode: the conv is not part of the decode step");
    LM_CHECK(a->T == 1, "kda_decode: T must be 1 (got %d)", a->T);
    LM_CHECK(a->state != NULL, "kda_decode: no state pool");
    int B = a->B, H = a->H, K = a->K, V = a->V;
    size_t KV = (size_t)K * V;
    #pragma omp parallel
    {
        unsigned fpm = kda_fpmode_enter();
        real *qh = lm_malloc((3 * (size_t)K + V) * sizeof(real)), *kh = qh + K, *al = kh + K, *p = al + K;
        #pragma omp for schedule(static)
        for (int bh = 0; bh < B * H; bh++) {
            int b = bh / H, h = bh % H;
            int slot = a->slots ? a->slots[b] : b;
            real *S = a->state + ((size_t)slot * H + h) * KV;
            size_t row = kda_row(a, b, 0, h);
            kda_tok tk = kda_prep(a, b, 0, h, qh, kh, NULL, al);
            kda_step(S, S, qh, kh, al, tk.beta, a->v + row * V, a->o + row * V, NULL, p, K, V);
        }
        free(qh);
        kda_fpmode_leave(fpm);
    }
}
