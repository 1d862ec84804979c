// attn_flash_wg.cu — causal flash attention, forward and backward, on Hopper's warpgroup MMA
// (sm_90a), for Dqk/Dv ∈ {192/128, 128/128, 64/64} (FW_DIMS; the MLA shapes). The mma.sync
// kernels of attn_flash.cu stay for the other dims and as LM_FA_WG=0.
//
// Why: attn_flash.cu's kernels (mma.sync m16n8k16) ran at 151–265 TFLOP/s forward and 92–122
// backward at T = 4K–16K (192/128), cuDNN's SDPA at 307–619 / 267–506 (RESULTS, sessions 2
// and 14). wgmma multiplies a 64 × N tile per warpgroup from shared memory without per-warp
// fragment loads.
//
// Every kernel is a CTA of two warpgroups (64 rows each). Tiles stream by cp.async (all 256
// threads copy, 16 bytes each) into the 128-byte-swizzle layouts of wgmma.cuh, as K-major
// 64-channel slices (the forward's V: MN-major). Score products (S = Q·Kᵀ, and in the
// backward Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ, dP = dO·Vᵀ) take both operands from shared memory
// (fw_ss_slices); the products that consume P or dS (P·V, Pᵀ·dO, dSᵀ·Q, dS·K) take them as
// register A operands straight from the score accumulators (two adjacent 8-column
// accumulator tiles are the A fragment of a 16-deep step, as in FlashAttention-2's P·V;
// fw_pack_a). The forward, per key tile and warpgroup:
//   S = Q·Kᵀ        wgmma SS m64 n{BN} k16, DQK/16 steps, fp32 in registers
//   online softmax  (row max over the 4 lanes of a row, exp2 with the scale folded in)
//   O += P·V        wgmma RS m64 n{DV} k16
// Precision as attn_flash.cu: bf16 operands, fp32 scores, statistics and accumulators; P and
// dS are rounded to bf16 only as operands.
#include "cuda_backend.h"
#include "cuda_common.cuh"
#include "attn_wg.cuh"
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef __nv_bfloat16 fw_bf16;

#define FW_THREADS 256   // two warpgroups
#define FW_BM 128        // query rows per CTA

template <int DQK, int DV, int BN, int STAGES> struct FwCfg {
    static constexpr int KS = DQK / 64;                 // 64-channel slices of q and k
    static constexpr int Q_BYTES = KS * FW_BM * 128, K_BYTES = KS * BN * 128, V_BYTES = BN * DV * 2;
    static constexpr int STAGE = K_BYTES + V_BYTES;
    static constexpr int SMEM = 1024 + Q_BYTES + STAGES * STAGE;   // + slack to align to 1024 B
};

