// attn_wg.cuh — the pieces of a wgmma flash-attention forward that both forward kernels share
// (attn_flash_wg.cu: cp.async, both warpgroups copying; attn_flash_ws.cu: a TMA producer warp
// and ping-ponged warpgroups): the score product from shared memory, P packed as the A operand
// of P·V, the online softmax of a warpgroup's 64 rows, and the output's epilogue.
// Accumulator layout (wgmma_ops.cuh): register 4i+q of warp w, lane l is row 16w + l/4 + 8·(q/2),
// column 8i + 2·(l%4) + q%2 of the warpgroup's 64-row tile.
#ifndef LM_ATTN_WG_CUH
#define LM_ATTN_WG_CUH
#include "wgmma_ops.cuh"
#include "attn_flash.cuh"
#include <math.h>

// acc = A·Bᵀ over NS 64-channel slices, both K-major in shared memory: A's slices hold A_ROWS
// rows (this warpgroup multiplies rows 64·wg..), B's N; committed by the caller
template <int N, int NS, int A_ROWS>
__device__ __forceinline__ void fw_ss_slices(float *acc, uint32_t sA, int wg, uint32_t sB) {
#pragma unroll
    for (int sl = 0; sl < NS; sl++)
#pragma unroll
        for (int j = 0; j < 4; j++)
            wg_ss<N, 0, 0>(acc, wb_desc(sA + sl * A_ROWS * 128 + wg * 64 * 128 + j * 32, 16, 1024),
                           wb_desc(sB + sl * N * 128 + j * 32, 16, 1024), sl > 0 || j > 0);
}

// the A registers of the 16-deep steps of a product whose k index is the accumulator's
// column: step j is the 8-column tiles 2j, 2j+1 (the forward's P·V packing)
template <int NC>
__device__ __forceinline__ void fw_pack_a(uint32_t (*a)[4], const float *x) {
#pragma unroll
    for (int j = 0; j < NC / 16; j++) {
        a[j][0] = fa_pack(x[8 * j], x[8 * j + 1]);
        a[j][1] = fa_pack(x[8 * j + 2], x[8 * j + 3]);
        a[j][2] = fa_pack(x[8 * j + 4], x[8 * j + 5]);
        a[j][3] = fa_pack(x[8 * j + 6], x[8 * j + 7]);
    }
}

// P = exp2(s·scale_log2 − lse2) where `ok` (causal), else 0; dS = P ∘ (dP − D) · scale. lse2 in
// log2 units. Rows past T have lse2 = +inf, so their P is exactly 0.
// P = e^{S·scale − lse} from the saved lse (lse2 in log2 units); 0 where masked
__device__ __forceinline__ float fw_p(float s, bool ok, float scale_log2, float lse2) {
    return ok ? fa_exp2(fmaf(s, scale_log2, -lse2)) : 0.f;
}
__device__ __forceinline__ void fw_p_ds(float &s, float &dp, bool ok, float scale_log2, float lse2, float Dv,
                                        float scale) {
    const float p = fw_p(s, ok, scale_log2, lse2);
    dp = p * (dp - Dv) * scale;
    s = p;
}
// dS of a warpgroup's dQ tile, in place in dp: S and dP (landed in s, dp) of this thread's
// query rows r0 + l/4 and r0 + l/4 + 8 (lse2, Dr: their lse in log2 units and D) against keys
// k0..k0+BN−1; causal. fw_form_ds also packs it into da, the A operand of dS·K.
template <int BN>
__device__ __forceinline__ void fw_ds_in_place(float *s, float *dp, int k0, int r0, int l, const float lse2[2],
                                               const float Dr[2], float scale_log2, float scale) {
#pragma unroll
    for (int n = 0; n < BN / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int key = k0 + 8 * n + 2 * (l & 3) + (e & 1), hr = e >> 1;
            fw_p_ds(s[4 * n + e], dp[4 * n + e], key <= r0 + 8 * hr, scale_log2, lse2[hr], Dr[hr], scale);
        }
}
template <int BN>
__device__ __forceinline__ void fw_form_ds(float *s, float *dp, uint32_t (*da)[4], int k0, int r0, int l,
                                           const float lse2[2], const float Dr[2], float scale_log2, float scale) {
    fw_ds_in_place<BN>(s, dp, k0, r0, l, lse2, Dr, scale_log2, scale);
    fw_pack_a<BN>(da, dp);
}

