// moe_gemm_wg.cu — the grouped expert GEMMs on bf16 operands with Hopper's wgmma (sm_90a):
// the fast path behind moe_gemm.cu's ops (which convert the operands and pick the kernel).
//
//   rows kernel, fwd: Out [R,N] = per expert e: rows [offsets[e], offsets[e+1]) of A [R,K]
//       times B_e [N,K]ᵀ, B_e = B + e·N·K, both K-major (k contiguous);
//     dinp: Out [R,N] += A_rows · B_e with B_e [K,N] (the same weights: N contiguous, read
//       MN-major — no transposed copy)
//   dW kernel: dW [E,M,N] += per expert Σ over its rows r of A[r,m]·B[r,n]; A [R,M], B [R,N]
//       are MN-major for the multiply (k = the rows is their slow index)
//   bf16 operands, fp32 accumulation, fp32 output.
//
// Design. A CTA computes 128 × WN tiles (WN 256, or 128 when experts are small) with two
// warpgroups of 64 rows, each issuing wgmma.mma_async m64nWNk16 on operands in shared
// memory. Operand tiles are 64-deep k slices in the 128-byte-swizzle layout wgmma reads
// (16-byte chunk c of a 128-byte row ρ at chunk c ^ (ρ & 7), 8-row atoms of 1024 bytes),
// copied straight from global memory with cp.async — no conversion or transpose pass in the
// kernel: K-major tiles have one 128-byte row per m (or n) row; MN-major tiles have one per
// k row and 64 m (or n) values, and the multiply reads them transposed (wgmma's tnsp bits).
// STAGES slices live in a ring; the copies run LEAD = STAGES − 2 slices ahead of the
// multiply, and one multiply stays in flight while the next slice is issued (so a slot is
// refilled two slices after its multiply was issued). The CTA is persistent and its
// pipeline runs across tile boundaries: the next tile's first slices are already in
// flight while the finished tile's accumulators are written out.
//
// Work lists (no host round trip): the rows kernel walks tile_start (moe_gemm.cu's
// device-built prefix sum of each expert's row tiles × column tiles; an expert's tiles run
// m-fastest so that concurrent CTAs share its weight slab in L2); the dW kernel walks
// (expert, m tile, n tile) in expert order, skipping experts without rows. dW sums an
// expert's rows in order inside one CTA: deterministic, no atomics.
#include "cuda_common.cuh"
#include "moe_gemm.cuh"
#include "wgmma_ops.cuh"
#include <stdint.h>
#include <stdlib.h>

#define WB_M 128
#define WB_K 64   // bf16 per k slice: one 128-byte swizzle row
#define WB_THREADS 256

// Tile configurations. WN columns per tile; STAGES k slices in the ring; OVERLAP: one
// multiply stays in flight while the next slice is issued (LEAD = STAGES − 2 slices of copies
// ahead), else each slice's multiply is waited for (LEAD = STAGES − 1) and a second CTA on the
// SM (CTAS = 2) fills the tensor cores meanwhile — and overlaps its multiply with this CTA's
// epilogue, which matters when tiles are short (few rows per expert in dW, K = 1024 in dinp).
template <int WN, int STAGES_, bool OVERLAP_, int CTAS_> struct WbCfg {
    static constexpr int A_BYTES = WB_M * WB_K * 2, B_BYTES = WN * WB_K * 2, STAGE = A_BYTES + B_BYTES;
    static constexpr int STAGES = STAGES_, CTAS = CTAS_;
    static constexpr bool OVERLAP = OVERLAP_;
    static constexpr int LEAD = OVERLAP ? STAGES - 2 : STAGES - 1;
    static constexpr int SMEM = STAGES * STAGE + 1024;   // + slack to align the ring to 1024 B
};
typedef WbCfg<256, 4, true, 1> WbBig;     // 192 KB ring, one CTA per SM
typedef WbCfg<128, 6, true, 1> WbNarrow;  // 192 KB ring, one CTA per SM
typedef WbCfg<128, 3, false, 2> WbPair;   // 96 KB ring, two CTAs per SM

