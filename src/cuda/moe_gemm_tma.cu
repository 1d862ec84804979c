// moe_gemm_tma.cu — the grouped expert GEMMs (forward, input gradient, weight gradient) with
// TMA copies and a warp-specialized pipeline (sm_90a): auto takes the forward, the input
// gradients into zeroed work buffers and the weight gradients here (LM_MOE_GEMM=tma also the
// other input gradients):
//
//   fwd:  Out [R,N]  = per expert e: rows [offsets[e], offsets[e+1]) of A [R,K] · B_e [N,K]ᵀ
//   dinp: Out [R,N] (+)= Σ_p A_p rows · B_p,e with B_p,e [K_p,N] (the weights as stored, read
//         MN-major); p < 2 parts of the k range, so dxp = dea·W1 + deb·W3 is one product
//         written once (not two read-modify-write passes over fp32 dxp)
//   bf16 operands, fp32 accumulation and output.
//
// Why: the cp.async kernels of moe_gemm_wg.cu stall on a CTA-wide barrier per k slice (ncu:
// tensor pipes active ~50% in the forward). Here one producer thread issues TMA copies of
// whole tiles (the hardware applies the 128-byte swizzle) and per ring slot two mbarriers
// replace the barrier: `full` completes when the slot's bytes have landed, `empty` when both
// consumer warpgroups' multiplies of the slot are done. Warps 0–7 are two consumer
// warpgroups (64 rows each of a 128 × WN tile), warp 8 the producer; persistent CTAs over the
// tile list, and the producer runs up to STAGES slices ahead — across tiles, so the next
// tile's copies overlap this tile's epilogue. Two configurations: 128 × 256 tiles, one CTA per
// SM (BIG), and 128 × 128 tiles, two CTAs per SM (PAIR: one's read-modify-write epilogue
// overlaps the other's multiplies). BIG's epilogue leaves by bulk tensor stores (adding ones
// for Out +=) through shared memory (wt_store_tile), so the warpgroups are back at their
// multiplies while the TMA engine writes; session 41, H200, Kimi shapes, against the stores
// from registers (same binary): 3 forward GEMMs 478–486 → 506–517 TFLOP/s (bf16 out), input
// gradients 504–519 → 531–534, weight gradients written 350–366 → 390–398 (bench_moe).
//
// Ragged edges. Rows past an expert's end and columns past N are read from the neighbouring
// expert (or zero-filled past the tensor's end) and never stored. In fwd / dinp, k past K_p
// is zero-filled in A, so the neighbouring data it meets in B adds nothing — unless that
// data is Inf or NaN (0 · Inf is NaN): a non-finite weight of expert e+1 can then reach
// expert e's input gradient (only when K_p is not a multiple of 64; the cp.async kernels
// zero-fill both operands).
//
// The weight gradient (wt_dw_k): dW_e [M,N] (+)= Σ over expert e's rows r of A[r,m]·B[r,n],
// both operands MN-major (k = the rows, their slow index), read as 64 × 64 boxes; the same
// producer warp and consumer warpgroups. An expert's row range starts anywhere and its last
// slice runs into the next expert's rows: the consumers zero those rows of both tiles in
// shared memory (generic stores, a proxy fence and a barrier of the 256 consumer threads)
// before that slice's multiply. A first TMA version (session 12) had the producer warp
// write those zeros itself and ran at 55–83 TFLOP/s at Kimi shapes; it was removed then.
// Two weights that share B (dW1 and dW3, both · xp) go in one launch as two parts of the m
// range.
#include "cuda_common.cuh"
#include "moe_gemm.cuh"
#include "wgmma_ops.cuh"
#include "mbarrier.cuh"
#include "tma.cuh"
#include <stdlib.h>
#include <string.h>

#define WT_M 128
#define WT_K 64
#define WT_THREADS 288   // 2 consumer warpgroups + 1 producer warp
#define WT_A_BYTES (WT_M * WT_K * 2)

enum { WT_FWD, WT_DINP };