// o [B,T,H,DV] fp32, lse [B,H,T] (natural log of Σ exp(scale·q·k); may be NULL); q [B,T,H,DQK],
// k [B,P+T,H,DQK], v [B,P+T,H,DV] bf16: query t is position P + t and sees keys 0..P+t.
// grid (⌈T/128⌉, H, B), the heaviest query tiles first.
// PIPE (64-key tiles, four stages): a warpgroup issues S_kb = Q·K_kbᵀ and P·V_{kb−1} together
// and runs the softmax of S_kb while P·V_{kb−1} multiplies (two packed-P buffers). Without
// PIPE (128-key tiles, two stages) each product is waited for before the next step.
template <int DQK, int DV, int BN, int STAGES, bool PIPE>
__global__ static void __launch_bounds__(FW_THREADS, 1)
    fa_wg_fwd_k(float *o, float *lse, const fw_bf16 *q, const fw_bf16 *k, const fw_bf16 *v, int T, int P, int H,
                float scale, float scale_log2) {
    typedef FwCfg<DQK, DV, BN, STAGES> C;
    static_assert(!PIPE || STAGES >= 3, "the pipelined loop refills the stage read two tiles back");
    static_assert(PIPE || STAGES >= 2, "double buffering");
    extern __shared__ uint8_t fw_raw[];
    const uint32_t sQ = ((uint32_t)__cvta_generic_to_shared(fw_raw) + 1023u) & ~1023u, sKV = sQ + C::Q_BYTES;
    const int nqb = (T + FW_BM - 1) / FW_BM, qb = nqb - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int q0 = qb * FW_BM, Tk = P + T;
    const long ldq = (long)H * DQK, ldv = (long)H * DV;
    const fw_bf16 *qh = q + (size_t)b * T * ldq + (size_t)h * DQK, *kh = k + (size_t)b * Tk * ldq + (size_t)h * DQK;
    const fw_bf16 *vh = v + (size_t)b * Tk * ldv + (size_t)h * DV;
    const int tid = threadIdx.x, wg = tid >> 7, w = (tid & 127) >> 5, l = tid & 31;
    const int r0 = q0 + 64 * wg + 16 * w;   // the warp's first row; this thread holds r0 + l/4 and r0 + l/4 + 8
    const int nkb = min((P + q0 + FW_BM - 1) / BN + 1, (Tk + BN - 1) / BN);

    auto load_kv = [&](int kb) {
        const uint32_t s = sKV + (kb % STAGES) * C::STAGE;
        const int k0 = kb * BN;
#pragma unroll
        for (int sl = 0; sl < C::KS; sl++)
            wg_load_kmaj<BN, FW_THREADS>(s + sl * BN * 128, kh + (long)k0 * ldq + 64 * sl, ldq, Tk - k0, 64, tid);
#pragma unroll
        for (int hf = 0; hf < BN / 64; hf++)
            wg_load_mn<DV, FW_THREADS>(s + C::K_BYTES + hf * 64 * DV * 2, vh + (long)(k0 + 64 * hf) * ldv, ldv, DV,
                                       Tk - k0 - 64 * hf, tid);
    };
#pragma unroll
    for (int sl = 0; sl < C::KS; sl++)
        wg_load_kmaj<FW_BM, FW_THREADS>(sQ + sl * FW_BM * 128, qh + (long)q0 * ldq + 64 * sl, ldq, T - q0, 64, tid);
#pragma unroll
    for (int t = 0; t < (PIPE ? STAGES - 1 : STAGES); t++) {   // one group per tile (empty past the last)
        if (t < nkb) load_kv(t);
        wg_cp_commit();
    }

    float acc[DV / 2], s[BN / 2];
#pragma unroll
    for (int i = 0; i < DV / 2; i++) acc[i] = 0.f;
    FwRows rows;
    rows.init();
    auto issue_s = [&](int kb) {   // S = Q·K_kbᵀ, committed as one group
        const uint32_t sK = sKV + (kb % STAGES) * C::STAGE;
        wg_fence();
        fw_ss_slices<BN, C::KS, FW_BM>(s, sQ, wg, sK);
        wg_commit();
    };
    // O += P_kb·V_kb from the packed P, committed as one group
    auto issue_pv = [&](const uint32_t (*pa)[4], int kb) {
        const uint32_t sV = sKV + (kb % STAGES) * C::STAGE + C::K_BYTES;
#pragma unroll
        for (int j = 0; j < BN / 16; j++)
            wg_rs<DV, 1>(acc, pa[j], wb_desc(sV + j * 2 * (DV / 64) * 1024, 1024, (DV / 64) * 1024), 1);
        wg_commit();
    };
    auto softmax = [&](uint32_t (*pa)[4], float alpha[2], int kb) {
        rows.step<BN>(s, pa, alpha, kb * BN, r0, l, P, Tk, scale_log2);
    };
    auto rescale = [&](const float alpha[2]) { FwRows::rescale<DV>(acc, alpha); };
    // P in registers is packed before any wgmma that reads it is issued (one packed between
    // two wgmmas makes ptxas fence each one)
    uint32_t pa[BN / 16][4], pb[BN / 16][4];
    float alpha[2];
    wg_cp_wait<PIPE ? STAGES - 2 : STAGES - 1>();   // tile 0 and Q
    wg_fence_proxy();
    __syncthreads();
    issue_s(0);
    wg_wait<0>();
    softmax(pa, alpha, 0);
    if constexpr (PIPE) {
        // FlashAttention-3's overlap inside a warpgroup: S_kb and P·V_{kb−1} are issued
        // together; the softmax of S_kb runs while P·V_{kb−1} multiplies, and O is rescaled
        // once that is done. At the barrier every multiply of tile kb − 2 is done in both
        // warpgroups, so its stage takes tile kb − 2 + STAGES.
        auto step = [&](const uint32_t (*prev)[4], uint32_t (*cur)[4], int kb) {
            wg_cp_wait<STAGES - 3>();   // tile kb
            wg_fence_proxy();
            __syncthreads();
            if (kb - 2 + STAGES < nkb) load_kv(kb - 2 + STAGES);
            wg_cp_commit();
            issue_s(kb);
            issue_pv(prev, kb - 1);
            wg_wait<1>();   // S_kb
            softmax(cur, alpha, kb);
            wg_wait<0>();   // P·V_{kb−1}
            rescale(alpha);
            if (kb + 1 == nkb) {   // the last tile's P·V (here, where its P buffer is known)
                wg_fence();
                issue_pv(cur, kb);
                wg_wait<0>();
            }
        };
        if (nkb == 1) {
            wg_fence();
            issue_pv(pa, 0);
            wg_wait<0>();
        }
        for (int kb = 1; kb < nkb; kb += 2) {
            step(pa, pb, kb);
            if (kb + 1 < nkb) step(pb, pa, kb + 1);
        }
    } else {
        for (int kb = 0;; kb++) {   // O += P_kb·V_kb, then S_{kb+1} and its softmax
            wg_fence();
            issue_pv(pa, kb);
            wg_wait<0>();
            __syncthreads();   // both warpgroups are done with this stage before it is refilled
            if (kb + STAGES < nkb) load_kv(kb + STAGES);
            wg_cp_commit();
            if (kb + 1 == nkb) break;
            wg_cp_wait<STAGES - 1>();   // tile kb + 1
            wg_fence_proxy();
            __syncthreads();
            issue_s(kb + 1);
            wg_wait<0>();
            softmax(pa, alpha, kb + 1);
            rescale(alpha);
        }
    }
    wg_cp_wait<0>();
    rows.store<DV>(acc, o + (size_t)b * T * ldv + (size_t)h * DV, ldv, lse ? lse + ((size_t)b * H + h) * T : NULL, r0, l,
                   T, scale);
}

