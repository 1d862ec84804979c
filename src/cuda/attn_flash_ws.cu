// attn_flash_ws.cu — causal flash attention (forward, dQ, dK/dV) with a TMA producer warpgroup
// and two ping-ponged consumer warpgroups (FlashAttention-3's schedule), sm_90a, for the head
// dims of attn_flash_wg.cu (FW_DIMS there; it calls in here for LM_FA_WG=tma, the default).
//
// Why: attn_flash_wg.cu's forward has all 256 threads copy K and V tiles by cp.async and meet
// at a block barrier per tile, so both warpgroups reach their softmax together and the tensor
// cores idle through it (cuDNN's SDPA was 1.34–1.54× faster, RESULTS session 14). Here:
//   - one thread of warpgroup 2 (whose registers go to the others by setmaxnreg) issues TMA
//     copies of Q, then of each key tile's K and V into rings of NS slots;
//     K and V have their own `full` / `empty` mbarriers, so a K slot is refilled as soon as
//     both warpgroups' S = Q·Kᵀ is done, while V is still in use by P·V;
//   - warpgroup g (warps 4g..4g+3) owns query rows 64g..64g+63 of the CTA's 128. Per key tile
//     it issues S_kb = Q·K_kbᵀ and O += P_{kb−1}·V_{kb−1} together, runs the softmax of S_kb
//     while P·V multiplies (the overlap inside a warpgroup of attn_flash_wg.cu's PIPE), and
//     the two warpgroups take turns to issue (named barriers 1 and 2), so one's softmax runs
//     while the other's products occupy the tensor cores.
// No block-wide barrier after the setup. Tiles are boxes of 64 channels (128 bytes, the
// swizzle row) × rows; V's boxes, K-major like K's, are read by P·V as an MN-major operand
// (64-value blocks a box apart). Keys and queries past a sequence's end are zero-filled by the
// copies (the maps are 3-D: channels, positions, batch) and masked as in attn_flash_wg.cu.
// The dQ and dK/dV kernels below use the same roles (their comments say what they stream).
#include "cuda_common.cuh"
#include "attn_wg.cuh"
#include "mbarrier.cuh"
#include "tma.cuh"
#include <cuda_bf16.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FS_THREADS 384   // two consumer warpgroups + a producer warpgroup (one thread of it copies)
#define FS_BM 128        // query rows per CTA
#define FS_DIMS(X) X(192, 128) X(128, 128) X(64, 64)   // attn_flash_wg.cu's FW_DIMS

// The CTA's shared memory: its 128 query rows' resident boxes (Q; the dQ kernel also dO), NS K
// slots and NS V slots of BN keys (all 1024-aligned), then the mbarriers: resident, kfull[NS],
// kempty[NS], vfull[NS], vempty[NS]
template <int DQK, int DV, int BN, int NS, bool DO> struct FsCfg {
    static constexpr int KS = DQK / 64, VS = DV / 64;
    static constexpr int Q_BYTES = KS * FS_BM * 128, O_BYTES = DO ? VS * FS_BM * 128 : 0;
    static constexpr int K_BYTES = KS * BN * 128, V_BYTES = VS * BN * 128;
    static constexpr int RES = Q_BYTES + O_BYTES, BAR = RES + NS * (K_BYTES + V_BYTES);
    static constexpr int SMEM = 1024 + BAR + 8 * (1 + 4 * NS);
    static_assert(SMEM <= 227 * 1024, "shared memory");
};

// the maps over q [B,T,H,DQK], k [B,P+T,H,DQK], v [B,P+T,H,DV] and (dQ) d_o [B,T,H,DV], bf16, as
// 3-D tensors (channels, positions, batch)
struct FsMaps {
    CUtensorMap q, k, v, o;
};

