// attn_flash.cu — causal softmax attention (no positions) on tensor cores, flash-attention-2
// style: the T×T score matrix is never stored; the forward keeps an online softmax per query
// row, the backward recomputes the probabilities from the saved lse.
//
// Precision: the op interface is fp32. Tiles are read from global memory as fp32, rounded to
// bf16 while they are staged in shared memory, and multiplied with mma.sync m16n8k16 (bf16 in,
// fp32 accumulate). Scores, the softmax statistics (max, sum, lse), D = rowsum(dO∘O) and all
// accumulators are fp32; the probabilities P and dS are rounded to bf16 only as mma operands.
// Results agree with the fp32 CPU reference to ~3e-3 relative RMS (forward) and ~1e-2
// (gradients); the fallback kernels of mla.cu serve the head dims not instantiated here.
//
// Layouts (as the op): q, k [B,T,H,Dqk], v, o, dO [B,T,H,Dv], lse, D [B,H,T].
//
// Kernels (row-major bf16 tiles with a row stride of D+8 elements,
// which makes every ldmatrix of 8 rows hit 8 distinct bank groups):
//   fa_fwd_k   one block of 4 warps per (64-query tile, head, batch), 3 blocks per SM; warp w
//              owns query rows 16w..16w+15.
//              Key/value tiles of 64 rows are visited up to the diagonal (tiles wholly above it
//              are skipped, and a warp whose 16 rows all precede the tile skips its products).
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
#include <cuda_bf16.h>
#include <stdint.h>

typedef __nv_bfloat16 fa_bf16;

#define FA_WF 4          // forward: warps per block, 16 query rows each
#define FA_BMF (16 * FA_WF)
#define FA_MINBF 3       // forward blocks per SM (≤ 170 registers: accumulators without spills)
#define FA_WC 4          // backward: warps per 16-row slice of a tile (4 slices: 16·FA_WC warps)
#define FA_TB (128 * FA_WC)
#define FA_BN 64         // key rows per tile (forward and backward), query rows per backward tile
#define FA_LP (FA_BN + 8) // row stride of the backward's P / dS tiles
#define FA_LOG2E 1.4426950408889634f

// ---- device helpers ----
__device__ __forceinline__ uint32_t fa_pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}
// 2^x (approximate, like the hardware softmax of every flash kernel); 2^−inf = 0
__device__ __forceinline__ float fa_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
// C[16×8] += A[16×16]·B[16×8], bf16 in, fp32 accumulate
__device__ __forceinline__ void fa_mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// four 8×8 bf16 matrices; lane l gives the address of row l%8 of matrix l/8
__device__ __forceinline__ void fa_ldsm4(uint32_t r[4], const fa_bf16 *p) {
    unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}
__device__ __forceinline__ void fa_ldsm4_t(uint32_t r[4], const fa_bf16 *p) {
    unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
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
        fa_ldsm4(a, A + (lane & 15) * lda + kk * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int n = 0; n < NT; n += 2) {
            uint32_t b[4];
            if (!TRANS) fa_ldsm4(b, B + (8 * n + ((lane >> 4) << 3) + (lane & 7)) * ldb + kk * 16 + ((lane >> 3) & 1) * 8);
            else fa_ldsm4_t(b, B + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * ldb + 8 * n + (lane >> 4) * 8);
            fa_mma(acc[n], a, b[0], b[1]);
            fa_mma(acc[n + 1], a, b[2], b[3]);
        }
    }
}