// One output tile: operands at its origin, valid extents M × N, depth K
struct WbTile {
    const __nv_bfloat16 *A, *B;
    float *C;
    long lda, ldb, ldc;
    int M, N, K;
};
// fwd / dinp: the tile list of tile_start (tiles of WB_M rows × WN columns). B_e [N,K]
// K-major (fwd: W[e] itself), or MN-major (dinp: W[e] [K,N] read transposed)
template <int WN, bool B_KM> struct WbRowsSched {
    const __nv_bfloat16 *A, *B;
    float *Out;
    const int *offsets, *tile_start;
    int E, N, K;
    __device__ int total() const { return tile_start[E]; }
    __device__ bool get(int tile, WbTile &t) const {
        const GroupedTile g = grouped_tile(tile, offsets, tile_start, E, WB_M, WN);
        const int e = g.e, o0 = g.o0, rows = g.rows, m0 = g.m0, n0 = g.n0;
        t.A = A + (long)(o0 + m0) * K;
        t.B = B + (long)e * N * K + (B_KM ? (long)n0 * K : n0);
        t.C = Out + (long)(o0 + m0) * N + n0;
        t.lda = K;
        t.ldb = B_KM ? K : N;
        t.ldc = N;
        t.M = rows - m0;
        t.N = N - n0;
        t.K = K;
        return true;
    }
};
// dW: (expert, m tile, n tile), m fastest; experts without rows have no tiles — but when dW
// is written (assign) their tiles have depth 0: one zero-filled slice, a zero tile stored
template <int WN> struct WbDwSched {
    const __nv_bfloat16 *A, *B;
    float *dW;
    const int *offsets;
    int E, M, N, ntm, ntn, assign;
    __device__ int total() const { return E * ntm * ntn; }
    __device__ bool get(int tile, WbTile &t) const {
        const int e = tile / (ntm * ntn), local = tile % (ntm * ntn);
        const int o0 = offsets[e], rows = offsets[e + 1] - o0;
        if (rows <= 0 && !assign) return false;
        const int m0 = (local % ntm) * WB_M, n0 = (local / ntm) * WN;
        t.A = A + (long)o0 * M + m0;
        t.B = B + (long)o0 * N + n0;
        t.C = dW + (long)e * M * N + (long)m0 * N + n0;
        t.lda = M;
        t.ldb = N;
        t.ldc = N;
        t.M = M - m0;
        t.N = N - n0;
        t.K = rows > 0 ? rows : 0;
        return true;
    }
};

// The persistent GEMM. A_KM / B_KM: operand K-major (else MN-major); ACC: C += (else C =).
template <class Cfg, bool A_KM, bool B_KM, bool ACC, class Sched>
__global__ static void __launch_bounds__(WB_THREADS, Cfg::CTAS) wb_gemm_k(Sched sched) {
    constexpr int WN = Cfg::B_BYTES / (WB_K * 2);
    extern __shared__ uint8_t wb_raw[];
    const uint32_t ring = ((uint32_t)__cvta_generic_to_shared(wb_raw) + 1023u) & ~1023u;
    const int tid = threadIdx.x, wg = tid >> 7;
    const int total = sched.total();
    auto next_live = [&](int &t, WbTile &T) {
        while (t < total && !sched.get(t, T)) t += gridDim.x;
        return t < total;
    };
    // producer: the slice the copies are at (tile pt, slice pk, ring slot pslot)
    int pt = blockIdx.x, pk = 0, pslot = 0;
    WbTile P;
    bool plive = next_live(pt, P);
    auto produce = [&]() {
        if (plive) {
            const uint32_t s = ring + pslot * Cfg::STAGE;
            const int k0 = pk * WB_K;
            if constexpr (A_KM) wg_load_kmaj<WB_M, WB_THREADS>(s, P.A + k0, P.lda, P.M, P.K - k0, tid);
            else wg_load_mn<WB_M, WB_THREADS>(s, P.A + (long)k0 * P.lda, P.lda, P.M, P.K - k0, tid);
            if constexpr (B_KM) wg_load_kmaj<WN, WB_THREADS>(s + Cfg::A_BYTES, P.B + k0, P.ldb, P.N, P.K - k0, tid);
            else wg_load_mn<WN, WB_THREADS>(s + Cfg::A_BYTES, P.B + (long)k0 * P.ldb, P.ldb, P.N, P.K - k0, tid);
            if (++pk * WB_K >= P.K) {
                pk = 0;
                pt += gridDim.x;
                plive = next_live(pt, P);
            }
        }
        wg_cp_commit();   // empty groups keep the wait count uniform
        pslot = pslot + 1 == Cfg::STAGES ? 0 : pslot + 1;
    };
#pragma unroll
    for (int i = 0; i < Cfg::LEAD; i++) produce();

    // MN-major descriptors: LBO steps between 64-wide m (n) blocks, SBO between 8-row k groups
    constexpr int a_lbo = 1024, a_sbo = 2048, b_lbo = 1024, b_sbo = WN / 64 * 1024;
    int ct = blockIdx.x, ck = 0, cslot = 0;
    WbTile T;
    bool clive = next_live(ct, T);
    float acc[WN / 2];
    while (clive) {
        wg_cp_wait<Cfg::LEAD - 1>();   // this thread's copies of the slice have landed ...
        wg_fence_proxy();
        __syncthreads();            // ... everyone's; and the slot two slices back is free
        produce();
        const uint32_t s = ring + cslot * Cfg::STAGE, sb = s + Cfg::A_BYTES;
        wg_fence();
#pragma unroll
        for (int j = 0; j < WB_K / 16; j++) {
            const uint64_t da = A_KM ? wb_desc(s + wg * 64 * 128 + j * 32, 16, 1024)
                                     : wb_desc(s + wg * 1024 + 2 * j * 2048, a_lbo, a_sbo);
            const uint64_t db = B_KM ? wb_desc(sb + j * 32, 16, 1024)
                                     : wb_desc(sb + 2 * j * (WN / 64) * 1024, b_lbo, b_sbo);
            wg_ss<WN, A_KM ? 0 : 1, B_KM ? 0 : 1>(acc, da, db, ck > 0 || j > 0);
        }
        wg_commit();
        if constexpr (Cfg::OVERLAP) wg_wait<1>();
        else wg_wait<0>();
        cslot = cslot + 1 == Cfg::STAGES ? 0 : cslot + 1;
        if (++ck * WB_K < T.K) continue;
        wg_wait<0>();
        // With ACC the pairs are added by reductions in L2 (wg_store_acc). The old values used
        // to be loaded and stored (eight at a time for dW, one for dinp), and the epilogue
        // waited for those loads — bench_moe, H200, Kimi shapes: dW 177 → 211 TFLOP/s.
        wg_store_acc<WN, ACC>(acc, T.C, T.ldc, T.M, T.N, tid);
        ck = 0;
        ct += gridDim.x;
        clive = next_live(ct, T);
    }
    wg_cp_wait<0>();
}