// ---- backward ----
// dK, dV. A CTA of two warpgroups owns 128 keys (64 each) with their K and V rows in shared
// memory; 64-row query tiles (Q, dO, lse, D) stream through two stages. Per tile and warpgroup:
//   Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ   wgmma SS, m64 (keys) n64 (queries)
//   Pᵀ, dSᵀ                   in registers (fp32), then packed as A operands
//   dV += Pᵀ·dO, dK += dSᵀ·Q wgmma RS; B = the same Q / dO tiles read MN-major (a K-major
//                             tile of 64-channel slices is an MN-major one with LBO = a slice)
// dk [B,T,H,DQK], dv [B,T,H,DV] fp32, accumulated (either may be NULL); d_o, q, k, v bf16;
// lse, D [B,H,T]. grid (⌈T/128⌉, H, B): CTA j owns keys 128j.. (the lowest keys, the most
// query tiles, launch first).
template <int DQK, int DV> struct FwBwdCfg {
    static constexpr int KS = DQK / 64, VS = DV / 64, BQ = 64;
    static constexpr int K_BYTES = KS * 128 * 128, V_BYTES = VS * 128 * 128;   // 128 rows
    static constexpr int Q_BYTES = KS * BQ * 128, O_BYTES = VS * BQ * 128;     // 64 rows
    static constexpr int STAGE = Q_BYTES + O_BYTES + 1024;   // + lse, D (2·64 floats; stages stay 1024-aligned)
    static constexpr int SMEM = 1024 + K_BYTES + V_BYTES + 2 * STAGE;
};
template <int DQK, int DV>
__global__ static void __launch_bounds__(FW_THREADS, 1)
    fa_wg_dkdv_k(float *dk, float *dv, const fw_bf16 *d_o, const fw_bf16 *q, const fw_bf16 *k, const fw_bf16 *v,
                 const float *lse, const float *D, int T, int H, float scale, float scale_log2, int assign) {
    typedef FwBwdCfg<DQK, DV> C;
    constexpr int BQ = C::BQ;
    extern __shared__ uint8_t fw_raw[];
    uint8_t *base = (uint8_t *)(((uintptr_t)fw_raw + 1023) & ~(uintptr_t)1023);
    const uint32_t sK = (uint32_t)__cvta_generic_to_shared(base), sV = sK + C::K_BYTES, sSt = sV + C::V_BYTES;
    float *rows0 = (float *)(base + C::K_BYTES + C::V_BYTES + C::Q_BYTES + C::O_BYTES);   // stage 0's lse, D
    const int h = blockIdx.y, b = blockIdx.z, k0 = blockIdx.x * 128;
    const long ldq = (long)H * DQK, ldv = (long)H * DV;
    const size_t qoff = (size_t)b * T * ldq + (size_t)h * DQK, voff = (size_t)b * T * ldv + (size_t)h * DV;
    const float *lh = lse + ((size_t)b * H + h) * T, *Dh = D + ((size_t)b * H + h) * T;
    const int tid = threadIdx.x, wg = tid >> 7, w = (tid & 127) >> 5, l = tid & 31;
    const int kw = k0 + 64 * wg;   // the warpgroup's first key
#pragma unroll
    for (int sl = 0; sl < C::KS; sl++)
        wg_load_kmaj<128, FW_THREADS>(sK + sl * 128 * 128, k + qoff + (long)k0 * ldq + 64 * sl, ldq, T - k0, 64, tid);
#pragma unroll
    for (int sl = 0; sl < C::VS; sl++)
        wg_load_kmaj<128, FW_THREADS>(sV + sl * 128 * 128, v + voff + (long)k0 * ldv + 64 * sl, ldv, T - k0, 64, tid);
    const int i0 = k0 / BQ, nqt = (T + BQ - 1) / BQ;
    auto load_q = [&](int i, int st) {
        const uint32_t s = sSt + st * C::STAGE;
        const int q0 = i * BQ;
#pragma unroll
        for (int sl = 0; sl < C::KS; sl++)
            wg_load_kmaj<BQ, FW_THREADS>(s + sl * BQ * 128, q + qoff + (long)q0 * ldq + 64 * sl, ldq, T - q0, 64, tid);
#pragma unroll
        for (int sl = 0; sl < C::VS; sl++)
            wg_load_kmaj<BQ, FW_THREADS>(s + C::Q_BYTES + sl * BQ * 128, d_o + voff + (long)q0 * ldv + 64 * sl, ldv,
                                         T - q0, 64, tid);
        float *rs = rows0 + st * (C::STAGE / 4);   // lse in log2 units (+inf past T), D
        if (tid < BQ) {
            const int r = q0 + tid;
            rs[tid] = r < T ? lh[r] * FA_LOG2E : INFINITY;
            rs[BQ + tid] = r < T ? Dh[r] : 0.f;
        }
    };
    load_q(i0, 0);
    wg_cp_commit();
    if (i0 + 1 < nqt) load_q(i0 + 1, 1);
    wg_cp_commit();

    float dka[DQK / 2], dva[DV / 2];
#pragma unroll
    for (int i = 0; i < DQK / 2; i++) dka[i] = 0.f;
#pragma unroll
    for (int i = 0; i < DV / 2; i++) dva[i] = 0.f;
    for (int i = i0; i < nqt; i++) {
        const int q0 = i * BQ, st = (i - i0) & 1;
        const uint32_t sQ = sSt + st * C::STAGE, sO = sQ + C::Q_BYTES;
        const float *rs = rows0 + st * (C::STAGE / 4);
        wg_cp_wait<1>();
        wg_fence_proxy();
        __syncthreads();
        if (q0 + BQ > kw) {   // else every query of the tile precedes the warpgroup's keys
            float sT[BQ / 2], dpT[BQ / 2];
            wg_fence();
            fw_ss_slices<BQ, C::KS, 128>(sT, sK, wg, sQ);
            fw_ss_slices<BQ, C::VS, 128>(dpT, sV, wg, sO);
            wg_commit();
            wg_wait<0>();
#pragma unroll
            for (int n = 0; n < BQ / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int key = kw + 16 * w + (l >> 2) + 8 * (e >> 1), qc = 8 * n + 2 * (l & 3) + (e & 1);
                    fw_p_ds(sT[4 * n + e], dpT[4 * n + e], key <= q0 + qc, scale_log2, rs[qc], rs[BQ + qc], scale);
                }
            uint32_t pa[BQ / 16][4], da[BQ / 16][4];
            fw_pack_a<BQ>(pa, sT);
            fw_pack_a<BQ>(da, dpT);
            wg_fence();
#pragma unroll
            for (int j = 0; j < BQ / 16; j++)
                wg_rs<DV, 1>(dva, pa[j], wb_desc(sO + j * 2048, BQ * 128, 1024), 1);
#pragma unroll
            for (int j = 0; j < BQ / 16; j++)
                wg_rs<DQK, 1>(dka, da[j], wb_desc(sQ + j * 2048, BQ * 128, 1024), 1);
            wg_commit();
            wg_wait<0>();
        }
        __syncthreads();   // both warpgroups are done with this stage before it is refilled
        if (i + 2 < nqt) load_q(i + 2, st);
        wg_cp_commit();
    }
    wg_cp_wait<0>();
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const int key = kw + 16 * w + (l >> 2) + 8 * hr;
        if (key >= T) continue;
        if (dv) {
            float *r = dv + voff + (size_t)key * ldv + 2 * (l & 3);
            fw_add_row<DV>(r, dva, hr, assign);
        }
        if (dk) {
            float *r = dk + qoff + (size_t)key * ldq + 2 * (l & 3);
            fw_add_row<DQK>(r, dka, hr, assign);
        }
    }
}