// A gradient row's N columns held by this thread (accumulator rows hr of a 64-row warpgroup tile:
// columns 8n + 2·(l%4), +1) added into r (assign: written), r already at the thread's first column
template <int N>
__device__ __forceinline__ void fw_add_row(float *r, const float *acc, int hr, int assign) {
#pragma unroll
    for (int n = 0; n < N / 8; n++) {
        const float2 x = assign ? make_float2(0.f, 0.f) : *reinterpret_cast<float2 *>(r + 8 * n);
        *reinterpret_cast<float2 *>(r + 8 * n) = make_float2(x.x + acc[4 * n + 2 * hr], x.y + acc[4 * n + 2 * hr + 1]);
    }
}

// A thread's two rows (r0 + l/4 and r0 + l/4 + 8, r0 the warp's first row) of the online
// softmax: the running maximum of the raw scores and this thread's part of the row sum.
struct FwRows {
    float m[2], lsum[2];
    __device__ __forceinline__ void init() {
        m[0] = m[1] = -INFINITY;
        lsum[0] = lsum[1] = 0.f;
    }
    // S of key tile k0.. (BN keys, landed in s): masked where the diagonal (query row r sees keys
    // ≤ P + r) or the sequence end (Tk keys) crosses the tile; new row maxima; P = 2^(s·scale_log2
    // − max) packed into pa (keys 16j..16j+15 are the 8-column tiles 2j, 2j+1 of s); the row sums.
    // alpha rescales O. Key 0 is in tile 0 for every row, so m is finite from the first tile on.
    template <int BN>
    __device__ __forceinline__ void step(float *s, uint32_t (*pa)[4], float alpha[2], int k0, int r0, int l, int P,
                                         int Tk, float scale_log2) {
        if (k0 + BN - 1 > P + r0 || k0 + BN > Tk) {
#pragma unroll
            for (int i = 0; i < BN / 8; i++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int key = k0 + 8 * i + 2 * (l & 3) + (e & 1), row = r0 + (l >> 2) + 8 * (e >> 1);
                    if (key > P + row || key >= Tk) s[4 * i + e] = -INFINITY;
                }
        }
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            float mx = m[hr];
#pragma unroll
            for (int i = 0; i < BN / 8; i++) mx = fmaxf(mx, fmaxf(s[4 * i + 2 * hr], s[4 * i + 2 * hr + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));   // the 4 lanes of a row
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            alpha[hr] = fa_exp2((m[hr] - mx) * scale_log2);
            const float off = mx * scale_log2;
            m[hr] = mx;
            float sum = 0.f;
#pragma unroll
            for (int i = 0; i < BN / 8; i++) {
                s[4 * i + 2 * hr] = fa_exp2(fmaf(s[4 * i + 2 * hr], scale_log2, -off));
                s[4 * i + 2 * hr + 1] = fa_exp2(fmaf(s[4 * i + 2 * hr + 1], scale_log2, -off));
                sum += s[4 * i + 2 * hr] + s[4 * i + 2 * hr + 1];
            }
            lsum[hr] = lsum[hr] * alpha[hr] + sum;
        }
        fw_pack_a<BN>(pa, s);
    }
    // O's rows (acc, DV columns) scaled by alpha
    template <int DV> __device__ __forceinline__ static void rescale(float *acc, const float alpha[2]) {
#pragma unroll
        for (int i = 0; i < DV / 8; i++) {
            acc[4 * i] *= alpha[0];
            acc[4 * i + 1] *= alpha[0];
            acc[4 * i + 2] *= alpha[1];
            acc[4 * i + 3] *= alpha[1];
        }
    }
    // o rows (fp32, row stride ldv, this head's columns at orow0) = acc / row sum; lse (natural
    // log, row stride 1 at lse0; may be NULL) = max·scale + log(sum). Rows ≥ T are not written.
    template <int DV>
    __device__ __forceinline__ void store(const float *acc, float *o0, long ldv, float *lse0, int r0, int l, int T,
                                          float scale) const {
#pragma unroll
        for (int hr = 0; hr < 2; hr++) {
            float li = lsum[hr];
            li += __shfl_xor_sync(0xffffffffu, li, 1);
            li += __shfl_xor_sync(0xffffffffu, li, 2);
            const int row = r0 + (l >> 2) + 8 * hr;
            if (row >= T) continue;
            const float inv = 1.0f / li;
            float *orow = o0 + (size_t)row * ldv;
#pragma unroll
            for (int i = 0; i < DV / 8; i++)
                *reinterpret_cast<float2 *>(orow + 8 * i + 2 * (l & 3)) =
                    make_float2(acc[4 * i + 2 * hr] * inv, acc[4 * i + 2 * hr + 1] * inv);
            if (lse0 && (l & 3) == 0) lse0[row] = m[hr] * scale + logf(li);
        }
    }
};
#endif
