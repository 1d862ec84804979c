// conv.c — the short convolution of the KDA layer: causal depthwise conv of width W
// (no bias) followed by SiLU, and its decode cache (the W-1 PRE-conv inputs that
// precede t = 0 of each sequence, so a prefill can be continued token by token).
#include "cpu.h"

// The input of sequence b at position p ∈ [-(W-1), T): p < 0 reads the cache row
// W-1+p (zeros without a cache). inp [B,T,C], cache [B,W-1,C].
static inline real conv_x(const real *inp, const real *cache, int b, int p, int c, int T, int C, int W) {
    if (p >= 0) return inp[((size_t)b * T + p) * C + c];
    if (!cache) return 0;
    return cache[((size_t)b * (W - 1) + (W - 1 + p)) * C + c];
}

// Pre-activation of one output row: z[c] = Σ_j w[c][j] · x[t-(W-1)+j][c], j = 0..W-1.
// One summation order for every position, so a split run reproduces a one-shot run bit for bit.
// z [C]; w [C,W]
static void conv_row(real *z, const real *inp, const real *w, const real *cache, int b, int t,
                     int T, int C, int W) {
    for (int c = 0; c < C; c++) {
        real s = 0;
        for (int j = 0; j < W; j++) s += w[(size_t)c * W + j] * conv_x(inp, cache, b, t - (W - 1) + j, c, T, C, W);
        z[c] = s;
    }
}

// out, inp [B,T,C]; w [C,W]; cache [B,W-1,C] or NULL
void cpu_conv_silu_fwd(real *out, const real *inp, const real *w, const real *cache, int B, int T, int C, int W) {
    #pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        real *y = out + (size_t)bt * C;
        conv_row(y, inp, w, cache, bt / T, bt % T, T, C, W);
        for (int c = 0; c < C; c++) y[c] = lm_silu(y[c]);
    }
}

// With z the pre-activation and dz = dout · silu'(z), silu'(z) = σ(z)(1 + z(1 − σ(z))):
//   dinp[b,p,c] += Σ_j w[c][j] · dz[b, p+(W-1)-j, c]   (outputs that read input p)
//   dw[c][j]    += Σ_{b,t} dz[b,t,c] · x[b, t-(W-1)+j, c]
// The cache gets no gradient (it holds inputs of an earlier, already finished step).
void cpu_conv_silu_bwd(real *dinp, real *dw, const real *dout, const real *inp, const real *w,
                       const real *cache, int B, int T, int C, int W, int assign) {
    if (assign && dinp) memset(dinp, 0, (size_t)B * T * C * sizeof(real));   // written = added onto zeros
    if (B * T == 0 || (!dinp && !dw)) return;
    real *dz = lm_malloc((size_t)B * T * C * sizeof(real));
    #pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * T; bt++) {
        real *d = dz + (size_t)bt * C;
        conv_row(d, inp, w, cache, bt / T, bt % T, T, C, W);
        const real *dy = dout + (size_t)bt * C;
        for (int c = 0; c < C; c++) {
            real z = d[c], s = lm_sigmoid(z);
            d[c] = dy[c] * s * (1 + z * (1 - s));
        }
    }
    if (dinp) {
        // each input row gathers from the W output rows that read it: independent rows
        #pragma omp parallel for schedule(static)
        for (int bp = 0; bp < B * T; bp++) {
            int b = bp / T, p = bp % T;
            real *dx = dinp + (size_t)bp * C;
            for (int c = 0; c < C; c++) {
                real s = 0;
                for (int j = 0; j < W; j++) {
                    int t = p + (W - 1) - j;
                    if (t < T) s += w[(size_t)c * W + j] * dz[((size_t)b * T + t) * C + c];
                }
                dx[c] += s;
            }
        }
    }
    if (dw) {
        // parallel over channel blocks; each thread sums its channels over all rows in order
        const int CB = 16;
        #pragma omp parallel for schedule(static)
        for (int c0 = 0; c0 < C; c0 += CB) {
            int c1 = lm_min(C, c0 + CB);
            real acc[16 * 8];   // [CB, W] partial sums, W ≤ 8
            LM_ASSERT(W <= 8);
            memset(acc, 0, sizeof acc);
            for (int bt = 0; bt < B * T; bt++) {
                int b = bt / T, t = bt % T;
                const real *d = dz + (size_t)bt * C;
                for (int c = c0; c < c1; c++)
                    for (int j = 0; j < W; j++)
                        acc[(c - c0) * W + j] += d[c] * conv_x(inp, cache, b, t - (W - 1) + j, c, T, C, W);
            }
            for (int c = c0; c < c1; c++)
                for (int j = 0; j < W; j++) dw[(size_t)c * W + j] += acc[(c - c0) * W + j];
        }
    }
    free(dz);
}

// cache [B,W-1,C] ← the last W-1 rows of [cache ++ inp] (per sequence); inp [B,T,C].
// New row i is old combined row T+i > i, so a forward sweep never reads a row it has
// already overwritten and the update can run in place.
void cpu_conv_cache_update(real *cache, const real *inp, int B, int T, int C, int W) {
    int M = W - 1;
    if (M <= 0 || T == 0) return;
    LM_ASSERT(cache != NULL);
    #pragma omp parallel for schedule(static)
    for (int b = 0; b < B; b++) {
        real *cb = cache + (size_t)b * M * C;
        for (int i = 0; i < M; i++) {
            int src = T + i;   // row of [cache ++ inp]
            const real *from = src < M ? cb + (size_t)src * C : inp + ((size_t)b * T + (src - M)) * C;
            memmove(cb + (size_t)i * C, from, (size_t)C * sizeof(real));
        }
    }
}

void cpu_conv_step(real *const *out, const real *const *inp, const real *const *w, real *const *cache, const int *C,
                   int n, int B, int W) {
    for (int j = 0; j < n; j++) {
        cpu_conv_silu_fwd(out[j], inp[j], w[j], cache[j], B, 1, C[j], W);
        cpu_conv_cache_update(cache[j], inp[j], B, 1, C[j], W);
    }
}