// dQ. A CTA of two warpgroups owns 128 query rows (64 each) with their Q and dO rows in shared
// memory; 64-row key tiles (K, V) stream through two stages. Per tile and warpgroup:
//   S = Q·Kᵀ, dP = dO·Vᵀ      wgmma SS, m64 (queries) n64 (keys)
//   dS = P ∘ (dP − D)·scale   fp32 registers, packed as the A operand
//   dQ += dS·K                wgmma RS, B = the K tile read MN-major
// dq [B,T,H,DQK] fp32, accumulated. grid (⌈T/128⌉, H, B), the heaviest query tiles first.
template <int DQK, int DV> struct FwDqCfg {
    static constexpr int KS = DQK / 64, VS = DV / 64, BN = 64;
    static constexpr int Q_BYTES = KS * 128 * 128, O_BYTES = VS * 128 * 128;   // 128 rows
    static constexpr int STAGE = KS * BN * 128 + VS * BN * 128;                // K, V tiles
    static constexpr int SMEM = 1024 + Q_BYTES + O_BYTES + 2 * STAGE;
};
template <int DQK, int DV>
__global__ static void __launch_bounds__(FW_THREADS, 1)
    fa_wg_dq_k(float *dq, const fw_bf16 *d_o, const fw_bf16 *q, const fw_bf16 *k, const fw_bf16 *v, const float *lse,
               const float *D, int T, int H, float scale, float scale_log2, int assign) {
    typedef FwDqCfg<DQK, DV> C;
    constexpr int BN = C::BN;
    extern __shared__ uint8_t fw_raw[];
    const uint32_t sQ = ((uint32_t)__cvta_generic_to_shared(fw_raw) + 1023u) & ~1023u, sO = sQ + C::Q_BYTES;
    const uint32_t sKV = sO + C::O_BYTES;
    const int nqb = (T + 127) / 128, qb = nqb - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z, q0 = qb * 128;
    const long ldq = (long)H * DQK, ldv = (long)H * DV;
    const size_t qoff = (size_t)b * T * ldq + (size_t)h * DQK, voff = (size_t)b * T * ldv + (size_t)h * DV;
    const int tid = threadIdx.x, wg = tid >> 7, w = (tid & 127) >> 5, l = tid & 31;
    const int r0 = q0 + 64 * wg + 16 * w + (l >> 2);   // this thread's rows r0, r0 + 8
    float lse2[2], Dr[2];
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const int r = r0 + 8 * hr;
        lse2[hr] = r < T ? lse[((size_t)b * H + h) * T + r] * FA_LOG2E : INFINITY;
        Dr[hr] = r < T ? D[((size_t)b * H + h) * T + r] : 0.f;
    }