// Where the rings are, and the producer and consumer sides of them. Slot of key tile kb: kb % NS,
// its phase (kb / NS) & 1.
template <class C, int NS> struct FsRing {
    uint32_t sQ, sO, sK, sV, res, kfull, kempty, vfull, vempty;
    // every thread of the CTA: thread 0 initialises the barriers; a __syncthreads follows
    __device__ explicit FsRing(uint8_t *raw) {
        sQ = ((uint32_t)__cvta_generic_to_shared(raw) + 1023u) & ~1023u;
        sO = sQ + C::Q_BYTES;
        sK = sQ + C::RES;
        sV = sK + NS * C::K_BYTES;
        res = sQ + C::BAR;
        kfull = res + 8;
        kempty = kfull + 8 * NS;
        vfull = kempty + 8 * NS;
        vempty = vfull + 8 * NS;
        if (threadIdx.x == 0) {
            mb_init(res, 1);
            for (int s = 0; s < NS; s++) {
                mb_init(kfull + 8 * s, 1);
                mb_init(vfull + 8 * s, 1);
                mb_init(kempty + 8 * s, 2);   // one arrival per consumer warpgroup
                mb_init(vempty + 8 * s, 2);
            }
            mb_init_fence();
        }
        __syncthreads();
    }
    __device__ uint32_t k_at(int kb) const { return sK + (kb % NS) * C::K_BYTES; }
    __device__ uint32_t v_at(int kb) const { return sV + (kb % NS) * C::V_BYTES; }
    // the producer thread: the resident boxes (query rows q0..), then key tiles 0..nkb−1
    template <int DQK, int DV, int BN>
    __device__ void produce(const FsMaps &m, int h, int b, int q0, int nkb) const {
        mb_expect_tx(res, C::RES);
#pragma unroll
        for (int sl = 0; sl < C::KS; sl++) tma_3d(sQ + sl * FS_BM * 128, &m.q, h * DQK + 64 * sl, q0, b, res);
        if (C::O_BYTES)
#pragma unroll
            for (int j = 0; j < C::VS; j++) tma_3d(sO + j * FS_BM * 128, &m.o, h * DV + 64 * j, q0, b, res);
        for (int kb = 0; kb < nkb; kb++) {
            const int s = kb % NS, ph = (kb / NS) & 1, k0 = kb * BN;
            mb_wait(kempty + 8 * s, ph ^ 1);
            mb_expect_tx(kfull + 8 * s, C::K_BYTES);
#pragma unroll
            for (int sl = 0; sl < C::KS; sl++)
                tma_3d(k_at(kb) + sl * BN * 128, &m.k, h * DQK + 64 * sl, k0, b, kfull + 8 * s);
            mb_wait(vempty + 8 * s, ph ^ 1);
            mb_expect_tx(vfull + 8 * s, C::V_BYTES);
#pragma unroll
            for (int j = 0; j < C::VS; j++) tma_3d(v_at(kb) + j * BN * 128, &m.v, h * DV + 64 * j, k0, b, vfull + 8 * s);
        }
    }
    __device__ void wait_k(int kb) const { mb_wait(kfull + 8 * (kb % NS), (kb / NS) & 1); }
    __device__ void wait_v(int kb) const { mb_wait(vfull + 8 * (kb % NS), (kb / NS) & 1); }
    __device__ void free_k(int kb, bool leader) const {
        if (leader) mb_arrive(kempty + 8 * (kb % NS));
    }
    __device__ void free_v(int kb, bool leader) const {
        if (leader) mb_arrive(vempty + 8 * (kb % NS));
    }
};

// named barriers 1 and 2 over the 256 consumer threads (immediate ids: a register id makes ptxas
// reserve all 16)
__device__ __forceinline__ void fs_bar_sync(int id) {
    if (id == 1) asm volatile("bar.sync 1, 256;\n" ::: "memory");
    else asm volatile("bar.sync 2, 256;\n" ::: "memory");
}
__device__ __forceinline__ void fs_bar_arrive(int id) {
    if (id == 1) asm volatile("bar.arrive 1, 256;\n" ::: "memory");
    else asm volatile("bar.arrive 2, 256;\n" ::: "memory");
}
// The consumer warpgroups' turns to issue products: warpgroup g waits at barrier 1 + g, issues,
// then lets the other go (1 + (g ^ 1)). The second warpgroup opens the first turn and skips its
// last hand-over, so each barrier sees exactly as many arrivals as waits (n turns each).
struct FsTurns {
    int wg, left;
    __device__ FsTurns(int wg_, int n) : wg(wg_), left(n) {
        if (wg == 1) fs_bar_arrive(1);
    }
    __device__ void begin() const { fs_bar_sync(1 + wg); }
    __device__ void end() {
        if (--left > 0 || wg == 0) fs_bar_arrive(1 + (wg ^ 1));
    }
};