// EPI_BUFS: store buffers per consumer warpgroup for the epilogue's bulk tensor stores
// (wt_store_tile; 0: the accumulators go straight to global memory), a box each: 64 rows of 128 bytes
#define WT_EPI_BUF 8192
template <int WN_, int STAGES_, int CTAS_, int EPI_BUFS_> struct WtCfg {
    static constexpr int WN = WN_, STAGES = STAGES_, CTAS = CTAS_, EPI_BUFS = EPI_BUFS_, EPI = 2 * EPI_BUFS * WT_EPI_BUF;
    static constexpr int B_BYTES = WN * WT_K * 2, STAGE = WT_A_BYTES + B_BYTES;
    // ring (1024-aligned) + staging + full, empty barriers per slot
    static constexpr int SMEM = STAGES * STAGE + EPI + 1024 + 2 * STAGES * 8;
    static_assert(SMEM <= 232448, "a block's shared memory on sm_90");
};
// BIG: 192 KB ring + 32 KB of store buffers, one CTA per SM. (Session 41: a 144 KB ring of
// three slots and 80 KB of buffers — a bf16 tile's whole half per warpgroup — measured the same
// forward and a slower weight gradient, 375–391 against 397–398 TFLOP/s at Kimi shapes.)
typedef WtCfg<256, 4, 1, 2> WtBig;
typedef WtCfg<128, 3, 2, 0> WtPair;   // 96 KB ring, two CTAs per SM

// The tensor maps and the problem: parts p < 2 of the k range, slices [0, kt[0]) from a[0],
// b[0] and [kt[0], kt[0] + kt[1]) from a[1], b[1] (kt[1] = 0: one part).
struct WtArgs {
    CUtensorMap a[2], b[2];
    CUtensorMap out_map;   // out as [R, N] in 128-byte boxes of 64 rows (where out_tma)
    void *out;             // float, or bf16 (OBF)
    const int *offsets, *tile_start;
    int E, N, kt[2], kdepth[2];   // kdepth: K_p (dinp: the rows of W_e in map b[p])
    int out_tma;                  // whole 64-row halves of a tile leave by bulk tensor stores
};

// One output tile: expert e, its rows from o0, the tile at (m0, n0) of the output, KT k
// slices, c0 its output origin (an element index), M × N valid
struct WtTile {
    int e, o0, m0, n0, KT, M, N;
    long c0;
};
template <int WN> __device__ __forceinline__ WtTile wt_tile(const WtArgs &a, int tile) {
    const GroupedTile g = grouped_tile(tile, a.offsets, a.tile_start, a.E, WT_M, WN);
    WtTile t;
    t.e = g.e;
    t.o0 = g.o0;
    t.m0 = g.m0;
    t.n0 = g.n0;
    t.KT = a.kt[0] + a.kt[1];
    t.c0 = (long)(g.o0 + g.m0) * a.N + g.n0;
    t.M = g.rows - g.m0;
    t.N = a.N - g.n0;
    return t;
}