#pragma unroll
    for (int sl = 0; sl < C::KS; sl++)
        wg_load_kmaj<128, FW_THREADS>(sQ + sl * 128 * 128, q + qoff + (long)q0 * ldq + 64 * sl, ldq, T - q0, 64, tid);
#pragma unroll
    for (int sl = 0; sl < C::VS; sl++)
        wg_load_kmaj<128, FW_THREADS>(sO + sl * 128 * 128, d_o + voff + (long)q0 * ldv + 64 * sl, ldv, T - q0, 64, tid);
    const int nkb = min((q0 + 127) / BN + 1, (T + BN - 1) / BN);
    auto load_kv = [&](int kb, int st) {
        const uint32_t s = sKV + st * C::STAGE;
        const int kk0 = kb * BN;
#pragma unroll
        for (int sl = 0; sl < C::KS; sl++)
            wg_load_kmaj<BN, FW_THREADS>(s + sl * BN * 128, k + qoff + (long)kk0 * ldq + 64 * sl, ldq, T - kk0, 64, tid);
#pragma unroll
        for (int sl = 0; sl < C::VS; sl++)
            wg_load_kmaj<BN, FW_THREADS>(s + C::KS * BN * 128 + sl * BN * 128, v + voff + (long)kk0 * ldv + 64 * sl, ldv,
                                         T - kk0, 64, tid);
    };
    load_kv(0, 0);
    wg_cp_commit();
    if (nkb > 1) load_kv(1, 1);
    wg_cp_commit();

    float dqa[DQK / 2];