// o [B,T,H,DV] fp32, lse [B,H,T] (may be NULL); maps q, k, v (query t is position P + t and sees
// keys 0..P+t). grid (⌈T/128⌉, H, B), the heaviest query tiles first.
template <int DQK, int DV, int BN, int NS>
__global__ static void __launch_bounds__(FS_THREADS, 1)
    fa_ws_fwd_k(const __grid_constant__ FsMaps maps, float *o, float *lse, int T, int P, int H, float scale,
                float scale_log2) {
    typedef FsCfg<DQK, DV, BN, NS, false> C;
    extern __shared__ uint8_t fs_raw[];
    const FsRing<C, NS> ring(fs_raw);
    const int nqb = (T + FS_BM - 1) / FS_BM, qb = nqb - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int q0 = qb * FS_BM, Tk = P + T;
    const int nkb = min((P + q0 + FS_BM - 1) / BN + 1, (Tk + BN - 1) / BN);
    const int tid = threadIdx.x, warp = tid >> 5, l = tid & 31;
    if (!wg_consumer(8, [&] { ring.template produce<DQK, DV, BN>(maps, h, b, q0, nkb); })) return;
    const int wg = warp >> 2, w = warp & 3;
    const bool leader = (tid & 127) == 0;
    const int r0 = q0 + 64 * wg + 16 * w;   // the warp's first row
    float acc[DV / 2], s[BN / 2];
#pragma unroll
    for (int i = 0; i < DV / 2; i++) acc[i] = 0.f;
    FwRows rows;
    rows.init();
    auto issue_s = [&](int kb) {   // S = Q·K_kbᵀ, one commit group
        wg_fence();
        fw_ss_slices<BN, C::KS, FS_BM>(s, ring.sQ, wg, ring.k_at(kb));
        wg_commit();
    };
    auto issue_pv = [&](const uint32_t (*pa)[4], int kb) {   // O += P_kb·V_kb, one commit group
        const uint32_t v0 = ring.v_at(kb);
#pragma unroll
        for (int j = 0; j < BN / 16; j++) wg_rs<DV, 1>(acc, pa[j], wb_desc(v0 + j * 2048, BN * 128, 1024), 1);
        wg_commit();
    };
    FsTurns turns(wg, nkb);
    uint32_t pa[BN / 16][4], pb[BN / 16][4];
    float alpha[2];
    mb_wait(ring.res, 0);
    ring.wait_k(0);
    turns.begin();
    issue_s(0);
    turns.end();
    wg_wait<0>();
    ring.free_k(0, leader);
    rows.step<BN>(s, pa, alpha, 0, r0, l, P, Tk, scale_log2);
    // step kb: S_kb with P·V_{kb−1} (P in prev), the softmax of S_kb into cur
    auto step = [&](const uint32_t (*prev)[4], uint32_t (*cur)[4], int kb) {
        ring.wait_k(kb);
        ring.wait_v(kb - 1);
        turns.begin();
        issue_s(kb);
        issue_pv(prev, kb - 1);
        turns.end();
        wg_wait<1>();   // S_kb
        ring.free_k(kb, leader);
        rows.step<BN>(s, cur, alpha, kb * BN, r0, l, P, Tk, scale_log2);
        wg_wait<0>();   // P·V_{kb−1}
        ring.free_v(kb - 1, leader);
        FwRows::rescale<DV>(acc, alpha);
    };
    for (int kb = 1; kb < nkb; kb += 2) {
        step(pa, pb, kb);
        if (kb + 1 < nkb) step(pb, pa, kb + 1);
    }
    // the last tile's P·V (its P is in pa when nkb is odd, else pb)
    ring.wait_v(nkb - 1);
    wg_fence();
    if (nkb & 1) issue_pv(pa, nkb - 1);   // (a run-time choice of array would put both in local memory)
    else issue_pv(pb, nkb - 1);
    wg_wait<0>();
    rows.store<DV>(acc, o + (size_t)b * T * H * DV + (size_t)h * DV, (long)H * DV,
                   lse ? lse + ((size_t)b * H + h) * T : NULL, r0, l, T, scale);
}

