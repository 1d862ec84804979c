// attn_flash_ws.cu — the causal flash-attention forward with a TMA producer warp and two
// ping-ponged consumer warpgroups (FlashAttention-3's schedule), sm_90a, for the head dims of
// attn_flash_wg.cu (FW_DIMS there; it calls in here for LM_FA_WG=tma, the default).
//
// Why: attn_flash_wg.cu's forward has all 256 threads copy K and V tiles by cp.async and meet
// at a block barrier per tile, so both warpgroups reach their softmax together and the tensor
// cores idle through it (cuDNN's SDPA was 1.34–1.54× faster, RESULTS session 14). Here:
//   - warp 8 issues TMA copies of Q, then of each key tile's K and V into rings of NS slots;
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
#include "cuda_common.cuh"
#include "attn_wg.cuh"
#include "mbarrier.cuh"
#include "tma.cuh"
#include <cuda_bf16.h>
#include <stdint.h>
#include <stdlib.h>

#define FS_THREADS 384   // two consumer warpgroups + a producer warpgroup (one thread of it copies)
#define FS_BM 128        // query rows per CTA

template <int DQK, int DV, int BN, int NS> struct FsCfg {
    static constexpr int KS = DQK / 64, VS = DV / 64;
    static constexpr int Q_BYTES = KS * FS_BM * 128, K_BYTES = KS * BN * 128, V_BYTES = VS * BN * 128;
    // Q, NS K slots, NS V slots (all 1024-aligned), then the mbarriers: q, kfull, kempty, vfull, vempty
    static constexpr int BAR = Q_BYTES + NS * (K_BYTES + V_BYTES);
    static constexpr int SMEM = 1024 + BAR + 8 * (1 + 4 * NS);
};