template <typename K> static void wb_prepare(K kernel, int smem) {
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
}

// fwd: B K-major, Out =;  dinp: B MN-major, Out +=
template <class Cfg, bool DINP>
static void wb_rows(float *Out, const __nv_bfloat16 *A, const __nv_bfloat16 *B, const int *offsets,
                    const int *tile_start, int E, int N, int K) {
    constexpr int WN = Cfg::B_BYTES / (WB_K * 2);
    typedef WbRowsSched<WN, !DINP> S;
    static int ready = 0;
    if (!ready) { wb_prepare(wb_gemm_k<Cfg, true, !DINP, DINP, S>, Cfg::SMEM); ready = 1; }
    S s = {A, B, Out, offsets, tile_start, E, N, K};
    const int grid = Cfg::CTAS * lm_cuda_num_sms();
    wb_gemm_k<Cfg, true, !DINP, DINP, S><<<grid, WB_THREADS, Cfg::SMEM, lm_cuda_stream()>>>(s);
    cudaLaunchCheck();
}
template <class Cfg, bool ACC>
static void wb_dw(float *dW, const __nv_bfloat16 *A, const __nv_bfloat16 *B, const int *offsets, int E, int M, int N) {
    constexpr int WN = Cfg::B_BYTES / (WB_K * 2);
    typedef WbDwSched<WN> S;
    static int ready = 0;
    if (!ready) { wb_prepare(wb_gemm_k<Cfg, false, false, ACC, S>, Cfg::SMEM); ready = 1; }
    const int ntm = (M + WB_M - 1) / WB_M, ntn = (N + WN - 1) / WN;
    S s = {A, B, dW, offsets, E, M, N, ntm, ntn, !ACC};
    const long tiles = (long)E * ntm * ntn, slots = (long)Cfg::CTAS * lm_cuda_num_sms();
    LM_CHECK(tiles < (1L << 31), "grouped dW: %ld tiles", tiles);
    const int grid = (int)(tiles < slots ? tiles : slots);
    wb_gemm_k<Cfg, false, false, ACC, S><<<grid, WB_THREADS, Cfg::SMEM, lm_cuda_stream()>>>(s);
    cudaLaunchCheck();
}

int lm_wg_tile_cols(int cfg) { return cfg == LM_WG_BIG ? 256 : 128; }
void lm_wg_grouped_rows(float *Out, const __nv_bfloat16 *A, const __nv_bfloat16 *B, const int *offsets,
                        const int *tile_start, int E, int N, int K, int dinp, int cfg) {
    switch (cfg) {
    case LM_WG_BIG: dinp ? wb_rows<WbBig, true>(Out, A, B, offsets, tile_start, E, N, K)
                         : wb_rows<WbBig, false>(Out, A, B, offsets, tile_start, E, N, K); break;
    case LM_WG_NARROW: dinp ? wb_rows<WbNarrow, true>(Out, A, B, offsets, tile_start, E, N, K)
                            : wb_rows<WbNarrow, false>(Out, A, B, offsets, tile_start, E, N, K); break;
    default: dinp ? wb_rows<WbPair, true>(Out, A, B, offsets, tile_start, E, N, K)
                  : wb_rows<WbPair, false>(Out, A, B, offsets, tile_start, E, N, K); break;
    }
}
template <class Cfg>
static void wb_dw_mode(float *dW, const __nv_bfloat16 *A, const __nv_bfloat16 *B, const int *offsets, int E, int M,
                       int N, int assign) {
    if (assign) wb_dw<Cfg, false>(dW, A, B, offsets, E, M, N);
    else wb_dw<Cfg, true>(dW, A, B, offsets, E, M, N);
}
void lm_wg_grouped_dw(float *dW, const __nv_bfloat16 *A, const __nv_bfloat16 *B, const int *offsets, int E, int M,
                      int N, int cfg, int assign) {
    switch (cfg) {
    case LM_WG_BIG: wb_dw_mode<WbBig>(dW, A, B, offsets, E, M, N, assign); break;
    case LM_WG_NARROW: wb_dw_mode<WbNarrow>(dW, A, B, offsets, E, M, N, assign); break;
    default: wb_dw_mode<WbPair>(dW, A, B, offsets, E, M, N, assign); break;
    }
}