// dQ = Σ over key tiles dS·K with dS = P ∘ (dP − D)·scale, P = exp2(S·scale_log2 − lse2),
// S = Q·Kᵀ, dP = dO·Vᵀ (attn_flash_wg.cu's fa_wg_dq_k on this file's pipeline: Q and dO resident,
// K and V streamed). A warpgroup issues S_kb and dP_kb with dQ += dS_{kb−1}·K_{kb−1} and forms
// dS_kb while that multiplies; the warpgroups take turns to issue. dq [B,T,H,DQK] fp32, added
// into (assign: written); lse, D [B,H,T]. grid (⌈T/128⌉, H, B), the heaviest query tiles first.
template <int DQK, int DV, int BN, int NS>
__global__ static void __launch_bounds__(FS_THREADS, 1)
    fa_ws_dq_k(const __grid_constant__ FsMaps maps, float *dq, const float *lse, const float *D, int T, int H,
               float scale, float scale_log2, int assign) {
    typedef FsCfg<DQK, DV, BN, NS, true> C;
    extern __shared__ uint8_t fs_raw[];
    const FsRing<C, NS> ring(fs_raw);
    const int nqb = (T + FS_BM - 1) / FS_BM, qb = nqb - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int q0 = qb * FS_BM;
    const int nkb = min((q0 + FS_BM - 1) / BN + 1, (T + BN - 1) / BN);
    const int tid = threadIdx.x, warp = tid >> 5, l = tid & 31;
    if (!wg_consumer(8, [&] { ring.template produce<DQK, DV, BN>(maps, h, b, q0, nkb); })) return;
    const int wg = warp >> 2, w = warp & 3;
    const bool leader = (tid & 127) == 0;
    const int r0 = q0 + 64 * wg + 16 * w + (l >> 2);   // this thread's rows r0, r0 + 8
    float lse2[2], Dr[2];
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {   // rows past T: P = 0 (lse2 = +inf)
        const int r = r0 + 8 * hr;
        lse2[hr] = r < T ? lse[((size_t)b * H + h) * T + r] * FA_LOG2E : INFINITY;
        Dr[hr] = r < T ? D[((size_t)b * H + h) * T + r] : 0.f;
    }
    float dqa[DQK / 2], s[BN / 2], dp[BN / 2];
#pragma unroll
    for (int i = 0; i < DQK / 2; i++) dqa[i] = 0.f;
    auto issue_sdp = [&](int kb) {   // S = Q·K_kbᵀ, dP = dO·V_kbᵀ, one commit group
        wg_fence();
        fw_ss_slices<BN, C::KS, FS_BM>(s, ring.sQ, wg, ring.k_at(kb));
        fw_ss_slices<BN, C::VS, FS_BM>(dp, ring.sO, wg, ring.v_at(kb));
        wg_commit();
    };
    auto issue_dq = [&](const uint32_t (*da)[4], int kb) {   // dQ += dS_kb·K_kb (K read MN-major)
        const uint32_t k0 = ring.k_at(kb);
#pragma unroll
        for (int j = 0; j < BN / 16; j++) wg_rs<DQK, 1>(dqa, da[j], wb_desc(k0 + j * 2048, BN * 128, 1024), 1);
        wg_commit();
    };
    // One packed dS buffer: dS_kb is formed in fp32 in place while dQ += dS_{kb−1}·K_{kb−1} still
    // reads the packed one, and packed once that product is done (two packed buffers made the
    // 192/128 instance spill inside the turn, where the other warpgroup waits)
    FsTurns turns(wg, nkb);
    uint32_t da[BN / 16][4];
    mb_wait(ring.res, 0);
    ring.wait_k(0);
    ring.wait_v(0);
    turns.begin();
    issue_sdp(0);
    turns.end();
    wg_wait<0>();
    ring.free_v(0, leader);
    fw_form_ds<BN>(s, dp, da, 0, r0, l, lse2, Dr, scale_log2, scale);
    for (int kb = 1; kb < nkb; kb++) {   // S_kb, dP_kb with dQ += dS_{kb−1}·K_{kb−1}
        ring.wait_k(kb);
        ring.wait_v(kb);
        turns.begin();
        issue_sdp(kb);
        issue_dq(da, kb - 1);
        turns.end();
        wg_wait<1>();   // S_kb, dP_kb
        ring.free_v(kb, leader);
        fw_ds_in_place<BN>(s, dp, kb * BN, r0, l, lse2, Dr, scale_log2, scale);
        wg_wait<0>();   // dQ += dS_{kb−1}·K_{kb−1}
        ring.free_k(kb - 1, leader);
        fw_pack_a<BN>(da, dp);
    }
    wg_fence();
    issue_dq(da, nkb - 1);
    wg_wait<0>();
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const int row = r0 + 8 * hr;
        if (row >= T) continue;
        float *r = dq + ((size_t)b * T + row) * H * DQK + (size_t)h * DQK + 2 * (l & 3);
        fw_add_row<DQK>(r, dqa, hr, assign);
    }
}