struct FsMaps {
    CUtensorMap q, k, v;
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
// a warpgroup's register budget: the producer gives its registers to the consumers (a CTA of
// 384 threads starts at 168 each, too few for S, O and two packed P of a 128-key tile)
template <int N> __device__ __forceinline__ void fs_setmaxnreg_dec() {
    WG_ASM("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> __device__ __forceinline__ void fs_setmaxnreg_inc() {
    WG_ASM("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

// o [B,T,H,DV] fp32, lse [B,H,T] (may be NULL); the maps over q [B,T,H,DQK], k [B,P+T,H,DQK],
// v [B,P+T,H,DV] bf16 (query t is position P + t and sees keys 0..P+t). grid (⌈T/128⌉, H, B),
// the heaviest query tiles first.
template <int DQK, int DV, int BN, int NS>
__global__ static void __launch_bounds__(FS_THREADS, 1)
    fa_ws_fwd_k(const __grid_constant__ FsMaps maps, float *o, float *lse, int T, int P, int H, float scale,
                float scale_log2) {
    typedef FsCfg<DQK, DV, BN, NS> C;
    extern __shared__ uint8_t fs_raw[];
    const uint32_t sQ = ((uint32_t)__cvta_generic_to_shared(fs_raw) + 1023u) & ~1023u;
    const uint32_t sK = sQ + C::Q_BYTES, sV = sK + NS * C::K_BYTES;
    const uint32_t qbar = sQ + C::BAR, kfull = qbar + 8, kempty = kfull + 8 * NS, vfull = kempty + 8 * NS,
                   vempty = vfull + 8 * NS;
    const int nqb = (T + FS_BM - 1) / FS_BM, qb = nqb - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int q0 = qb * FS_BM, Tk = P + T;
    const int nkb = min((P + q0 + FS_BM - 1) / BN + 1, (Tk + BN - 1) / BN);
    const int tid = threadIdx.x, warp = tid >> 5, l = tid & 31;
    if (tid == 0) {
        mb_init(qbar, 1);
        for (int s = 0; s < NS; s++) {
            mb_init(kfull + 8 * s, 1);
            mb_init(vfull + 8 * s, 1);
            mb_init(kempty + 8 * s, 2);   // one arrival per consumer warpgroup
            mb_init(vempty + 8 * s, 2);
        }
        mb_init_fence();
    }
    __syncthreads();

    if (warp >= 8) {   // producer
        fs_setmaxnreg_dec<24>();
        if (warp != 8 || l != 0) return;
        mb_expect_tx(qbar, C::Q_BYTES);
#pragma unroll
        for (int sl = 0; sl < C::KS; sl++) tma_3d(sQ + sl * FS_BM * 128, &maps.q, h * DQK + 64 * sl, q0, b, qbar);
        for (int kb = 0; kb < nkb; kb++) {
            const int s = kb % NS, ph = (kb / NS) & 1, k0 = kb * BN;
            mb_wait(kempty + 8 * s, ph ^ 1);
            mb_expect_tx(kfull + 8 * s, C::K_BYTES);
#pragma unroll
            for (int sl = 0; sl < C::KS; sl++)
                tma_3d(sK + s * C::K_BYTES + sl * BN * 128, &maps.k, h * DQK + 64 * sl, k0, b, kfull + 8 * s);
            mb_wait(vempty + 8 * s, ph ^ 1);
            mb_expect_tx(vfull + 8 * s, C::V_BYTES);
#pragma unroll
            for (int j = 0; j < C::VS; j++)
                tma_3d(sV + s * C::V_BYTES + j * BN * 128, &maps.v, h * DV + 64 * j, k0, b, vfull + 8 * s);
        }
        return;
    }

    fs_setmaxnreg_inc<240>();
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
        fw_ss_slices<BN, C::KS, FS_BM>(s, sQ, wg, sK + (kb % NS) * C::K_BYTES);
        wg_commit();
    };
    auto issue_pv = [&](const uint32_t (*pa)[4], int kb) {   // O += P_kb·V_kb, one commit group
        const uint32_t v0 = sV + (kb % NS) * C::V_BYTES;
#pragma unroll
        for (int j = 0; j < BN / 16; j++) wg_rs<DV, 1>(acc, pa[j], wb_desc(v0 + j * 2048, BN * 128, 1024), 1);
        wg_commit();
    };
    // turns: warpgroup g issues after barrier 1 + g, then lets the other go (1 + (g ^ 1)); the
    // second warpgroup opens the first turn and skips its last hand-over, so each barrier sees
    // exactly as many arrivals as waits
    const int my_bar = 1 + wg, other_bar = 1 + (wg ^ 1);
    int turns_left = nkb;
    auto turn_end = [&]() {
        if (--turns_left > 0 || wg == 0) fs_bar_arrive(other_bar);
    };
    if (wg == 1) fs_bar_arrive(1);

    uint32_t pa[BN / 16][4], pb[BN / 16][4];
    float alpha[2];
    mb_wait(qbar, 0);
    mb_wait(kfull, 0);
    fs_bar_sync(my_bar);
    issue_s(0);
    turn_end();
    wg_wait<0>();
    if (leader) mb_arrive(kempty);
    rows.step<BN>(s, pa, alpha, 0, r0, l, P, Tk, scale_log2);
    // step kb: S_kb with P·V_{kb−1} (P in prev), the softmax of S_kb into cur
    auto step = [&](const uint32_t (*prev)[4], uint32_t (*cur)[4], int kb) {
        const int sk = kb % NS, sv = (kb - 1) % NS;
        mb_wait(kfull + 8 * sk, (kb / NS) & 1);
        mb_wait(vfull + 8 * sv, ((kb - 1) / NS) & 1);
        fs_bar_sync(my_bar);
        issue_s(kb);
        issue_pv(prev, kb - 1);
        turn_end();
        wg_wait<1>();   // S_kb
        if (leader) mb_arrive(kempty + 8 * sk);
        rows.step<BN>(s, cur, alpha, kb * BN, r0, l, P, Tk, scale_log2);
        wg_wait<0>();   // P·V_{kb−1}
        if (leader) mb_arrive(vempty + 8 * sv);
        FwRows::rescale<DV>(acc, alpha);
    };
    for (int kb = 1; kb < nkb; kb += 2) {
        step(pa, pb, kb);
        if (kb + 1 < nkb) step(pb, pa, kb + 1);
    }
    // the last tile's P·V (its P is in pa when nkb is odd, else pb)
    const int last = nkb - 1, sv = last % NS;
    mb_wait(vfull + 8 * sv, (last / NS) & 1);
    wg_fence();
    if (nkb & 1) issue_pv(pa, last);   // (a run-time choice of array would put both in local memory)
    else issue_pv(pb, last);
    wg_wait<0>();
    rows.store<DV>(acc, o + (size_t)b * T * H * DV + (size_t)h * DV, (long)H * DV,
                   lse ? lse + ((size_t)b * H + h) * T : NULL, r0, l, T, scale);
}

template <int DQK, int DV, int BN, int NS>
static void fa_ws_fwd(float *o, float *lse, const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v,
                      int B, int T, int P, int H, float scale) {
    typedef FsCfg<DQK, DV, BN, NS> C;
    static_assert(C::SMEM <= 227 * 1024, "shared memory");
    static int ready;
    if (!ready) {
        cudaCheck(cudaFuncSetAttribute(fa_ws_fwd_k<DQK, DV, BN, NS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       C::SMEM));
        ready = 1;
    }
    const long Tk = (long)P + T;
    FsMaps m;
    {   // [B, positions, H·D] as 3-D maps: channels, positions, batch
        const long dq[3] = {(long)H * DQK, T, B}, sq[2] = {(long)H * DQK * 2, (long)T * H * DQK * 2};
        const long dk[3] = {(long)H * DQK, Tk, B}, sk[2] = {(long)H * DQK * 2, Tk * H * DQK * 2};
        const long dv[3] = {(long)H * DV, Tk, B}, sv[2] = {(long)H * DV * 2, Tk * H * DV * 2};
        m.q = lm_tma_map_bf16(q, 3, dq, sq, 64, FS_BM);
        m.k = lm_tma_map_bf16(k, 3, dk, sk, 64, BN);
        m.v = lm_tma_map_bf16(v, 3, dv, sv, 64, BN);
    }
    dim3 grid((T + FS_BM - 1) / FS_BM, H, B);
    fa_ws_fwd_k<DQK, DV, BN, NS><<<grid, FS_THREADS, C::SMEM, lm_cuda_stream()>>>(m, o, lse, T, P, H, scale,
                                                                                   scale * FA_LOG2E);
    cudaLaunchCheck();
}

// the dims of attn_flash_wg.cu's FW_DIMS; 0 for others (the caller falls back). Key tiles of
// LM_FA_WS_BN rows (64 or 128; benchmarks), two slots each for 128, three for 64.
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
    FS_CASE(192, 128)
    FS_CASE(128, 128)
    FS_CASE(64, 64)
#undef FS_CASE
    return 0;
}