// Stages ROWS rows of D fp32 channels (global rows row0.., stride ld floats, the first `valid`
// rows exist) into a bf16 tile dst [ROWS][D+8] with NTHR threads; rows past `valid` are zeros.
// float4 loads (the host checks 16-byte alignment) in batches of up to 4 issued before their
// conversions: loads in flight without holding a whole tile in registers (which spills next to
// the accumulators).
template <int D, int ROWS, int NTHR>
__device__ __forceinline__ void fa_stage(fa_bf16 *dst, const float *src, size_t ld, int row0, int valid) {
    constexpr int C4 = D / 4, N = ROWS * C4, PER = N / NTHR;
    constexpr int LB = PER % 4 == 0 ? 4 : PER % 3 == 0 ? 3 : PER % 2 == 0 ? 2 : 1;
    static_assert(N % NTHR == 0, "tile of whole float4 rounds");
#pragma unroll
    for (int i0 = 0; i0 < PER; i0 += LB) {
        float4 x[LB];
#pragma unroll
        for (int i = 0; i < LB; i++) {
            int idx = threadIdx.x + (i0 + i) * NTHR, r = idx / C4, c = idx % C4;
            x[i] = r < valid ? __ldg(reinterpret_cast<const float4 *>(src + (size_t)(row0 + r) * ld) + c)
                             : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int i = 0; i < LB; i++) {
            int idx = threadIdx.x + (i0 + i) * NTHR, r = idx / C4, c = idx % C4;
            uint2 u = make_uint2(fa_pack(x[i].x, x[i].y), fa_pack(x[i].z, x[i].w));
            *reinterpret_cast<uint2 *>(dst + r * (D + 8) + 4 * c) = u;
        }
    }
}