// dK, dV (attn_flash_wg.cu's fa_wg_dkdv_k on a TMA pipeline): the CTA's 128 keys (warpgroup g:
// keys 64g..) with their K and V rows resident; 64-row query tiles of Q and dO streamed through
// NS slots (one `full` / `empty` pair each). Per tile and warpgroup, in turns with the other:
//   Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ            wgmma SS, m64 (keys) n64 (queries)
//   Pᵀ, dSᵀ                           registers, from the tile's lse (log2 units) and D
//   dV += Pᵀ·dO, dK += dSᵀ·Q          wgmma RS (the Q / dO tiles read MN-major)
// The tile's lse and D are staged by the warpgroup itself (a value per thread, loaded one tile
// ahead, into a double buffer of its own; a 128-thread barrier per tile). dk [B,T,H,DQK], dv
// [B,T,H,DV] fp32, added into (assign: written; either may be NULL). grid (⌈T/128⌉, H, B): CTA j
// owns keys 128j.. (the lowest keys, the most query tiles, launch first).
#define FS_BQ 64
template <int DQK, int DV, int NS> struct FsKvCfg {
    static constexpr int KS = DQK / 64, VS = DV / 64;
    static constexpr int K_BYTES = KS * 128 * 128, V_BYTES = VS * 128 * 128;      // resident, 128 keys
    static constexpr int Q_BYTES = KS * FS_BQ * 128, O_BYTES = VS * FS_BQ * 128;  // a query tile
    static constexpr int STAGE = Q_BYTES + O_BYTES, RING = K_BYTES + V_BYTES;
    static constexpr int ROWS = RING + NS * STAGE;               // lse, D: 2 warpgroups × 2 buffers × 128 floats
    static constexpr int BAR = ROWS + 2 * 2 * 128 * 4;           // res, full[NS], empty[NS]
    static constexpr int SMEM = 1024 + BAR + 8 * (1 + 2 * NS);
    static_assert(SMEM <= 227 * 1024, "shared memory");
};
// the 128-thread barrier of consumer warpgroup wg (ids 3, 4)
__device__ __forceinline__ void fs_wg_sync(int wg) {
    if (wg == 0) asm volatile("bar.sync 3, 128;\n" ::: "memory");
    else asm volatile("bar.sync 4, 128;\n" ::: "memory");
}
template <int DQK, int DV, int NS>
__global__ static void __launch_bounds__(FS_THREADS, 1)
    fa_ws_dkdv_k(const __grid_constant__ FsMaps maps, float *dk, float *dv, const float *lse, const float *D, int T,
                 int H, float scale, float scale_log2, int assign) {
    typedef FsKvCfg<DQK, DV, NS> C;
    extern __shared__ uint8_t fs_raw[];
    const uint32_t sK = ((uint32_t)__cvta_generic_to_shared(fs_raw) + 1023u) & ~1023u, sV = sK + C::K_BYTES;
    const uint32_t st0 = sK + C::RING, res = sK + C::BAR, full = res + 8, empty = full + 8 * NS;
    float *rows0 = (float *)(fs_raw + (sK - (uint32_t)__cvta_generic_to_shared(fs_raw)) + C::ROWS);
    const int h = blockIdx.y, b = blockIdx.z, k0 = blockIdx.x * 128;
    const int i0 = k0 / FS_BQ, nqt = (T + FS_BQ - 1) / FS_BQ, ntiles = nqt - i0;
    const int tid = threadIdx.x, warp = tid >> 5, l = tid & 31;
    if (tid == 0) {
        mb_init(res, 1);
        for (int s = 0; s < NS; s++) {
            mb_init(full + 8 * s, 1);
            mb_init(empty + 8 * s, 2);
        }
        mb_init_fence();
    }
    __syncthreads();
    auto produce = [&] {   // K, V once; then the query tiles' Q and dO
        mb_expect_tx(res, C::RING);
#pragma unroll
        for (int sl = 0; sl < C::KS; sl++) tma_3d(sK + sl * 128 * 128, &maps.k, h * DQK + 64 * sl, k0, b, res);
#pragma unroll
        for (int j = 0; j < C::VS; j++) tma_3d(sV + j * 128 * 128, &maps.v, h * DV + 64 * j, k0, b, res);
        for (int t = 0; t < ntiles; t++) {
            const int s = t % NS, q0 = (i0 + t) * FS_BQ;
            const uint32_t sQ = st0 + s * C::STAGE, sO = sQ + C::Q_BYTES;
            mb_wait(empty + 8 * s, ((t / NS) & 1) ^ 1);
            mb_expect_tx(full + 8 * s, C::STAGE);
#pragma unroll
            for (int sl = 0; sl < C::KS; sl++)
                tma_3d(sQ + sl * FS_BQ * 128, &maps.q, h * DQK + 64 * sl, q0, b, full + 8 * s);
#pragma unroll
            for (int j = 0; j < C::VS; j++) tma_3d(sO + j * FS_BQ * 128, &maps.o, h * DV + 64 * j, q0, b, full + 8 * s);
        }
    };
    if (!wg_consumer(8, produce)) return;
    const int wg = warp >> 2, w = warp & 3, t128 = tid & 127;
    const bool leader = t128 == 0;
    const int kw = k0 + 64 * wg;   // the warpgroup's first key
    const float *lh = lse + ((size_t)b * H + h) * T, *Dh = D + ((size_t)b * H + h) * T;
    float *rbuf = rows0 + wg * 256;   // [2][128]: lse2 of the tile's 64 queries, then their D
    // this thread's value of query tile i: lse2 (+inf past T) or D (0 past T)
    auto row_value = [&](int i) {
        const int r = i * FS_BQ + (t128 & 63);
        return t128 < 64 ? (r < T ? lh[r] * FA_LOG2E : INFINITY) : (r < T ? Dh[r] : 0.f);
    };
    float dka[DQK / 2], dva[DV / 2];
#pragma unroll
    for (int i = 0; i < DQK / 2; i++) dka[i] = 0.f;
#pragma unroll
    for (int i = 0; i < DV / 2; i++) dva[i] = 0.f;
    FsTurns turns(wg, ntiles);
    float nxt = row_value(i0);
    mb_wait(res, 0);
    for (int t = 0; t < ntiles; t++) {
        const int i = i0 + t, q0 = i * FS_BQ, s = t % NS;
        const uint32_t sQ = st0 + s * C::STAGE, sO = sQ + C::Q_BYTES;
        float *rs = rbuf + (t & 1) * 128;
        rs[t128] = nxt;
        if (t + 1 < ntiles) nxt = row_value(i + 1);
        mb_wait(full + 8 * s, (t / NS) & 1);
        // Sᵀ first; dPᵀ is issued with dV += Pᵀ·dO once P is formed and packed, and dS takes P
        // from the packed bf16 (the value P·dO multiplies), so that S, dP and the two accumulators
        // are never live together (192/128: 96 + 64 + 2·32 registers leave ptxas too few under
        // the 240 of setmaxnreg: it spilled and serialized the wgmmas)
        float sT[FS_BQ / 2];
        turns.begin();
        wg_fence();
        fw_ss_slices<FS_BQ, C::KS, 128>(sT, sK, wg, sQ);
        wg_commit();
        turns.end();
        fs_wg_sync(wg);   // rs complete
        wg_wait<0>();
        uint32_t pa[FS_BQ / 16][4], da[FS_BQ / 16][4];
#pragma unroll
        for (int n = 0; n < FS_BQ / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = kw + 16 * w + (l >> 2) + 8 * (e >> 1), qc = 8 * n + 2 * (l & 3) + (e & 1);
                sT[4 * n + e] = fw_p(sT[4 * n + e], key <= q0 + qc, scale_log2, rs[qc]);
            }
        fw_pack_a<FS_BQ>(pa, sT);
        float dpT[FS_BQ / 2];
        wg_fence();
#pragma unroll
        for (int j = 0; j < FS_BQ / 16; j++) wg_rs<DV, 1>(dva, pa[j], wb_desc(sO + j * 2048, FS_BQ * 128, 1024), 1);
        fw_ss_slices<FS_BQ, C::VS, 128>(dpT, sV, wg, sO);
        wg_commit();
        wg_wait<0>();
#pragma unroll
        for (int n = 0; n < FS_BQ / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e += 2) {   // dSᵀ = Pᵀ ∘ (dPᵀ − D)·scale, P as packed for P·dO (bf16)
                const int qc = 8 * n + 2 * (l & 3);
                const float2 p = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&pa[n >> 1][(n & 1) * 2 + (e >> 1)]));
                dpT[4 * n + e] = p.x * (dpT[4 * n + e] - rs[FS_BQ + qc]) * scale;
                dpT[4 * n + e + 1] = p.y * (dpT[4 * n + e + 1] - rs[FS_BQ + qc + 1]) * scale;
            }
        fw_pack_a<FS_BQ>(da, dpT);
        wg_fence();