#pragma unroll
    for (int i = 0; i < DQK / 2; i++) dqa[i] = 0.f;
    for (int kb = 0; kb < nkb; kb++) {
        const int kk0 = kb * BN, st = kb & 1;
        const uint32_t sK = sKV + st * C::STAGE, sV = sK + C::KS * BN * 128;
        wg_cp_wait<1>();
        wg_fence_proxy();
        __syncthreads();
        if (kk0 <= q0 + 64 * wg + 63) {   // else every key of the tile follows the warpgroup's queries
            float s[BN / 2], dp[BN / 2];
            wg_fence();
            fw_ss_slices<BN, C::KS, 128>(s, sQ, wg, sK);
            fw_ss_slices<BN, C::VS, 128>(dp, sO, wg, sV);
            wg_commit();
            wg_wait<0>();
            uint32_t da[BN / 16][4];
            fw_form_ds<BN>(s, dp, da, kk0, r0, l, lse2, Dr, scale_log2, scale);
            wg_fence();
#pragma unroll
            for (int j = 0; j < BN / 16; j++)
                wg_rs<DQK, 1>(dqa, da[j], wb_desc(sK + j * 2048, BN * 128, 1024), 1);
            wg_commit();
            wg_wait<0>();
        }
        __syncthreads();
        if (kb + 2 < nkb) load_kv(kb + 2, st);
        wg_cp_commit();
    }
    wg_cp_wait<0>();
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const int row = r0 + 8 * hr;
        if (row >= T) continue;
        float *r = dq + qoff + (size_t)row * ldq + 2 * (l & 3);
        fw_add_row<DQK>(r, dqa, hr, assign);
    }
}

template <int DQK, int DV, int BN, int STAGES, bool PIPE>
static void fa_wg_fwd(float *o, float *lse, const fw_bf16 *q, const fw_bf16 *k, const fw_bf16 *v, int B, int T, int P,
                      int H, float scale) {
    typedef FwCfg<DQK, DV, BN, STAGES> C;
    static int ready;   // the > 48 KiB dynamic shared memory opt-in, once per instantiation
    if (!ready) {
        cudaCheck(cudaFuncSetAttribute(fa_wg_fwd_k<DQK, DV, BN, STAGES, PIPE>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, C::SMEM));
        ready = 1;
    }
    dim3 grid((T + FW_BM - 1) / FW_BM, H, B);
    fa_wg_fwd_k<DQK, DV, BN, STAGES, PIPE><<<grid, FW_THREADS, C::SMEM, lm_cuda_stream()>>>(o, lse, q, k, v, T, P, H,
                                                                                         scale, scale * FA_LOG2E);
    cudaLaunchCheck();
}

// LM_FA_WS_KV0=1 (benchmarks): under LM_FA_WG=tma, this file's cp.async dK/dV kernel beside the
// TMA dQ. Read once.
static int fa_ws_kv0(void) {
    static int kv0 = -1;
    if (kv0 < 0) {
        const char *e = getenv("LM_FA_WS_KV0");
        kv0 = e && *e ? (!strcmp(e, "1") ? 1 : !strcmp(e, "0") ? 0 : -2) : 0;
        if (kv0 < 0) lm_die("LM_FA_WS_KV0='%s' is not 0 or 1", e);
    }
    return kv0;
}