// ---- forward ----
// o [B,T,H,DV], lse [B,H,T] (natural log, scaled scores); q, k [B,T,H,DQK], v [B,T,H,DV].
// grid (⌈T/64⌉, H, B); the heaviest query tiles (most keys) are launched first.
template <int DQK, int DV>
__global__ static void __launch_bounds__(32 * FA_WF, FA_MINBF)
    fa_fwd_k(float *o, float *lse, const float *q, const float *k, const float *v, int T, int H, float scale,
             float scale_log2) {
    constexpr int LQ = DQK + 8, LV = DV + 8, NTV = DV / 8;
    extern __shared__ __align__(16) unsigned char fa_smem[];
    fa_bf16 *Qs = (fa_bf16 *)fa_smem, *Ks = Qs + FA_BMF * LQ, *Vs = Ks + FA_BN * LQ;
    const int nqb = (T + FA_BMF - 1) / FA_BMF, qb = nqb - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int q0 = qb * FA_BMF;
    const size_t ldq = (size_t)H * DQK, ldv = (size_t)H * DV;
    const float *qh = q + (size_t)b * T * ldq + (size_t)h * DQK, *kh = k + (size_t)b * T * ldq + (size_t)h * DQK;
    const float *vh = v + (size_t)b * T * ldv + (size_t)h * DV;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int r0 = q0 + 16 * warp;   // the warp's first query row; this thread holds rows r0+g, r0+g+8
    fa_stage<DQK, FA_BMF, 32 * FA_WF>(Qs, qh, ldq, q0, T - q0);

    float acc[NTV][4];
#pragma unroll
    for (int n = 0; n < NTV; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
    // running max of the raw scores q·k (per row) and this thread's part of the row sum
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    const int nkb = min((q0 + FA_BMF - 1) / FA_BN + 1, (T + FA_BN - 1) / FA_BN);
    for (int kb = 0; kb < nkb; kb++) {
        const int k0 = kb * FA_BN;
        __syncthreads();   // every warp is done with the previous K, V tiles
        fa_stage<DQK, FA_BN, 32 * FA_WF>(Ks, kh, ldq, k0, T - k0);
        fa_stage<DV, FA_BN, 32 * FA_WF>(Vs, vh, ldv, k0, T - k0);
        __syncthreads();
        if (k0 > r0 + 15) continue;   // all 16 rows of this warp precede every key of the tile
        float s[8][4];
#pragma unroll
        for (int n = 0; n < 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
        fa_warp_mma<DQK / 16, 8, false>(s, Qs + 16 * warp * LQ, LQ, Ks, LQ, lane);
        if (k0 + FA_BN - 1 > r0 || k0 + FA_BN > T) {   // the diagonal or the sequence end crosses the tile
#pragma unroll
            for (int n = 0; n < 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int key = k0 + 8 * n + 2 * t4 + (e & 1), row = r0 + g + 8 * (e >> 1);
                    if (key > row || key >= T) s[n][e] = -INFINITY;
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
                fa_ldsm4_t(bb, Vs + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * LV + 8 * n + (lane >> 4) * 8);
                fa_mma(acc[n], a, bb[0], bb[1]);
                fa_mma(acc[n + 1], a, bb[2], bb[3]);
            }
        }
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
        if (t4 == 0) lse[((size_t)b * H + h) * T + row] = m[i] * scale + logf(li);
    }
}

// lse (natural log) and D of the 64 rows row0.. into shared memory; lse in log2 units.
// Rows past T get lse = +inf, so their probabilities are exactly 0.
__device__ __forceinline__ void fa_stage_rows(float *lse_s, float *D_s, const float *lse, const float *D, int row0,
                                              int T) {
    if (threadIdx.x < FA_BN) {
        int r = row0 + threadIdx.x;
        lse_s[threadIdx.x] = r < T ? lse[r] * FA_LOG2E : INFINITY;
        D_s[threadIdx.x] = r < T ? D[r] : 0.f;
    }
}

// ---- backward: dK, dV ----
// dk [B,T,H,DQK], dv [B,T,H,DV] (accumulated; either may be NULL); d_o [B,T,H,DV]; q, k; v;
// lse, D [B,H,T]. grid (⌈T/64⌉, H, B), block j owns keys 64j..64j+63.
template <int DQK, int DV>
__global__ static void __launch_bounds__(FA_TB, 1)
    fa_dkdv_k(float *dk, float *dv, const float *d_o, const float *q, const float *k, const float *v, const float *lse,
              const float *D, int T, int H, float scale, float scale_log2) {
    constexpr int LQ = DQK + 8, LV = DV + 8, NTK = DQK / (8 * FA_WC), NTV = DV / (8 * FA_WC), CW = FA_BN / FA_WC;
    extern __shared__ __align__(16) unsigned char fa_smem[];
    fa_bf16 *Ks = (fa_bf16 *)fa_smem, *Qs = Ks + FA_BN * LQ, *Vs = Qs + FA_BN * LQ, *dOs = Vs + FA_BN * LV;
    fa_bf16 *Ps = dOs + FA_BN * LV, *dSs = Ps + FA_BN * FA_LP;
    float *lse_s = (float *)(dSs + FA_BN * FA_LP), *D_s = lse_s + FA_BN;
    const int j = blockIdx.x, h = blockIdx.y, b = blockIdx.z, k0 = j * FA_BN;
    const size_t ldq = (size_t)H * DQK, ldv = (size_t)H * DV;
    const size_t qoff = (size_t)b * T * ldq + (size_t)h * DQK, voff = (size_t)b * T * ldv + (size_t)h * DV;
    const float *lh = lse + ((size_t)b * H + h) * T, *Dh = D + ((size_t)b * H + h) * T;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int wr = 16 * (warp & 3);   // the warp's 16 key rows in the tile
    const int cg = warp >> 2;         // its column group: query columns cg·CW.. of S^T, and the
    const int wc = CW * cg;           // cg-th 1/FA_WC of the head dims of dK, dV
    fa_stage<DQK, FA_BN, FA_TB>(Ks, k + qoff, ldq, k0, T - k0);
    fa_stage<DV, FA_BN, FA_TB>(Vs, v + voff, ldv, k0, T - k0);
    float dka[NTK][4], dva[NTV][4];
#pragma unroll
    for (int n = 0; n < NTK; n++) dka[n][0] = dka[n][1] = dka[n][2] = dka[n][3] = 0.f;
#pragma unroll
    for (int n = 0; n < NTV; n++) dva[n][0] = dva[n][1] = dva[n][2] = dva[n][3] = 0.f;
    const int nqt = (T + FA_BN - 1) / FA_BN;
    for (int i = j; i < nqt; i++) {   // query tiles at and below the diagonal
        const int q0 = i * FA_BN;
        __syncthreads();   // every warp is done with the previous Q, dO, P, dS
        fa_stage<DQK, FA_BN, FA_TB>(Qs, q + qoff, ldq, q0, T - q0);
        fa_stage<DV, FA_BN, FA_TB>(dOs, d_o + voff, ldv, q0, T - q0);
        fa_stage_rows(lse_s, D_s, lh, Dh, q0, T);
        __syncthreads();
        float st[CW / 8][4], dpt[CW / 8][4];
#pragma unroll
        for (int n = 0; n < CW / 8; n++) st[n][0] = st[n][1] = st[n][2] = st[n][3] = dpt[n][0] = dpt[n][1] = dpt[n][2] = dpt[n][3] = 0.f;
        fa_warp_mma<DQK / 16, CW / 8, false>(st, Ks + wr * LQ, LQ, Qs + wc * LQ, LQ, lane);
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
                    p[e] = key <= query ? fa_exp2(fmaf(st[n][2 * hi + e], scale_log2, -lse_s[qc])) : 0.f;
                    ds[e] = p[e] * (dpt[n][2 * hi + e] - D_s[qc]) * scale;
                }
                *reinterpret_cast<uint32_t *>(Ps + kr * FA_LP + wc + 8 * n + 2 * t4) = fa_pack(p[0], p[1]);
                *reinterpret_cast<uint32_t *>(dSs + kr * FA_LP + wc + 8 * n + 2 * t4) = fa_pack(ds[0], ds[1]);
            }
        __syncthreads();
        fa_warp_mma<FA_BN / 16, NTV, true>(dva, Ps + wr * FA_LP, FA_LP, dOs + cg * (DV / FA_WC), LV, lane);
        fa_warp_mma<FA_BN / 16, NTK, true>(dka, dSs + wr * FA_LP, FA_LP, Qs + cg * (DQK / FA_WC), LQ, lane);
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
// dq [B,T,H,DQK] (accumulated); the other tensors as fa_dkdv_k. grid (⌈T/64⌉, H, B), block
// owns queries 64i..64i+63 with i = ⌈T/64⌉−1−blockIdx.x (heaviest first).
template <int DQK, int DV>
__global__ static void __launch_bounds__(FA_TB, 1)
    fa_dq_k(float *dq, const float *d_o, const float *q, const float *k, const float *v, const float *lse,
            const float *D, int T, int H, float scale, float scale_log2) {
    constexpr int LQ = DQK + 8, LV = DV + 8, NTK = DQK / (8 * FA_WC), CW = FA_BN / FA_WC;
    extern __shared__ __align__(16) unsigned char fa_smem[];
    fa_bf16 *Qs = (fa_bf16 *)fa_smem, *Ks = Qs + FA_BN * LQ, *dOs = Ks + FA_BN * LQ, *Vs = dOs + FA_BN * LV;
    fa_bf16 *dSs = Vs + FA_BN * LV;
    float *lse_s = (float *)(dSs + FA_BN * FA_LP), *D_s = lse_s + FA_BN;
    const int nqt = (T + FA_BN - 1) / FA_BN, i = nqt - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int q0 = i * FA_BN;
    const size_t ldq = (size_t)H * DQK, ldv = (size_t)H * DV;
    const size_t qoff = (size_t)b * T * ldq + (size_t)h * DQK, voff = (size_t)b * T * ldv + (size_t)h * DV;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const int wr = 16 * (warp & 3), cg = warp >> 2, wc = CW * cg;   // as in fa_dkdv_k, rows are queries
    fa_stage<DQK, FA_BN, FA_TB>(Qs, q + qoff, ldq, q0, T - q0);
    fa_stage<DV, FA_BN, FA_TB>(dOs, d_o + voff, ldv, q0, T - q0);
    fa_stage_rows(lse_s, D_s, lse + ((size_t)b * H + h) * T, D + ((size_t)b * H + h) * T, q0, T);
    float dqa[NTK][4];
#pragma unroll
    for (int n = 0; n < NTK; n++) dqa[n][0] = dqa[n][1] = dqa[n][2] = dqa[n][3] = 0.f;
    for (int jt = 0; jt <= i; jt++) {   // key tiles up to the diagonal
        const int k0 = jt * FA_BN;
        __syncthreads();   // every warp is done with the previous K, V, dS
        fa_stage<DQK, FA_BN, FA_TB>(Ks, k + qoff, ldq, k0, T - k0);
        fa_stage<DV, FA_BN, FA_TB>(Vs, v + voff, ldv, k0, T - k0);
        __syncthreads();
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

// ---- host ----
template <int DQK, int DV> static size_t fa_fwd_smem(void) {
    return (size_t)((FA_BMF + FA_BN) * (DQK + 8) + FA_BN * (DV + 8)) * sizeof(fa_bf16);
}
template <int DQK, int DV> static size_t fa_bwd_smem(void) {
    return (size_t)(2 * FA_BN * (DQK + 8) + 2 * FA_BN * (DV + 8) + 2 * FA_BN * FA_LP) * sizeof(fa_bf16) +
           2 * FA_BN * sizeof(float);
}

template <int DQK, int DV>
static void fa_fwd(float *o, float *lse, const float *q, const float *k, const float *v, int B, int T, int H,
                   float scale) {
    static int ready;   // the > 48 KiB dynamic shared memory opt-in, once per instantiation
    const size_t smem = fa_fwd_smem<DQK, DV>();
    if (!ready) {
        cudaCheck(cudaFuncSetAttribute(fa_fwd_k<DQK, DV>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        ready = 1;
    }
    dim3 grid((T + FA_BMF - 1) / FA_BMF, H, B);
    fa_fwd_k<DQK, DV><<<grid, 32 * FA_WF, smem, lm_cuda_stream()>>>(o, lse, q, k, v, T, H, scale, scale * FA_LOG2E);
    cudaLaunchCheck();
}

template <int DQK, int DV>
static void fa_bwd(float *dq, float *dk, float *dv, const float *d_o, const float *q, const float *k, const float *v,
                   const float *lse, const float *D, int B, int T, int H, float scale) {
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

// the instantiated head dims: Dqk ∈ {64, 128, 192}, Dv ∈ {64, 128}; every pointer 16-byte
// aligned (float4 loads and float2 read-modify-writes)
#define FA_DIMS(X) X(64, 64) X(64, 128) X(128, 64) X(128, 128) X(192, 64) X(192, 128)

int cuda_attn_flash_fwd(real *o, real *lse, const real *q, const real *k, const real *v, int B, int T, int H,
                        int Dqk, int Dv, real scale) {
    if (!fa_aligned(o) || !fa_aligned(q) || !fa_aligned(k) || !fa_aligned(v)) return 0;
#define FA_CASE(a, c) \
    if (Dqk == a && Dv == c) { fa_fwd<a, c>(o, lse, q, k, v, B, T, H, scale); return 1; }
    FA_DIMS(FA_CASE)
#undef FA_CASE
    return 0;
}

int cuda_attn_flash_bwd(real *dq, real *dk, real *dv, const real *d_o, const real *q, const real *k, const real *v,
                        const real *lse, const real *D, int B, int T, int H, int Dqk, int Dv, real scale) {
    if (!fa_aligned(dq) || !fa_aligned(dk) || !fa_aligned(dv) || !fa_aligned(d_o) || !fa_aligned(q) ||
        !fa_aligned(k) || !fa_aligned(v))
        return 0;
#define FA_CASE(a, c) \
    if (Dqk == a && Dv == c) { fa_bwd<a, c>(dq, dk, dv, d_o, q, k, v, lse, D, B, T, H, scale); return 1; }
    FA_DIMS(FA_CASE)
#undef FA_CASE
    return 0;
}