#pragma unroll
        for (int j = 0; j < FS_BQ / 16; j++) wg_rs<DQK, 1>(dka, da[j], wb_desc(sQ + j * 2048, FS_BQ * 128, 1024), 1);
        wg_commit();
        wg_wait<0>();
        if (leader) mb_arrive(empty + 8 * s);
    }
#pragma unroll
    for (int hr = 0; hr < 2; hr++) {
        const int key = kw + 16 * w + (l >> 2) + 8 * hr;
        if (key >= T) continue;
        if (dv) {
            float *r = dv + ((size_t)b * T + key) * H * DV + (size_t)h * DV + 2 * (l & 3);
            fw_add_row<DV>(r, dva, hr, assign);
        }
        if (dk) {
            float *r = dk + ((size_t)b * T + key) * H * DQK + (size_t)h * DQK + 2 * (l & 3);
            fw_add_row<DQK>(r, dka, hr, assign);
        }
    }
}

// ---- host ----
// [B, positions, H·D] bf16 as a 3-D map (channels, positions, batch), boxes of 64 channels × rows
static CUtensorMap fs_map(const __nv_bfloat16 *x, int B, long positions, int H, int D, int rows) {
    const long dims[3] = {(long)H * D, positions, B}, strides[2] = {(long)H * D * 2, positions * H * D * 2};
    return lm_tma_map_bf16(x, 3, dims, strides, 64, rows);
}
template <class K> static void fs_opt_in(K kernel, int smem, int *ready) {   // > 48 KiB, once per kernel
    if (!*ready) {
        cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        *ready = 1;
    }
}