// The ring both kernels share: STAGES slots of STAGE bytes (1024-aligned) and per slot a
// `full` mbarrier (the producer's arrival + the slot's bytes) and an `empty` one (one arrival
// per consumer warpgroup). A side's position in it: slot and phase.
template <class Cfg> struct WtRing {
    uint32_t base, full0, empty0;
    int slot = 0, phase = 0;
    // every thread of the CTA (thread 0 initialises the barriers; a __syncthreads follows)
    __device__ explicit WtRing(uint8_t *raw) {
        base = ((uint32_t)__cvta_generic_to_shared(raw) + 1023u) & ~1023u;
        full0 = base + Cfg::STAGES * Cfg::STAGE + Cfg::EPI;
        empty0 = full0 + Cfg::STAGES * 8;
        if (threadIdx.x == 0) {
            for (int s = 0; s < Cfg::STAGES; s++) {
                mb_init(full0 + 8 * s, 1);
                mb_init(empty0 + 8 * s, 2);
            }
            mb_init_fence();
        }
        __syncthreads();
    }
    __device__ uint32_t at() const { return base + slot * Cfg::STAGE; }
    // consumer warpgroup wg's store buffers (Cfg::EPI > 0)
    __device__ uint32_t epi(int wg) const { return base + Cfg::STAGES * Cfg::STAGE + wg * (Cfg::EPI / 2); }
    __device__ uint32_t full() const { return full0 + 8 * slot; }
    __device__ void advance() {
        if (++slot == Cfg::STAGES) { slot = 0; phase ^= 1; }
    }
    // producer: wait until the consumers freed the slot, then expect its bytes
    __device__ void produce_begin() const {
        mb_wait(empty0 + 8 * slot, phase ^ 1);
        mb_expect_tx(full(), Cfg::STAGE);
    }
    // consumer: wait for the slot's bytes
    __device__ void consume_begin() const { mb_wait(full(), phase); }
    // consumer, after issuing a slice's multiplies: commit them, wait for the previous slice's
    // (its slot can then be refilled: the leader frees it), move on
    __device__ void consume_end(int &prev, bool leader) {
        wg_commit();
        wg_wait<1>();
        if (prev >= 0 && leader) mb_arrive(empty0 + 8 * prev);
        prev = slot;
        advance();
    }
    // consumer, after a tile's last slice: its multiplies done, its slot freed
    __device__ void tile_end(int prev, bool leader) const {
        wg_wait<0>();
        if (prev >= 0 && leader) mb_arrive(empty0 + 8 * prev);
    }
};

// The epilogue by bulk tensor stores, for a consumer warpgroup whose 64 rows of the tile all
// belong to it (the others store from registers: the rows past an expert's end are the next
// expert's, which a box would overwrite). Its 64 × WN accumulators leave a box of 128-byte
// rows at a time (32 fp32 or 64 bf16 columns) through two 8 KB buffers at stage, in the
// 128-byte swizzle (a warp's stores then take two wavefronts per 256 bytes); the
// warpgroup's thread 0 issues each box's store — an adding one with ADD — and the
// warpgroup fills the other buffer meanwhile. Why: stored from registers, a 128 × 256 fp32
// tile is 1,024 warp stores of eight 32-byte pieces in eight rows, during which neither
// warpgroup multiplies (ncu, session 38: tensor pipes 79% busy at k = 2304, 65% at 1024).
// map: the output, (c0, r0) the warpgroup's first column and row there, N the valid columns
// from c0; nstored counts the boxes this warpgroup has stored (the buffer parity).
template <int WN, int NB, bool ADD, bool OBF>
__device__ __forceinline__ void wt_store_tile(const float (&acc)[WN / 2], uint32_t stage, int &nstored,
                                              const CUtensorMap *map, int c0, int r0, int N, int tid) {
    static_assert(!(ADD && OBF), "bf16 outputs are written");
    constexpr int CW = OBF ? 64 : 32;   // columns per box
    const int wg = tid >> 7, w = (tid & 127) >> 5, l = tid & 31;
    const bool issuer = (tid & 127) == 0;
#pragma unroll
    for (int p = 0; p < WN / CW; p++) {
        if (CW * p >= N) break;
        const uint32_t buf = stage + (nstored % NB) * WT_EPI_BUF;
        if (issuer) tma_store_wait_read<NB - 1>();   // the box stored from buf before has been read
        // named barrier 2 + wg: the warpgroup's 128 threads (0 is __syncthreads, 1 wt_dw_k's 256 consumers)
        asm volatile("bar.sync %0, 128;\n" ::"r"(2 + wg) : "memory");
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            // register 4i + 2hf (+1) holds row m, columns 8i + 2(l % 4) (+1)
            const int m = w * 16 + (l >> 2) + 8 * hf;
            const uint32_t row = buf + m * 128;
#pragma unroll
            for (int j = 0; j < CW / 8; j++) {
                const int r = 4 * (CW / 8 * p + j) + 2 * hf;
                if constexpr (OBF) {   // 16-byte chunk j of the row, 4 bytes a lane
                    const __nv_bfloat162 v = __floats2bfloat162_rn(acc[r], acc[r + 1]);
                    const uint32_t a = row + ((j ^ (m & 7)) << 4) + 4 * (l & 3);
                    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(a), "r"(*reinterpret_cast<const uint32_t *>(&v))
                                 : "memory");
                } else {   // chunk 2j + (l % 4)/2, 8 bytes a lane
                    const uint32_t a = row + (((2 * j + ((l >> 1) & 1)) ^ (m & 7)) << 4) + 8 * (l & 1);
                    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(a), "f"(acc[r]), "f"(acc[r + 1])
                                 : "memory");
                }
            }
        }
        wg_fence_proxy();   // the buffer's generic writes before the copy engine reads it
        asm volatile("bar.sync %0, 128;\n" ::"r"(2 + wg) : "memory");
        if (issuer) {
            if constexpr (ADD) tma_add_2d(map, buf, c0 + CW * p, r0);
            else tma_store_2d(map, buf, c0 + CW * p, r0);
            tma_store_commit();
        }
        nstored++;
    }
}

