// mla_decode.c — MLA decode in the absorbed form over the latent cache (SPEC §1.2):
// with NoPE, q_h·k_{h,t} = q_nope_h·(W_uk_h c_t) + q_pe_h·kpe_t = (W_uk_hᵀ q_nope_h)·c_t + q_pe_h·kpe_t,
// so one query step attends directly over the cached latents c_t (shared by all heads,
// as in multi-query attention) and W_uv_h is applied once to the attended latent.
// head_matmul applies those per-head weight slices.
#include "cpu.h"
#include <cblas.h>

#ifdef LM_DOUBLE
#define GEMM cblas_dgemm
#else
#define GEMM cblas_sgemm
#endif

// out [N,H,OC] = per head h: inp[:,h,:] [N,C] times the slice W_h = W + h·w_head_stride,
//   transpose = 0: W_h is [OC,C] row-major, out = inp·W_hᵀ;
//   transpose = 1: W_h is [C,OC] row-major, out = inp·W_h.
// One BLAS call per head, outside any OpenMP region (OpenBLAS threads itself).
void cpu_head_matmul(real *out, const real *inp, const real *W, int N, int H, int C, int OC,
                     long w_head_stride, int transpose) {
    if (N == 0 || H == 0 || OC == 0) return;
    if (C == 0) {   // empty sum; BLAS rejects a zero leading dimension
        memset(out, 0, (size_t)N * H * OC * sizeof(real));
        return;
    }
    for (int h = 0; h < H; h++) {
        const real *Wh = W + (size_t)h * (size_t)w_head_stride;
        if (transpose)
            GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, OC, C, 1, inp + (size_t)h * C, H * C,
                 Wh, OC, 0, out + (size_t)h * OC, H * OC);
        else
            GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1, inp + (size_t)h * C, H * C,
                 Wh, C, 0, out + (size_t)h * OC, H * OC);
    }
}

// cache [B, Tmax, W]: rows lens[b] − T … lens[b] − 1 of sequence b ← x [B, T, W]. The CPU
// keeps its caches in reals (mla_cache_bf16 is NULL here): bf16 is refused.
void cpu_cache_append(real *cache, const real *x, const int *lens, int B, int T, int W, int Tmax, int bf16) {
    LM_CHECK(!bf16, "cache_append: the CPU backend keeps no bf16 caches");
    for (int b = 0; b < B; b++) {
        LM_CHECK(lens[b] >= T && lens[b] <= Tmax, "cache_append: lens[%d] = %d outside [%d, %d]", b, lens[b], T, Tmax);
        memcpy(cache + ((size_t)b * Tmax + lens[b] - T) * W, x + (size_t)b * T * W, (size_t)T * W * sizeof(real));
    }
}

// dst [rows, W] ← rows 0 … rows − 1 of sequence b of a cache [B, Tmax, W]
void cpu_cache_rows(real *dst, const real *cache, int b, int rows, int W, int Tmax, int bf16) {
    LM_CHECK(!bf16 && rows >= 0 && rows <= Tmax, "cache_rows: %d rows of %d%s", rows, Tmax, bf16 ? " (bf16)" : "");
    memcpy(dst, cache + (size_t)b * Tmax * W, (size_t)rows * W * sizeof(real));
}

// One decode step per sequence b and head h over its lens[b] cached tokens:
//   score_t = scale·(q_lat·c_t + q_pe·kpe_t), t < lens[b];  o_lat = Σ_t softmax(score)_t c_t
// o_lat, q_lat [B,H,R]; q_pe [B,H,De]; c_cache [B,Tmax,R]; kpe_cache [B,Tmax,De]; lens [B]
// (0 ≤ lens[b] ≤ Tmax; lens[b] = 0 gives o_lat = 0). Scores are kept in a [Tmax] buffer
// per thread: a two-pass softmax (max, then exponentials) is exact and cheap at T = 1.
void cpu_mla_decode(real *o_lat, const real *q_lat, const real *q_pe, const real *c_cache,
                    const real *kpe_cache, const int *lens, int B, int H, int R, int De, int Tmax, real scale,
                    int bf16) {
    LM_CHECK(!bf16, "mla_decode: the CPU backend keeps no bf16 caches");
    for (int b = 0; b < B; b++) LM_CHECK(lens[b] >= 0 && lens[b] <= Tmax, "mla_decode: lens[%d] = %d outside [0, %d]",
                                         b, lens[b], Tmax);
    #pragma omp parallel
    {
        real *sc = lm_malloc((size_t)(Tmax > 0 ? Tmax : 1) * sizeof(real));
        #pragma omp for schedule(static)
        for (int bh = 0; bh < B * H; bh++) {
            int b = bh / H, len = lens[b];
            const real *ql = q_lat + (size_t)bh * R, *qp = q_pe + (size_t)bh * De;
            const real *cb = c_cache + (size_t)b * Tmax * R, *pb = kpe_cache + (size_t)b * Tmax * De;
            real *ob = o_lat + (size_t)bh * R;
            for (int r = 0; r < R; r++) ob[r] = 0;
            if (len == 0) continue;
            real mx = -INFINITY;
            for (int t = 0; t < len; t++) {
                const real *ct = cb + (size_t)t * R, *pt = pb + (size_t)t * De;
                real s = 0;
                for (int r = 0; r < R; r++) s += ql[r] * ct[r];
                for (int d = 0; d < De; d++) s += qp[d] * pt[d];
                sc[t] = scale * s;
                mx = sc[t] > mx ? sc[t] : mx;
            }
            real l = 0;
            for (int t = 0; t < len; t++) {
                real p = exp(sc[t] - mx);
                l += p;
                const real *ct = cb + (size_t)t * R;
                #pragma omp simd
                for (int r = 0; r < R; r++) ob[r] += p * ct[r];
            }
            real inv = 1 / l;
            for (int r = 0; r < R; r++) ob[r] *= inv;
        }
        free(sc);
    }
}