template <int DQK, int DV, int BN, int NS>
static void fa_ws_fwd(float *o, float *lse, const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v,
                      int B, int T, int P, int H, float scale) {
    typedef FsCfg<DQK, DV, BN, NS, false> C;
    static int ready;
    fs_opt_in(fa_ws_fwd_k<DQK, DV, BN, NS>, C::SMEM, &ready);
    FsMaps m;
    memset(&m, 0, sizeof m);
    m.q = fs_map(q, B, T, H, DQK, FS_BM);
    m.k = fs_map(k, B, (long)P + T, H, DQK, BN);
    m.v = fs_map(v, B, (long)P + T, H, DV, BN);
    dim3 grid((T + FS_BM - 1) / FS_BM, H, B);
    fa_ws_fwd_k<DQK, DV, BN, NS><<<grid, FS_THREADS, C::SMEM, lm_cuda_stream()>>>(m, o, lse, T, P, H, scale,
                                                                                   scale * FA_LOG2E);
    cudaLaunchCheck();
}

template <int DQK, int DV>
static void fa_ws_dq(float *dq, const __nv_bfloat16 *d_o, const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                     const __nv_bfloat16 *v, const float *lse, const float *D, int B, int T, int H, float scale,
                     int assign) {
    constexpr int BN = 64, NS = 3;
    typedef FsCfg<DQK, DV, BN, NS, true> C;
    static int ready;
    fs_opt_in(fa_ws_dq_k<DQK, DV, BN, NS>, C::SMEM, &ready);
    FsMaps m;
    m.q = fs_map(q, B, T, H, DQK, FS_BM);
    m.o = fs_map(d_o, B, T, H, DV, FS_BM);
    m.k = fs_map(k, B, T, H, DQK, BN);
    m.v = fs_map(v, B, T, H, DV, BN);
    dim3 grid((T + FS_BM - 1) / FS_BM, H, B);
    fa_ws_dq_k<DQK, DV, BN, NS><<<grid, FS_THREADS, C::SMEM, lm_cuda_stream()>>>(m, dq, lse, D, T, H, scale,
                                                                                  scale * FA_LOG2E, assign);
    cudaLaunchCheck();
}