// MODE as above; ACC: Out += (else Out =); OBF: Out is bf16, written (not with ACC)
template <class Cfg, int MODE, bool ACC, bool OBF>
__global__ static void __launch_bounds__(WT_THREADS, Cfg::CTAS) wt_gemm_k(const __grid_constant__ WtArgs args) {
    static_assert(!(ACC && OBF), "a bf16 output is written, not added into");
    constexpr int WN = Cfg::WN;
    extern __shared__ uint8_t wt_raw[];
    WtRing<Cfg> ring(wt_raw);
    const int tid = threadIdx.x, warp = tid >> 5;
    const int total = args.tile_start[args.E];

    if (warp == 8) {   // producer
        if ((tid & 31) != 0) return;
        for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
            const WtTile t = wt_tile<WN>(args, tile);
            for (int kt = 0; kt < t.KT; kt++) {
                ring.produce_begin();
                const uint32_t sa = ring.at(), sb = sa + WT_A_BYTES, full = ring.full();
                const int p = kt >= args.kt[0], k0 = (kt - (p ? args.kt[0] : 0)) * WT_K;
                tma_2d(sa, &args.a[p], k0, t.o0 + t.m0, full);
                if (MODE == WT_DINP) {   // WN/64 blocks of 64 n × 64 k rows (8 KB each)
#pragma unroll
                    for (int nb = 0; nb < WN / 64; nb++)
                        tma_2d(sb + nb * 8192, &args.b[p], t.n0 + 64 * nb, t.e * args.kdepth[p] + k0, full);
                } else {
                    tma_2d(sb, &args.b[p], k0, t.e * args.N + t.n0, full);
                }
                ring.advance();
            }
        }
        return;
    }

    // consumers: warpgroup wg multiplies rows 64·wg .. 64·wg+63 of each tile
    const int wg = warp >> 2;
    const bool leader = (tid & 127) == 0;
    float acc[WN / 2];
    int nstored = 0;
    for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
        const WtTile t = wt_tile<WN>(args, tile);
        int prev = -1;
        for (int kt = 0; kt < t.KT; kt++) {
            ring.consume_begin();
            const uint32_t sa = ring.at(), sb = sa + WT_A_BYTES;
            wg_fence();
#pragma unroll
            for (int j = 0; j < WT_K / 16; j++) {
                // A K-major: 128-byte rows. B K-major (fwd) likewise; MN-major (dinp): 64-n
                // blocks 8 KB apart, SBO between 8-row k groups, a k16 step is two of them.
                const uint64_t da = wb_desc(sa + wg * 64 * 128 + j * 32, 16, 1024);
                const uint64_t db = MODE == WT_FWD ? wb_desc(sb + j * 32, 16, 1024) : wb_desc(sb + 2 * j * 1024, 8192, 1024);
                wg_ss<WN, 0, MODE == WT_FWD ? 0 : 1>(acc, da, db, kt > 0 || j > 0);
            }
            ring.consume_end(prev, leader);
        }
        ring.tile_end(prev, leader);
        bool bulk = false;
        if constexpr (Cfg::EPI > 0) {
            bulk = args.out_tma && t.M >= 64 * (wg + 1);
            if (bulk)
                wt_store_tile<WN, Cfg::EPI_BUFS, ACC, OBF>(acc, ring.epi(wg), nstored, &args.out_map, t.n0,
                                                           t.o0 + t.m0 + 64 * wg, t.N, tid);
        }
        if (!bulk) {
            if constexpr (OBF) wg_store_bf16<WN>(acc, (__nv_bfloat16 *)args.out + t.c0, args.N, t.M, t.N, tid);
            else wg_store_acc<WN, ACC>(acc, (float *)args.out + t.c0, args.N, t.M, t.N, tid);   // ACC: reductions in L2
        }
    }
    if (Cfg::EPI > 0 && leader) tma_store_wait_all();   // the stores done (their staging read) before the CTA exits
}

