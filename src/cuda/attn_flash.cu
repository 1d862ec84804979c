// attn_flash.cu — causal softmax attention (no positions) on tensor cores, flash-attention-2
// style: the T×T score matrix is never stored; the forward keeps an online softmax per query
// row, the backward recomputes the probabilities from the saved lse.
//
// Precision: the op interface is fp32. q, k, v (and dO) are rounded to bf16 copies in the
// workspace by one elementwise pass; that halves the bytes every tile load moves and lets the
// tiles stream into shared memory with cp.async, double-buffered, while the previous tile is
// multiplied. On an H200 this made the forward 3.0× faster (0.89 → 0.30 ms at T = 4096, H = 8,
// 192/128) and the backward 1.1× faster than converting fp32 tiles inside the kernels (the previous
// version of this file); the pass itself moves ~100 MB there, an estimated ~25 µs (not timed
// separately). Products run on mma.sync m16n8k16 (bf16 in, fp32 accumulate). Scores, the
// softmax statistics (max, sum, lse), D = rowsum(dO∘O) (from the fp32 dO, O) and all
// accumulators are fp32; P and dS are rounded to bf16 only as mma operands. Errors against
// the fp32 CPU reference (H200, tests/cuda/test_cuda_ops.c): ≤ 4.3e-3 relative RMS (o),
// ≤ 6e-4 (lse; 6.8e-3 at T = 1), ≤ 7.2e-3 (gradients).
// The fallback kernels of mla.cu serve the head dims not instantiated here. For Dqk/Dv ∈
// {192/128, 128/128, 64/64} the wgmma kernels of attn_flash_wg.cu run instead (1.6× faster
// forward, 1.9–2.6× backward on the H200), unless LM_FA_WG=0; the rounding and D pass below
// serve both.
//
// Layouts (as the op): q, k [B,T,H,Dqk], v, o, dO [B,T,H,Dv], lse, D [B,H,T].
//
// Kernels (row-major bf16 tiles with a row stride of D+8 elements, which makes every ldmatrix
// of 8 rows hit 8 distinct bank groups):
//   fa_fwd_k   one block of 4 warps per (64-query tile, head, batch), 2 blocks per SM; warp w
//              owns query rows 16w..16w+15 (S = Q·K^T and O += P·V from registers). Key/value
//              tiles of 64 rows are visited up to the diagonal; tiles above it are skipped.
//   fa_dkdv_k  one block per (64-key tile, head, batch) holding K, V; visits the 64-query tiles
//              at and below the diagonal with 16 warps: S^T = K·Q^T and dP^T = V·dO^T (each warp a
//              16×16 slice), P^T and dS^T go through shared memory as bf16, then dV += P^T·dO and
//              dK += dS^T·Q (each warp 16 keys × a quarter of the head dims: 16 warps keep the
//              accumulators of 64 keys in 128 registers per thread without spills).
//   fa_dq_k    one block per (64-query tile, head, batch): the same recomputation from the
//              query side, dQ += dS·K.
// dQ is a separate pass (instead of atomics from fa_dkdv_k): every output element is written by
// exactly one block, in a fixed order, so the backward is deterministic like the rest of the
// backend. The price is recomputing S and dP once more (~40% more tensor work than FA2).
#include "cuda_common.cuh"
#include "ldmatrix.cuh"
#include "attn_flash.cuh"
#include <cuda_bf16.h>
#include <stdint.h>

typedef __nv_bfloat16 fa_bf16;

#define FA_WF 4           // forward: warps per block, 16 query rows each
#define FA_BMF (16 * FA_WF)
#define FA_MINBF 2        // forward blocks per SM (shared memory: Q and two K/V stages ≈ 109 KiB)
#define FA_WC 4           // backward: warps per 16-row slice of a tile (4 slices: 16·FA_WC warps)
#define FA_TB (128 * FA_WC)
#define FA_BN 64          // key rows per tile (forward and backward), query rows per backward tile
#define FA_LP (FA_BN + 8) // row stride of the backward's P / dS tiles

// ---- device helpers (fa_pack, fa_exp2, FA_LOG2E: attn_flash.cuh) ----
// C[16×8] += A[16×16]·B[16×8], bf16 in, fp32 accumulate
__device__ __forceinline__ void fa_mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// One warp: acc [16 × 8·NT] += A [16 × 16·KS] · B.
// A: row-major bf16 in shared memory (A points at the warp's row 0, column 0; row stride lda).
// B: TRANS = false: stored as Bt[n][k] (k contiguous; e.g. K rows for Q·K^T), B points at n = 0;
//    TRANS = true:  stored as B[k][n]  (n contiguous; e.g. V rows for P·V), B points at k = 0.
// Fragment layouts (PTX mma.m16n8k16): ldmatrix x4 on A gives rows 0–7/8–15 × k 0–7/8–15 in
// the a0..a3 order; on B it gives two n-tiles of 8 (b0, b1 each).
template <int KS, int NT, bool TRANS>
__device__ __forceinline__ void fa_warp_mma(float (*acc)[4], const fa_bf16 *A, int lda, const fa_bf16 *B, int ldb,
                                            int lane) {
    static_assert(NT % 2 == 0, "n-tiles go in pairs");
#pragma unroll 4   // fully unrolled, the 192-wide Q·K^T of the forward spills at 168 registers
    for (int kk = 0; kk < KS; kk++) {
        uint32_t a[4];
        ldsm_x4(a, A + (lane & 15) * lda + kk * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int n = 0; n < NT; n += 2) {
            uint32_t b[4];
            if (!TRANS) ldsm_x4(b, B + (8 * n + ((lane >> 4) << 3) + (lane & 7)) * ldb + kk * 16 + ((lane >> 3) & 1) * 8);
            else ldsm_x4_t(b, B + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * ldb + 8 * n + (lane >> 4) * 8);
            fa_mma(acc[n], a, b[0], b[1]);
            fa_mma(acc[n + 1], a, b[2], b[3]);
        }
    }
}