template <int DQK, int DV>
static void fa_ws_dkdv(float *dk, float *dv, const __nv_bfloat16 *d_o, const __nv_bfloat16 *q,
                       const __nv_bfloat16 *k, const __nv_bfloat16 *v, const float *lse, const float *D, int B, int T,
                       int H, float scale, int assign) {
    constexpr int NS = 3;
    typedef FsKvCfg<DQK, DV, NS> C;
    static int ready;
    fs_opt_in(fa_ws_dkdv_k<DQK, DV, NS>, C::SMEM, &ready);
    FsMaps m;
    m.q = fs_map(q, B, T, H, DQK, FS_BQ);
    m.o = fs_map(d_o, B, T, H, DV, FS_BQ);
    m.k = fs_map(k, B, T, H, DQK, 128);
    m.v = fs_map(v, B, T, H, DV, 128);
    dim3 grid((T + 127) / 128, H, B);
    fa_ws_dkdv_k<DQK, DV, NS><<<grid, FS_THREADS, C::SMEM, lm_cuda_stream()>>>(m, dk, dv, lse, D, T, H, scale,
                                                                                scale * FA_LOG2E, assign);
    cudaLaunchCheck();
}

// The dims of attn_flash_wg.cu's FW_DIMS; 0 for others (the caller falls back). Forward key
// tiles of LM_FA_WS_BN rows (128, two slots each; or 64, three; benchmarks).
int cuda_attn_flash_ws_fwd(float *o, float *lse, const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                           const __nv_bfloat16 *v, int B, int T, int P, int H, int Dqk, int Dv, float scale) {
    static int bn = 0;
    if (!bn) {
        const char *s = getenv("LM_FA_WS_BN");
        bn = s && *s ? atoi(s) : 128;
        if (bn != 64 && bn != 128) lm_die("LM_FA_WS_BN='%s' is not 64 or 128", s);
    }
#define FS_CASE(a, c)                                                                   \
    if (Dqk == a && Dv == c) {                                                          \
        if (bn == 64) fa_ws_fwd<a, c, 64, 3>(o, lse, q, k, v, B, T, P, H, scale);       \
        else fa_ws_fwd<a, c, 128, 2>(o, lse, q, k, v, B, T, P, H, scale);               \
        return 1;                                                                       \
    }
    FS_DIMS(FS_CASE)
#undef FS_CASE
    return 0;
}

int cuda_attn_flash_ws_dq(float *dq, const __nv_bfloat16 *d_o, const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                          const __nv_bfloat16 *v, const float *lse, const float *D, int B, int T, int H, int Dqk,
                          int Dv, float scale, int assign) {
#define FS_CASE(a, c)                                                          \
    if (Dqk == a && Dv == c) {                                                 \
        fa_ws_dq<a, c>(dq, d_o, q, k, v, lse, D, B, T, H, scale, assign);      \
        return 1;                                                              \
    }
    FS_DIMS(FS_CASE)
#undef FS_CASE
    return 0;
}

int cuda_attn_flash_ws_dkdv(float *dk, float *dv, const __nv_bfloat16 *d_o, const __nv_bfloat16 *q,
                            const __nv_bfloat16 *k, const __nv_bfloat16 *v, const float *lse, const float *D, int B,
                            int T, int H, int Dqk, int Dv, float scale, int assign) {
#define FS_CASE(a, c)                                                              \
    if (Dqk == a && Dv == c) {                                                     \
        fa_ws_dkdv<a, c>(dk, dv, d_o, q, k, v, lse, D, B, T, H, scale, assign);    \
        return 1;                                                                  \
    }
    FS_DIMS(FS_CASE)
#undef FS_CASE
    return 0;
}