// ---- the weight gradient ----
// parts p < 2 of the m range (M_p rows each, ntm_p tiles of 128): dW_p [E, M_p, N] from A_p
// [R, M_p]; B [R, N] shared. Tile order: expert, then n tile, then (part, m tile) fastest, so
// the CTAs of one expert's tiles run together and share its rows in L2.
struct WtDwArgs {
    CUtensorMap a[2], b;
    CUtensorMap dw_map[2];   // dW_p as [E·M_p, N] in 128-byte boxes of 64 rows (where out_tma)
    float *dW[2];
    const int *offsets;
    int E, N, M[2], ntm[2], ntn;
    int out_tma;
};
struct WtDwTile {
    int e, p, o0, rows, m0, n0;
};
template <int WN> __device__ __forceinline__ WtDwTile wt_dw_tile(const WtDwArgs &a, int tile) {
    const int ntm = a.ntm[0] + a.ntm[1], per = ntm * a.ntn;
    WtDwTile t;
    t.e = tile / per;
    const int local = tile - t.e * per, mt = local % ntm;
    t.p = mt >= a.ntm[0];
    t.m0 = (mt - (t.p ? a.ntm[0] : 0)) * WT_M;
    t.o0 = a.offsets[t.e];
    t.rows = a.offsets[t.e + 1] - t.o0;
    t.n0 = (local / ntm) * WN;
    return t;
}