// cp.async of 16 bytes; src_bytes = 0 writes zeros (src must still be a valid address)
__device__ __forceinline__ void fa_cp16(void *smem, const void *gmem, int src_bytes) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void fa_cp_commit() { asm volatile("cp.async.commit_group;\n"); }
// waits until at most N of this thread's committed groups are still in flight
template <int N> __device__ __forceinline__ void fa_cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Starts copying ROWS rows of D bf16 channels (global rows row0.., row stride ld elements; the
// first `valid` rows exist, later ones are zero-filled) into dst [ROWS][D+8], NTHR threads.
// Asynchronous: the caller commits, waits and synchronises.
template <int D, int ROWS, int NTHR>
__device__ __forceinline__ void fa_load(fa_bf16 *dst, const fa_bf16 *src, size_t ld, int row0, int valid) {
    constexpr int C8 = D / 8, N = ROWS * C8;
    static_assert(N % NTHR == 0, "whole rounds of 16-byte chunks");
#pragma unroll
    for (int it = 0; it < N / NTHR; it++) {
        const int idx = threadIdx.x + it * NTHR, r = idx / C8, c = idx % C8;
        const bool ok = r < valid;
        fa_cp16(dst + r * (D + 8) + 8 * c, src + (size_t)(row0 + (ok ? r : 0)) * ld + 8 * c, ok ? 16 : 0);
    }
}

// ---- forward ----
// o [B,T,H,DV], lse [B,H,T] (natural log, scaled scores; may be NULL); q [B,T,H,DQK]; k
// [B,P+T,H,DQK], v [B,P+T,H,DV] (bf16 copies): query t is position P + t and sees keys
// 0..P+t (P = 0: plain causal). grid (⌈T/64⌉, H, B); the heaviest query tiles (most keys)
// are launched first.
template <int DQK, int DV>
__global__ static void __launch_bounds__(32 * FA_WF, FA_MINBF)
    fa_fwd_k(float *o, float *lse, const fa_bf16 *q, const fa_bf16 *k, const fa_bf16 *v, int T, int P, int H,
             float scale, float scale_log2) {
    constexpr int LQ = DQK + 8, LV = DV + 8, NTV = DV / 8, NT = 32 * FA_WF;
    extern __shared__ __align__(16) unsigned char fa_smem[];
    fa_bf16 *Qs = (fa_bf16 *)fa_smem, *Ks0 = Qs + FA_BMF * LQ, *Vs0 = Ks0 + 2 * FA_BN * LQ;   // K, V: 2 stages
    const int nqb = (T + FA_BMF - 1) / FA_BMF, qb = nqb - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int q0 = qb * FA_BMF;
    const size_t ldq = (size_t)H * DQK, ldv = (size_t)H * DV;
    const int Tk = P + T;   // keys per sequence
    const fa_bf16 *qh = q + (size_t)b * T * ldq + (size_t)h * DQK, *kh = k + (size_t)b * Tk * ldq + (size_t)h * DQK;
    const fa_bf16 *vh = v + (size_t)b * Tk * ldv + (size_t)h * DV;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int r0 = q0 + 16 * warp;   // the warp's first query row; this thread holds rows r0+g, r0+g+8
    const int nkb = min((P + q0 + FA_BMF - 1) / FA_BN + 1, (Tk + FA_BN - 1) / FA_BN);
    fa_load<DQK, FA_BMF, NT>(Qs, qh, ldq, q0, T - q0);
    fa_load<DQK, FA_BN, NT>(Ks0, kh, ldq, 0, Tk);
    fa_load<DV, FA_BN, NT>(Vs0, vh, ldv, 0, Tk);
    fa_cp_commit();

    float acc[NTV][4];
#pragma unroll
    for (int n = 0; n < NTV; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
    // running max of the raw scores q·k (per row) and this thread's part of the row sum
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    for (int kb = 0; kb < nkb; kb++) {
        const int k0 = kb * FA_BN, st = kb & 1;
        if (kb + 1 < nkb) {   // the next tile streams in while this one is multiplied
            fa_load<DQK, FA_BN, NT>(Ks0 + (st ^ 1) * FA_BN * LQ, kh, ldq, k0 + FA_BN, Tk - k0 - FA_BN);
            fa_load<DV, FA_BN, NT>(Vs0 + (st ^ 1) * FA_BN * LV, vh, ldv, k0 + FA_BN, Tk - k0 - FA_BN);
        }
        fa_cp_commit();
        fa_cp_wait<1>();   // everything but the group just committed: this tile (and Q) landed
        __syncthreads();
        const fa_bf16 *Ks = Ks0 + st * FA_BN * LQ, *Vs = Vs0 + st * FA_BN * LV;
        float s[8][4];
#pragma unroll
        for (int n = 0; n < 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
        fa_warp_mma<DQK / 16, 8, false>(s, Qs + 16 * warp * LQ, LQ, Ks, LQ, lane);
        if (k0 + FA_BN - 1 > P + r0 || k0 + FA_BN > Tk) {   // the diagonal or the sequence end crosses the tile
#pragma unroll
            for (int n = 0; n < 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int key = k0 + 8 * n + 2 * t4 + (e & 1), row = r0 + g + 8 * (e >> 1);
                    if (key > P + row || key >= Tk) s[n][e] = -INFINITY;
                }
        }
        // online softmax; key 0 is in tile 0 for every row, so m is finite from the first tile on
#pragma unroll
        for (int i = 0; i < 2; i++) {
            float mx = m[i];
#pragma unroll
            for (int n = 0; n < 8; n++) mx = fmaxf(mx, fmaxf(s[n][2 * i], s[n][2 * i + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));   // the 4 threads of a row
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float alpha = fa_exp2((m[i] - mx) * scale_log2), off = mx * scale_log2;
            m[i] = mx;
            float sum = 0.f;
#pragma unroll
            for (int n = 0; n < 8; n++) {
                s[n][2 * i] = fa_exp2(fmaf(s[n][2 * i], scale_log2, -off));
                s[n][2 * i + 1] = fa_exp2(fmaf(s[n][2 * i + 1], scale_log2, -off));
                sum += s[n][2 * i] + s[n][2 * i + 1];
            }
            l[i] = l[i] * alpha + sum;
#pragma unroll
            for (int n = 0; n < NTV; n++) {
                acc[n][2 * i] *= alpha;
                acc[n][2 * i + 1] *= alpha;
            }
        }
        // O += P·V: two adjacent C tiles of P (keys 16kk..16kk+15) are one A fragment
#pragma unroll
        for (int kk = 0; kk < FA_BN / 16; kk++) {
            uint32_t a[4] = {fa_pack(s[2 * kk][0], s[2 * kk][1]), fa_pack(s[2 * kk][2], s[2 * kk][3]),
                             fa_pack(s[2 * kk + 1][0], s[2 * kk + 1][1]), fa_pack(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int n = 0; n < NTV; n += 2) {
                uint32_t bb[4];
                ldsm_x4_t(bb, Vs + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * LV + 8 * n + (lane >> 4) * 8);
                fa_mma(acc[n], a, bb[0], bb[1]);
                fa_mma(acc[n + 1], a, bb[2], bb[3]);
            }
        }
        __syncthreads();   // every warp is done with this stage before the next iteration refills it
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        float li = l[i];
        li += __shfl_xor_sync(0xffffffffu, li, 1);
        li += __shfl_xor_sync(0xffffffffu, li, 2);
        const int row = r0 + g + 8 * i;
        if (row >= T) continue;
        const float inv = 1.0f / li;
        float *orow = o + ((size_t)b * T + row) * ldv + (size_t)h * DV;
#pragma unroll
        for (int n = 0; n < NTV; n++)
            *reinterpret_cast<float2 *>(orow + 8 * n + 2 * t4) = make_float2(acc[n][2 * i] * inv, acc[n][2 * i + 1] * inv);
        if (lse && t4 == 0) lse[((size_t)b * H + h) * T + row] = m[i] * scale + logf(li);
    }
}

// lse (natural log) and D of the 64 rows row0.. into shared memory; lse in log2 units. Rows
// past T get lse = +inf, so their probabilities are exactly 0. Plain loads: visible after the
// caller's next __syncthreads.
__device__ __forceinline__ void fa_stage_rows(float *lse_s, float *D_s, const float *lse, const float *D, int row0,
                                              int T) {
    if (threadIdx.x < FA_BN) {
        int r = row0 + threadIdx.x;
        lse_s[threadIdx.x] = r < T ? lse[r] * FA_LOG2E : INFINITY;
        D_s[threadIdx.x] = r < T ? D[r] : 0.f;
    }
}

// ---- backward: dK, dV ----
// dk [B,T,H,DQK], dv [B,T,H,DV] (fp32, accumulated; either may be NULL); d_o [B,T,H,DV], q, k
// [B,T,H,DQK], v [B,T,H,DV] (bf16 copies); lse, D [B,H,T]. grid (⌈T/64⌉, H, B), block j owns
// keys 64j..64j+63.
template <int DQK, int DV>
__global__ static void __launch_bounds__(FA_TB, 1)
    fa_dkdv_k(float *dk, float *dv, const fa_bf16 *d_o, const fa_bf16 *q, const fa_bf16 *k, const fa_bf16 *v,
              const float *lse, const float *D, int T, int H, float scale, float scale_log2) {
    constexpr int LQ = DQK + 8, LV = DV + 8, NTK = DQK / (8 * FA_WC), NTV = DV / (8 * FA_WC), CW = FA_BN / FA_WC;
    extern __shared__ __align__(16) unsigned char fa_smem[];
    // K, V; Q, dO, lse, D in 2 stages; P^T, dS^T
    fa_bf16 *Ks = (fa_bf16 *)fa_smem, *Vs = Ks + FA_BN * LQ, *Qs0 = Vs + FA_BN * LV, *dOs0 = Qs0 + 2 * FA_BN * LQ;
    fa_bf16 *Ps = dOs0 + 2 * FA_BN * LV, *dSs = Ps + FA_BN * FA_LP;
    float *lse_s0 = (float *)(dSs + FA_BN * FA_LP), *D_s0 = lse_s0 + 2 * FA_BN;
    const int j = blockIdx.x, h = blockIdx.y, b = blockIdx.z, k0 = j * FA_BN;
    const size_t ldq = (size_t)H * DQK, ldv = (size_t)H * DV;
    const size_t qoff = (size_t)b * T * ldq + (size_t)h * DQK, voff = (size_t)b * T * ldv + (size_t)h * DV;
    const float *lh = lse + ((size_t)b * H + h) * T, *Dh = D + ((size_t)b * H + h) * T;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int wr = 16 * (warp & 3);   // the warp's 16 key rows in the tile
    const int cg = warp >> 2;         // its column group: query columns cg·CW.. of S^T, and the
    const int wc = CW * cg;           // cg-th 1/FA_WC of the head dims of dK, dV
    fa_load<DQK, FA_BN, FA_TB>(Ks, k + qoff, ldq, k0, T - k0);
    fa_load<DV, FA_BN, FA_TB>(Vs, v + voff, ldv, k0, T - k0);
    fa_load<DQK, FA_BN, FA_TB>(Qs0, q + qoff, ldq, k0, T - k0);   // query tile j first
    fa_load<DV, FA_BN, FA_TB>(dOs0, d_o + voff, ldv, k0, T - k0);
    fa_cp_commit();
    fa_stage_rows(lse_s0, D_s0, lh, Dh, k0, T);
    float dka[NTK][4], dva[NTV][4];
#pragma unroll
    for (int n = 0; n < NTK; n++) dka[n][0] = dka[n][1] = dka[n][2] = dka[n][3] = 0.f;
#pragma unroll
    for (int n = 0; n < NTV; n++) dva[n][0] = dva[n][1] = dva[n][2] = dva[n][3] = 0.f;
    const int nqt = (T + FA_BN - 1) / FA_BN;
    for (int i = j; i < nqt; i++) {   // query tiles at and below the diagonal
        const int q0 = i * FA_BN, st = (i - j) & 1;
        if (i + 1 < nqt) {   // the next query tile streams in while this one is used
            const int q1 = q0 + FA_BN;
            fa_load<DQK, FA_BN, FA_TB>(Qs0 + (st ^ 1) * FA_BN * LQ, q + qoff, ldq, q1, T - q1);
            fa_load<DV, FA_BN, FA_TB>(dOs0 + (st ^ 1) * FA_BN * LV, d_o + voff, ldv, q1, T - q1);
            fa_stage_rows(lse_s0 + (st ^ 1) * FA_BN, D_s0 + (st ^ 1) * FA_BN, lh, Dh, q1, T);
        }
        fa_cp_commit();
        fa_cp_wait<1>();
        __syncthreads();
        const fa_bf16 *Qs = Qs0 + st * FA_BN * LQ, *dOs = dOs0 + st * FA_BN * LV;
        const float *lse_s = lse_s0 + st * FA_BN, *D_s = D_s0 + st * FA_BN;
        float sT[CW / 8][4], dpt[CW / 8][4];
#pragma unroll
        for (int n = 0; n < CW / 8; n++) sT[n][0] = sT[n][1] = sT[n][2] = sT[n][3] = dpt[n][0] = dpt[n][1] = dpt[n][2] = dpt[n][3] = 0.f;
        fa_warp_mma<DQK / 16, CW / 8, false>(sT, Ks + wr * LQ, LQ, Qs + wc * LQ, LQ, lane);
        fa_warp_mma<DV / 16, CW / 8, false>(dpt, Vs + wr * LV, LV, dOs + wc * LV, LV, lane);
        // P^T[key][query] = exp(scale·s − lse), dS^T = P^T ∘ (dP^T − D) · scale; causal: key ≤ query
#pragma unroll
        for (int n = 0; n < CW / 8; n++)
#pragma unroll
            for (int hi = 0; hi < 2; hi++) {
                const int kr = wr + g + 8 * hi, key = k0 + kr;
                float p[2], ds[2];
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int qc = wc + 8 * n + 2 * t4 + e, query = q0 + qc;
                    p[e] = key <= query ? fa_exp2(fmaf(sT[n][2 * hi + e], scale_log2, -lse_s[qc])) : 0.f;
                    ds[e] = p[e] * (dpt[n][2 * hi + e] - D_s[qc]) * scale;
                }
                *reinterpret_cast<uint32_t *>(Ps + kr * FA_LP + wc + 8 * n + 2 * t4) = fa_pack(p[0], p[1]);
                *reinterpret_cast<uint32_t *>(dSs + kr * FA_LP + wc + 8 * n + 2 * t4) = fa_pack(ds[0], ds[1]);
            }
        __syncthreads();
        fa_warp_mma<FA_BN / 16, NTV, true>(dva, Ps + wr * FA_LP, FA_LP, dOs + cg * (DV / FA_WC), LV, lane);
        fa_warp_mma<FA_BN / 16, NTK, true>(dka, dSs + wr * FA_LP, FA_LP, Qs + cg * (DQK / FA_WC), LQ, lane);
        __syncthreads();   // this stage and P, dS are free for the next iteration
    }
#pragma unroll
    for (int hi = 0; hi < 2; hi++) {
        const int key = k0 + wr + g + 8 * hi;
        if (key >= T) continue;
        if (dv) {
            float *r = dv + voff + (size_t)key * ldv + cg * (DV / FA_WC) + 2 * t4;
#pragma unroll
            for (int n = 0; n < NTV; n++) {
                float2 x = *reinterpret_cast<float2 *>(r + 8 * n);
                *reinterpret_cast<float2 *>(r + 8 * n) = make_float2(x.x + dva[n][2 * hi], x.y + dva[n][2 * hi + 1]);
            }
        }
        if (dk) {
            float *r = dk + qoff + (size_t)key * ldq + cg * (DQK / FA_WC) + 2 * t4;
#pragma unroll
            for (int n = 0; n < NTK; n++) {
                float2 x = *reinterpret_cast<float2 *>(r + 8 * n);
                *reinterpret_cast<float2 *>(r + 8 * n) = make_float2(x.x + dka[n][2 * hi], x.y + dka[n][2 * hi + 1]);
            }
        }
    }
}

// ---- backward: dQ ----
// dq [B,T,H,DQK] (fp32, accumulated); the other tensors as fa_dkdv_k. grid (⌈T/64⌉, H, B),
// block owns queries 64i..64i+63 with i = ⌈T/64⌉−1−blockIdx.x (heaviest first).
template <int DQK, int DV>
__global__ static void __launch_bounds__(FA_TB, 1)
    fa_dq_k(float *dq, const fa_bf16 *d_o, const fa_bf16 *q, const fa_bf16 *k, const fa_bf16 *v, const float *lse,
            const float *D, int T, int H, float scale, float scale_log2) {
    constexpr int LQ = DQK + 8, LV = DV + 8, NTK = DQK / (8 * FA_WC), CW = FA_BN / FA_WC;
    extern __shared__ __align__(16) unsigned char fa_smem[];
    // Q, dO; K, V in 2 stages; dS
    fa_bf16 *Qs = (fa_bf16 *)fa_smem, *dOs = Qs + FA_BN * LQ, *Ks0 = dOs + FA_BN * LV, *Vs0 = Ks0 + 2 * FA_BN * LQ;
    fa_bf16 *dSs = Vs0 + 2 * FA_BN * LV;
    float *lse_s = (float *)(dSs + FA_BN * FA_LP), *D_s = lse_s + FA_BN;
    const int nqt = (T + FA_BN - 1) / FA_BN, i = nqt - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int q0 = i * FA_BN;
    const size_t ldq = (size_t)H * DQK, ldv = (size_t)H * DV;
    const size_t qoff = (size_t)b * T * ldq + (size_t)h * DQK, voff = (size_t)b * T * ldv + (size_t)h * DV;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int wr = 16 * (warp & 3), cg = warp >> 2, wc = CW * cg;   // as in fa_dkdv_k, rows are queries
    fa_load<DQK, FA_BN, FA_TB>(Qs, q + qoff, ldq, q0, T - q0);
    fa_load<DV, FA_BN, FA_TB>(dOs, d_o + voff, ldv, q0, T - q0);
    fa_load<DQK, FA_BN, FA_TB>(Ks0, k + qoff, ldq, 0, T);
    fa_load<DV, FA_BN, FA_TB>(Vs0, v + voff, ldv, 0, T);
    fa_cp_commit();
    fa_stage_rows(lse_s, D_s, lse + ((size_t)b * H + h) * T, D + ((size_t)b * H + h) * T, q0, T);
    float dqa[NTK][4];
#pragma unroll
    for (int n = 0; n < NTK; n++) dqa[n][0] = dqa[n][1] = dqa[n][2] = dqa[n][3] = 0.f;
    for (int jt = 0; jt <= i; jt++) {   // key tiles up to the diagonal
        const int k0 = jt * FA_BN, st = jt & 1;
        if (jt < i) {
            const int k1 = k0 + FA_BN;
            fa_load<DQK, FA_BN, FA_TB>(Ks0 + (st ^ 1) * FA_BN * LQ, k + qoff, ldq, k1, T - k1);
            fa_load<DV, FA_BN, FA_TB>(Vs0 + (st ^ 1) * FA_BN * LV, v + voff, ldv, k1, T - k1);
        }
        fa_cp_commit();
        fa_cp_wait<1>();
        __syncthreads();
        const fa_bf16 *Ks = Ks0 + st * FA_BN * LQ, *Vs = Vs0 + st * FA_BN * LV;
        float s[CW / 8][4], dp[CW / 8][4];
#pragma unroll
        for (int n = 0; n < CW / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = dp[n][0] = dp[n][1] = dp[n][2] = dp[n][3] = 0.f;
        fa_warp_mma<DQK / 16, CW / 8, false>(s, Qs + wr * LQ, LQ, Ks + wc * LQ, LQ, lane);
        fa_warp_mma<DV / 16, CW / 8, false>(dp, dOs + wr * LV, LV, Vs + wc * LV, LV, lane);
#pragma unroll
        for (int n = 0; n < CW / 8; n++)
#pragma unroll
            for (int hi = 0; hi < 2; hi++) {
                const int qr = wr + g + 8 * hi, query = q0 + qr;
                float ds[2];
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int key = k0 + wc + 8 * n + 2 * t4 + e;
                    float p = key <= query && key < T ? fa_exp2(fmaf(s[n][2 * hi + e], scale_log2, -lse_s[qr])) : 0.f;
                    ds[e] = p * (dp[n][2 * hi + e] - D_s[qr]) * scale;
                }
                *reinterpret_cast<uint32_t *>(dSs + qr * FA_LP + wc + 8 * n + 2 * t4) = fa_pack(ds[0], ds[1]);
            }
        __syncthreads();
        fa_warp_mma<FA_BN / 16, NTK, true>(dqa, dSs + wr * FA_LP, FA_LP, Ks + cg * (DQK / FA_WC), LQ, lane);
        __syncthreads();   // this stage and dS are free for the next iteration
    }
#pragma unroll
    for (int hi = 0; hi < 2; hi++) {
        const int query = q0 + wr + g + 8 * hi;
        if (query >= T) continue;
        float *r = dq + qoff + (size_t)query * ldq + cg * (DQK / FA_WC) + 2 * t4;
#pragma unroll
        for (int n = 0; n < NTK; n++) {
            float2 x = *reinterpret_cast<float2 *>(r + 8 * n);
            *reinterpret_cast<float2 *>(r + 8 * n) = make_float2(x.x + dqa[n][2 * hi], x.y + dqa[n][2 * hi + 1]);
        }
    }
}

// ---- host ----  (the fp32 inputs are rounded to bf16 copies by lm_cuda_to_bf16, cuda_common.cu)
template <int DQK, int DV> static size_t fa_fwd_smem(void) {
    return (size_t)(FA_BMF * (DQK + 8) + 2 * FA_BN * (DQK + 8) + 2 * FA_BN * (DV + 8)) * sizeof(fa_bf16);
}
// the larger of fa_dkdv_k (K, V, 2 stages of Q, dO, P, dS, 2 stages of lse, D) and fa_dq_k
template <int DQK, int DV> static size_t fa_bwd_smem(void) {
    return (size_t)(3 * FA_BN * (DQK + 8) + 3 * FA_BN * (DV + 8) + 2 * FA_BN * FA_LP) * sizeof(fa_bf16) +
           4 * FA_BN * sizeof(float);
}

template <int DQK, int DV>
static void fa_fwd(float *o, float *lse, const fa_bf16 *q, const fa_bf16 *k, const fa_bf16 *v, int B, int T, int P,
                   int H, float scale) {
    static int ready;   // the > 48 KiB dynamic shared memory opt-in, once per instantiation
    const size_t smem = fa_fwd_smem<DQK, DV>();
    if (!ready) {
        cudaCheck(cudaFuncSetAttribute(fa_fwd_k<DQK, DV>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        ready = 1;
    }
    dim3 grid((T + FA_BMF - 1) / FA_BMF, H, B);
    fa_fwd_k<DQK, DV><<<grid, 32 * FA_WF, smem, lm_cuda_stream()>>>(o, lse, q, k, v, T, P, H, scale,
                                                                     scale * FA_LOG2E);
    cudaLaunchCheck();
}

template <int DQK, int DV>
static void fa_bwd(float *dq, float *dk, float *dv, const fa_bf16 *d_o, const fa_bf16 *q, const fa_bf16 *k,
                   const fa_bf16 *v, const float *lse, const float *D, int B, int T, int H, float scale) {
    static int ready;
    const size_t smem = fa_bwd_smem<DQK, DV>();
    if (!ready) {
        cudaCheck(cudaFuncSetAttribute(fa_dkdv_k<DQK, DV>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        cudaCheck(cudaFuncSetAttribute(fa_dq_k<DQK, DV>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        ready = 1;
    }
    dim3 grid((T + FA_BN - 1) / FA_BN, H, B);
    if (dk || dv) {
        fa_dkdv_k<DQK, DV><<<grid, FA_TB, smem, lm_cuda_stream()>>>(dk, dv, d_o, q, k, v, lse, D, T, H, scale,
                                                                    scale * FA_LOG2E);
        cudaLaunchCheck();
    }
    if (dq) {
        fa_dq_k<DQK, DV><<<grid, FA_TB, smem, lm_cuda_stream()>>>(dq, d_o, q, k, v, lse, D, T, H, scale,
                                                                  scale * FA_LOG2E);
        cudaLaunchCheck();
    }
}

static int fa_aligned(const void *p) { return p == NULL || ((uintptr_t)p & 15) == 0; }

// the instantiated head dims: Dqk ∈ {64, 128, 192}, Dv ∈ {64, 128}
#define FA_DIMS(X) X(64, 64) X(64, 128) X(128, 64) X(128, 128) X(192, 64) X(192, 128)
static int fa_supported(int Dqk, int Dv) {
#define FA_CASE(a, c) if (Dqk == a && Dv == c) return 1;
    FA_DIMS(FA_CASE)
#undef FA_CASE
    return 0;
}

// q, k, v in bf16, 256-byte aligned each ([B·(P+T), H·D] rows; P = 0 for a training lo)
typedef struct { size_t bq, bk, bv; } fa_lo_sizes;
static fa_lo_sizes fa_lo(int B, int T, int P, int H, int Dqk, int Dv) {
    const size_t nq = (size_t)B * T * H * Dqk, nk = (size_t)B * (P + T) * H * Dqk, nv = (size_t)B * (P + T) * H * Dv;
    return (fa_lo_sizes){lm_align256(nq * sizeof(fa_bf16)), lm_align256(nk * sizeof(fa_bf16)),
                         lm_align256(nv * sizeof(fa_bf16))};
}
// the forward's kernels on bf16 q, k, v
static void flash_fwd_bf16(float *o, float *lse, const fa_bf16 *qb, const fa_bf16 *kb, const fa_bf16 *vb, int B, int T,
                           int P, int H, int Dqk, int Dv, float scale) {
    if (cuda_attn_flash_wg_fwd(o, lse, qb, kb, vb, B, T, P, H, Dqk, Dv, scale)) return;
#define FA_CASE(a, c) \
    if (Dqk == a && Dv == c) fa_fwd<a, c>(o, lse, qb, kb, vb, B, T, P, H, scale);
    FA_DIMS(FA_CASE)
#undef FA_CASE
}

// Every fp32 pointer must be 16-byte aligned (float4 conversion loads, float2 read-modify-writes).
// P: positions before the T queries (k, v hold P + T per sequence; 0 = plain causal)
int cuda_attn_flash_fwd(real *o, real *lse, const real *q, const real *k, const real *v, int B, int T, int P, int H,
                        int Dqk, int Dv, real scale) {
    if (!fa_supported(Dqk, Dv) || !fa_aligned(o) || !fa_aligned(q) || !fa_aligned(k) || !fa_aligned(v)) return 0;
    const fa_lo_sizes z = fa_lo(B, T, P, H, Dqk, Dv);
    char *ws = (char *)lm_cuda_scratch(z.bq + z.bk + z.bv);
    fa_bf16 *qb = (fa_bf16 *)ws, *kb = (fa_bf16 *)(ws + z.bq), *vb = (fa_bf16 *)(ws + z.bq + z.bk);
    lm_cuda_to_bf16(qb, q, (size_t)B * T * H * Dqk);
    lm_cuda_to_bf16(kb, k, (size_t)B * (P + T) * H * Dqk);
    lm_cuda_to_bf16(vb, v, (size_t)B * (P + T) * H * Dv);
    flash_fwd_bf16(o, lse, qb, kb, vb, B, T, P, H, Dqk, Dv, scale);
    return 1;
}

// The training forms over an attention lo (ops.h attn_lo_bytes: q, k, v in bf16, as
// cuda_attn_flash_fwd rounds them): 0 bytes for head dims without these kernels
size_t lm_cuda_attn_lo_bytes(int B, int T, int H, int Dqk, int Dv) {
    if (!fa_supported(Dqk, Dv) || B <= 0 || T <= 0 || H <= 0) return 0;
    const fa_lo_sizes z = fa_lo(B, T, 0, H, Dqk, Dv);
    return z.bq + z.bk + z.bv;
}
void lm_cuda_attn_lo_parts(void *lo, int B, int T, int H, int Dqk, int Dv, void **q, void **k, void **v) {
    const fa_lo_sizes z = fa_lo(B, T, 0, H, Dqk, Dv);
    *q = lo;
    *k = (char *)lo + z.bq;
    *v = (char *)lo + z.bq + z.bk;
}
// k, v already in lo (mla_split_fwd_lo); q rounded into it here. 0 where the kernels do not apply.
int cuda_attn_flash_fwd_lo(real *o, real *lse, const real *q, void *lo, int B, int T, int H, int Dqk, int Dv,
                           real scale) {
    if (!fa_supported(Dqk, Dv) || !fa_aligned(o) || !fa_aligned(q) || !fa_aligned(lo)) return 0;
    void *qb, *kb, *vb;
    lm_cuda_attn_lo_parts(lo, B, T, H, Dqk, Dv, &qb, &kb, &vb);
    lm_cuda_to_bf16((fa_bf16 *)qb, q, (size_t)B * T * H * Dqk);
    flash_fwd_bf16(o, lse, (const fa_bf16 *)qb, (const fa_bf16 *)kb, (const fa_bf16 *)vb, B, T, 0, H, Dqk, Dv, scale);
    return 1;
}

int lm_cuda_attn_flash_fwd_bf16(float *o, float *lse, const void *q, const void *k, const void *v, int B, int T, int P,
                                int H, int Dqk, int Dv, float scale) {
    return cuda_attn_flash_wg_fwd(o, lse, (const fa_bf16 *)q, (const fa_bf16 *)k, (const fa_bf16 *)v, B, T, P, H, Dqk,
                                  Dv, scale);
}
void lm_cuda_round_bf16(void *dst, const float *src, size_t n) { lm_cuda_to_bf16((fa_bf16 *)dst, src, n); }

// the backward's kernels on bf16 q, k, v (qb == NULL: rounded from q, k, v into the workspace)
static void flash_bwd(float *dq, float *dk, float *dv, const float *d_o, const float *q, const float *k, const float *v,
                      const fa_bf16 *qb, const fa_bf16 *kb, const fa_bf16 *vb, const float *o, const float *lse, int B,
                      int T, int H, int Dqk, int Dv, float scale, int assign) {
    const size_t nq = (size_t)B * T * H * Dqk, nv = (size_t)B * T * H * Dv, rows = (size_t)B * H * T;
    const size_t bD = lm_align256(rows * sizeof(float)), bv = lm_align256(nv * sizeof(fa_bf16));
    const fa_lo_sizes z = fa_lo(B, T, 0, H, Dqk, Dv);
    char *ws = (char *)lm_cuda_scratch(bD + bv + (qb ? 0 : z.bq + z.bk + z.bv));
    float *D = (float *)ws;
    fa_bf16 *dob = (fa_bf16 *)(ws + bD);
    if (!qb) {
        fa_bf16 *w = (fa_bf16 *)(ws + bD + bv);
        lm_cuda_to_bf16(w, q, nq);
        lm_cuda_to_bf16((fa_bf16 *)((char *)w + z.bq), k, nq);
        lm_cuda_to_bf16((fa_bf16 *)((char *)w + z.bq + z.bk), v, nv);
        qb = w;
        kb = (const fa_bf16 *)((char *)w + z.bq);
        vb = (const fa_bf16 *)((char *)w + z.bq + z.bk);
    }
    cuda_attn_D(D, d_o, o, B, T, H, Dv);
    lm_cuda_to_bf16(dob, d_o, nv);
    if (cuda_attn_flash_wg_bwd(dq, dk, dv, dob, qb, kb, vb, lse, D, B, T, H, Dqk, Dv, scale, assign)) return;
    if (assign) lm_cuda_zero_attn_grads(dq, dk, dv, nq, nv);   // these kernels add
#define FA_CASE(a, c) \
    if (Dqk == a && Dv == c) fa_bwd<a, c>(dq, dk, dv, dob, qb, kb, vb, lse, D, B, T, H, scale);
    FA_DIMS(FA_CASE)
#undef FA_CASE
}

int cuda_attn_flash_bwd(real *dq, real *dk, real *dv, const real *d_o, const real *q, const real *k, const real *v,
                        const real *o, const real *lse, int B, int T, int H, int Dqk, int Dv, real scale, int assign) {
    if (!fa_supported(Dqk, Dv) || !fa_aligned(dq) || !fa_aligned(dk) || !fa_aligned(dv) || !fa_aligned(d_o) ||
        !fa_aligned(q) || !fa_aligned(k) || !fa_aligned(v))
        return 0;
    flash_bwd(dq, dk, dv, d_o, q, k, v, NULL, NULL, NULL, o, lse, B, T, H, Dqk, Dv, scale, assign);
    return 1;
}
// q, k, v from an attention lo (cuda_attn_flash_fwd_lo's); 0 where the kernels do not apply
int cuda_attn_flash_bwd_lo(real *dq, real *dk, real *dv, const real *d_o, const void *lo, const real *o,
                           const real *lse, int B, int T, int H, int Dqk, int Dv, real scale, int assign) {
    if (!fa_supported(Dqk, Dv) || !fa_aligned(dq) || !fa_aligned(dk) || !fa_aligned(dv) || !fa_aligned(d_o) ||
        !fa_aligned(lo))
        return 0;
    void *qb, *kb, *vb;
    lm_cuda_attn_lo_parts((void *)lo, B, T, H, Dqk, Dv, &qb, &kb, &vb);
    flash_bwd(dq, dk, dv, d_o, NULL, NULL, NULL, (const fa_bf16 *)qb, (const fa_bf16 *)kb, (const fa_bf16 *)vb, o, lse,
              B, T, H, Dqk, Dv, scale, assign);
    return 1;
}