template <int DQK, int DV>
static void fa_wg_bwd(float *dq, float *dk, float *dv, const fw_bf16 *d_o, const fw_bf16 *q, const fw_bf16 *k,
                      const fw_bf16 *v, const float *lse, const float *D, int B, int T, int H, float scale,
                      int assign) {
    static int ready;
    if (!ready) {
        cudaCheck(cudaFuncSetAttribute(fa_wg_dkdv_k<DQK, DV>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       FwBwdCfg<DQK, DV>::SMEM));
        cudaCheck(cudaFuncSetAttribute(fa_wg_dq_k<DQK, DV>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       FwDqCfg<DQK, DV>::SMEM));
        ready = 1;
    }
    dim3 grid((T + 127) / 128, H, B);
    const int tma = lm_cuda_fa_wg() == LM_FA_TMA;
    if ((dk || dv) &&
        !(tma && !fa_ws_kv0() && cuda_attn_flash_ws_dkdv(dk, dv, d_o, q, k, v, lse, D, B, T, H, DQK, DV, scale, assign))) {
        fa_wg_dkdv_k<DQK, DV><<<grid, FW_THREADS, FwBwdCfg<DQK, DV>::SMEM, lm_cuda_stream()>>>(
            dk, dv, d_o, q, k, v, lse, D, T, H, scale, scale * FA_LOG2E, assign);
        cudaLaunchCheck();
    }
    if (dq && !(tma && cuda_attn_flash_ws_dq(dq, d_o, q, k, v, lse, D, B, T, H, DQK, DV, scale, assign))) {
        fa_wg_dq_k<DQK, DV><<<grid, FW_THREADS, FwDqCfg<DQK, DV>::SMEM, lm_cuda_stream()>>>(
            dq, d_o, q, k, v, lse, D, T, H, scale, scale * FA_LOG2E, assign);
        cudaLaunchCheck();
    }
}

// The flash kernels (LM_FA_WG): tma (the default: attn_flash_ws.cu's forward), 128 or 64 (the
// forward here with key tiles of that many rows), 0 (attn_flash.cu's mma.sync kernels, forward
// and backward). The backward is this file's unless 0. Read once unless set by lm_cuda_set_fa_wg.
static int g_fa_wg = -1;
int lm_cuda_fa_wg(void) {
    if (g_fa_wg < 0) {
        const char *s = getenv("LM_FA_WG");
        g_fa_wg = LM_FA_TMA;
        if (s && *s) {
            if (strcasecmp(s, "tma") == 0) g_fa_wg = LM_FA_TMA;
            else if (!strcmp(s, "128") || !strcmp(s, "64") || !strcmp(s, "0")) g_fa_wg = atoi(s);
            else lm_die("LM_FA_WG='%s' is not one of tma, 128, 64, 0", s);
        }
    }
    return g_fa_wg;
}
void lm_cuda_set_fa_wg(int mode) {
    LM_CHECK(mode == 0 || mode == 64 || mode == 128 || mode == LM_FA_TMA, "bad flash-attention kernel choice %d", mode);
    g_fa_wg = mode;
}

// the head dims instantiated here
#define FW_DIMS(X) X(192, 128) X(128, 128) X(64, 64)

// Runs the forward for the dims instantiated here (returns 0 otherwise, or when switched off)
int cuda_attn_flash_wg_fwd(float *o, float *lse, const fw_bf16 *q, const fw_bf16 *k, const fw_bf16 *v, int B, int T,
                           int P, int H, int Dqk, int Dv, float scale) {
    const int bn = lm_cuda_fa_wg();
    if (bn == 0) return 0;
    if (bn == LM_FA_TMA) return cuda_attn_flash_ws_fwd(o, lse, q, k, v, B, T, P, H, Dqk, Dv, scale);
#define FW_CASE(a, c)                                                                  \
    if (Dqk == a && Dv == c) {                                                         \
        if (bn == 64) fa_wg_fwd<a, c, 64, 4, true>(o, lse, q, k, v, B, T, P, H, scale); \
        else fa_wg_fwd<a, c, 128, 2, false>(o, lse, q, k, v, B, T, P, H, scale);       \
        return 1;                                                                      \
    }
    FW_DIMS(FW_CASE)
#undef FW_CASE
    return 0;
}

int cuda_attn_flash_wg_bwd(float *dq, float *dk, float *dv, const fw_bf16 *d_o, const fw_bf16 *q, const fw_bf16 *k,
                           const fw_bf16 *v, const float *lse, const float *D, int B, int T, int H, int Dqk, int Dv,
                           float scale, int assign) {
    if (lm_cuda_fa_wg() == 0) return 0;
#define FW_CASE(a, c)                                                          \
    if (Dqk == a && Dv == c) {                                                 \
        fa_wg_bwd<a, c>(dq, dk, dv, d_o, q, k, v, lse, D, B, T, H, scale, assign); \
        return 1;                                                              \
    }
    FW_DIMS(FW_CASE)
#undef FW_CASE
    return 0;
}