// ACC: dW += (else dW =, zeros for experts without rows)
template <class Cfg, bool ACC>
__global__ static void __launch_bounds__(WT_THREADS, Cfg::CTAS) wt_dw_k(const __grid_constant__ WtDwArgs args) {
    constexpr int WN = Cfg::WN;
    extern __shared__ uint8_t wt_raw[];
    WtRing<Cfg> ring(wt_raw);
    const int tid = threadIdx.x, warp = tid >> 5;
    const int total = args.E * (args.ntm[0] + args.ntm[1]) * args.ntn;

    if (warp == 8) {   // producer
        if ((tid & 31) != 0) return;
        for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
            const WtDwTile t = wt_dw_tile<WN>(args, tile);
            const int KT = (t.rows + WT_K - 1) / WT_K, n0 = t.n0;
            for (int kt = 0; kt < KT; kt++) {
                ring.produce_begin();
                const uint32_t sa = ring.at(), sb = sa + WT_A_BYTES, full = ring.full();
                const int r0 = t.o0 + kt * WT_K;
                tma_2d(sa, &args.a[t.p], t.m0, r0, full);
                tma_2d(sa + 8192, &args.a[t.p], t.m0 + 64, r0, full);
#pragma unroll
                for (int nb = 0; nb < WN / 64; nb++) tma_2d(sb + nb * 8192, &args.b, n0 + 64 * nb, r0, full);
                ring.advance();
            }
        }
        return;
    }

    const int wg = warp >> 2;
    const bool leader = (tid & 127) == 0;
    float acc[WN / 2];
    int nstored = 0;
    for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
        const WtDwTile t = wt_dw_tile<WN>(args, tile);
        const int KT = (t.rows + WT_K - 1) / WT_K, n0 = t.n0;
        if (KT == 0) {   // an expert without rows: nothing to add, or a zero tile to write
            if constexpr (ACC) {
                continue;
            } else {
#pragma unroll
                for (int i = 0; i < WN / 2; i++) acc[i] = 0.f;
            }
        }
        int prev = -1;
        for (int kt = 0; kt < KT; kt++) {
            ring.consume_begin();
            const uint32_t sa = ring.at(), sb = sa + WT_A_BYTES;
            const int valid = t.rows - kt * WT_K;
            if (valid < WT_K) {   // the next expert's rows (or zeros past the tensor): zero them in both tiles
                constexpr int BLOCKS = 2 + WN / 64;   // 64-wide blocks of 64 k rows, 8 KB each
                const int nz = (WT_K - valid) * BLOCKS * 8;   // 16-byte pieces
                for (int i = tid; i < nz; i += 256) {
                    const int c = i & 7, rb = i >> 3, blk = rb % BLOCKS, r = valid + rb / BLOCKS;
                    const uint32_t addr = sa + blk * 8192 + r * 128 + c * 16;
                    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(addr), "r"(0) : "memory");
                }
                wg_fence_proxy();
                asm volatile("bar.sync 1, 256;\n" ::: "memory");
            }
            wg_fence();
#pragma unroll
            for (int j = 0; j < WT_K / 16; j++) {
                // MN-major: 64-wide blocks 8 KB apart (LBO), 8-row k groups 1 KB apart (SBO)
                const uint64_t da = wb_desc(sa + wg * 8192 + 2 * j * 1024, 8192, 1024);
                const uint64_t db = wb_desc(sb + 2 * j * 1024, 8192, 1024);
                wg_ss<WN, 1, 1>(acc, da, db, kt > 0 || j > 0);
            }
            ring.consume_end(prev, leader);
        }
        ring.tile_end(prev, leader);
        const int M = args.M[t.p];
        bool bulk = false;
        if constexpr (Cfg::EPI > 0) {
            bulk = args.out_tma && t.m0 + 64 * (wg + 1) <= M;
            if (bulk)
                wt_store_tile<WN, Cfg::EPI_BUFS, ACC, false>(acc, ring.epi(wg), nstored, &args.dw_map[t.p], n0,
                                                             t.e * M + t.m0 + 64 * wg, args.N - n0, tid);
        }
        if (!bulk)
            wg_store_acc<WN, ACC>(acc, args.dW[t.p] + ((long)t.e * M + t.m0) * args.N + n0, args.N, M - t.m0,
                                  args.N - n0, tid);
    }
    if (Cfg::EPI > 0 && leader) tma_store_wait_all();
}

// ---- host ----
// bf16 matrix [outer, inner] (row stride inner), boxes of box_outer × box_inner
static CUtensorMap wt_map(const __nv_bfloat16 *base, long inner, long outer, int box_inner, int box_outer) {
    const long dims[2] = {inner, outer}, strides[1] = {inner * 2};
    return lm_tma_map_bf16(base, 2, dims, strides, box_inner, box_outer);
}

// LM_MOE_TMA_STORE=0 (benchmarks) or lm_cuda_set_moe_tma_stores(0) (tests): the 128 × 256
// kernels' epilogues store from registers
static int wt_stores_mode = -1;
int lm_cuda_moe_tma_stores(void) {
    if (wt_stores_mode < 0) {
        const char *s = getenv("LM_MOE_TMA_STORE");
        wt_stores_mode = !(s && !strcmp(s, "0"));
    }
    return wt_stores_mode;
}
void lm_cuda_set_moe_tma_stores(int on) { wt_stores_mode = on ? 1 : 0; }
// the output [rows, N] (elem 2: bf16, 4: fp32) as a map for wt_store_tile, if the stores can
// take it (a 16-byte aligned base and row stride); *ok says whether they can
static CUtensorMap wt_out_map(const void *out, int elem, long N, long rows, int *ok) {
    CUtensorMap m;
    memset(&m, 0, sizeof m);
    *ok = lm_cuda_moe_tma_stores() && ((uintptr_t)out & 15) == 0 && (N * elem) % 16 == 0;
    if (*ok) {
        const long dims[2] = {N, rows}, strides[1] = {N * elem};
        m = elem == 2 ? lm_tma_map_bf16(out, 2, dims, strides, 64, 64) : lm_tma_map_f32(out, 2, dims, strides, 32, 64);
    }
    return m;
}

template <class Cfg, int MODE, bool ACC, bool OBF> static void wt_launch(const WtArgs &a) {
    static int ready = 0;
    if (!ready) {
        cudaCheck(cudaFuncSetAttribute(wt_gemm_k<Cfg, MODE, ACC, OBF>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       Cfg::SMEM));
        ready = 1;
    }
    wt_gemm_k<Cfg, MODE, ACC, OBF><<<Cfg::CTAS * lm_cuda_num_sms(), WT_THREADS, Cfg::SMEM, lm_cuda_stream()>>>(a);
    cudaLaunchCheck();
}
// the instance for (dinp, acc, obf) at tile configuration Cfg
template <class Cfg> static void wt_pick(const WtArgs &a, int dinp, int acc, int obf) {
    if (!dinp) obf ? wt_launch<Cfg, WT_FWD, false, true>(a) : wt_launch<Cfg, WT_FWD, false, false>(a);
    else if (acc) wt_launch<Cfg, WT_DINP, true, false>(a);
    else obf ? wt_launch<Cfg, WT_DINP, false, true>(a) : wt_launch<Cfg, WT_DINP, false, false>(a);
}

// LM_MOE_TMA_TILE=256|128 (benchmarks): 128 × 256 tiles, one CTA per SM (the default), or
// 128 × 128, two CTAs per SM
int lm_wt_tile_cols(void) {
    static int v = 0;
    if (!v) {
        const char *s = getenv("LM_MOE_TMA_TILE");
        v = s && *s ? atoi(s) : 256;
        if (v != 128 && v != 256) lm_die("LM_MOE_TMA_TILE='%s' is not 128 or 256", s);
    }
    return v;
}

void lm_wt_grouped_rows(void *Out, const __nv_bfloat16 *A, const __nv_bfloat16 *B, const __nv_bfloat16 *A2,
                        const __nv_bfloat16 *B2, const int *offsets, const int *tile_start, int E, int R, int N, int K,
                        int K2, int dinp, int acc, int out_bf16) {
    LM_CHECK(K > 0 && N > 0 && R > 0 && K2 >= 0, "grouped GEMM (TMA): empty operand (R %d, N %d, K %d)", R, N, K);
    LM_CHECK(dinp || K2 == 0, "grouped GEMM (TMA): a second k part is for the input gradient only");
    LM_CHECK(!(acc && out_bf16), "grouped GEMM (TMA): a bf16 output is written, not added into");
    const int wn = lm_wt_tile_cols();
    WtArgs a;
    memset(&a, 0, sizeof a);
    const int np = K2 > 0 ? 2 : 1;
    const __nv_bfloat16 *As[2] = {A, A2}, *Bs[2] = {B, B2};
    const int Ks[2] = {K, K2};
    for (int p = 0; p < np; p++) {
        a.a[p] = wt_map(As[p], Ks[p], R, WT_K, WT_M);
        // B: dinp, W as [E·K_p rows, N] in 64 × 64 boxes (n blocks); fwd, W as [E·N rows, K]
        a.b[p] = dinp ? wt_map(Bs[p], N, (long)E * Ks[p], 64, WT_K) : wt_map(Bs[p], K, (long)E * N, WT_K, wn);
        a.kt[p] = (Ks[p] + WT_K - 1) / WT_K;
        a.kdepth[p] = Ks[p];
    }
    a.out = Out;
    a.offsets = offsets;
    a.tile_start = tile_start;
    a.E = E;
    a.N = N;
    if (wn == 256) {
        a.out_map = wt_out_map(Out, out_bf16 ? 2 : 4, N, R, &a.out_tma);
        wt_pick<WtBig>(a, dinp, acc, out_bf16);
    } else {
        wt_pick<WtPair>(a, dinp, acc, out_bf16);
    }
}


template <class Cfg, bool ACC> static void wt_dw_launch(const WtDwArgs &a, long tiles) {
    static int ready = 0;
    if (!ready) {
        cudaCheck(cudaFuncSetAttribute(wt_dw_k<Cfg, ACC>, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::SMEM));
        ready = 1;
    }
    const long slots = (long)Cfg::CTAS * lm_cuda_num_sms();
    wt_dw_k<Cfg, ACC><<<(int)(tiles < slots ? tiles : slots), WT_THREADS, Cfg::SMEM, lm_cuda_stream()>>>(a);
    cudaLaunchCheck();
}

// LM_MOE_DW_TILE=256|128 (benchmarks): the weight gradient's tiles, 128 × 256 one CTA per SM
// (the default) or 128 × 128 two per SM. bench_moe, H200, the experts op's three dW products
// (written / added): Kimi shapes 4.95 / 7.52 ms with 256 against 5.70 / 8.66 with 128; the
// `small` preset at 16K tokens 0.222 / 0.295 against 0.234 / 0.297
static int wt_dw_tile_cols(void) {
    static int v = 0;
    if (!v) {
        const char *s = getenv("LM_MOE_DW_TILE");
        v = s && *s ? atoi(s) : 256;
        if (v != 128 && v != 256) lm_die("LM_MOE_DW_TILE='%s' is not 128 or 256", s);
    }
    return v;
}

void lm_wt_grouped_dw(float *dW, float *dW2, const __nv_bfloat16 *A, const __nv_bfloat16 *A2, const __nv_bfloat16 *B,
                      const int *offsets, int E, int R, int M, int N, int assign) {
    LM_CHECK(E > 0 && R > 0 && M > 0 && N > 0, "grouped dW (TMA): empty operand (E %d, R %d, M %d, N %d)", E, R, M, N);
    const int wn = wt_dw_tile_cols(), np = dW2 ? 2 : 1;
    WtDwArgs a;
    memset(&a, 0, sizeof a);
    float *dWs[2] = {dW, dW2};
    const __nv_bfloat16 *As[2] = {A, A2};
    for (int p = 0; p < np; p++) {
        a.a[p] = wt_map(As[p], M, R, 64, WT_K);
        a.dW[p] = dWs[p];
        a.M[p] = M;
        a.ntm[p] = (M + WT_M - 1) / WT_M;
    }
    a.b = wt_map(B, N, R, 64, WT_K);
    if (wn == 256) {
        a.out_tma = 1;
        for (int p = 0; p < np; p++) {
            int ok;
            a.dw_map[p] = wt_out_map(dWs[p], 4, N, (long)E * M, &ok);
            a.out_tma &= ok;
        }
    }
    a.offsets = offsets;
    a.E = E;
    a.N = N;
    a.ntn = (N + wn - 1) / wn;
    const long tiles = (long)E * (a.ntm[0] + a.ntm[1]) * a.ntn;
    LM_CHECK(tiles < (1L << 31), "grouped dW (TMA): %ld tiles", tiles);
    if (wn == 256) assign ? wt_dw_launch<WtBig, false>(a, tiles) : wt_dw_launch<WtBig, true>(a, tiles);
    else assign ? wt_dw_launch<WtPair, false>(a, tiles) : wt_dw_launch<WtPair, true>(a, tiles);
}
