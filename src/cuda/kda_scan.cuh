// kda_scan.cuh — the per-warp steps of the serial chunk recurrences, shared by the forward
// scan (kda_fwd.cu), the backward state-gradient scan and the backward segment kernel
// (kda_bwd.cu), so that the backward's recomputed intermediates follow the forward's
// arithmetic — bit for bit when the forward scan runs one warp per value slice (KS = 1). With
// the state's columns split over KS > 1 warps (the default under 512 value slices), the
// forward adds V''s partial sums in another order than the segment kernel's recomputation,
// so the recomputed states differ from the forward's by fp32 rounding.
//
// A warp owns 16 value rows of the transposed state Sᵀ [V,K] (fp32, K/8 C fragments:
// s[nt] = rows v0+g, v0+g+8, columns 8nt+2t, 8nt+2t+1). Per 16-token chunk, with the
// chunk's W, Qg [16][K], KrT [K][16], U [16][·], M [16][16] (bf16) and gl [K] (fp32) in
// shared memory:
//   V'ᵀ = Uᵀ − Sᵀ Wᵀ                (scan_vprime)
//   Oᵀ  = Sᵀ Qgᵀ + V'ᵀ Mᵀ             (scan_out; M as bf16 hi + lo)
//   Sᵀ ← Sᵀ Diag(gl) + V'ᵀ Kr          (scan_update)
// and backwards, with dSᵀ in the same fragments and dO [16][·] in shared memory:
//   dV'ᵀ = dOᵀ M + dSᵀ Krᵀ             (rscan_dvp)
//   dSᵀ ← dSᵀ Diag(gl) + dOᵀ Qg − dV'ᵀ W (rscan_update)
// SPLIT: the fp32 state enters the products as bf16 hi + lo (two products), ~16 mantissa
// bits instead of 8, for the products whose result is a small difference (V' = U − W S).
// Tiles come from shared memory by ldmatrix (two 8-wide n-tiles or one A fragment per
// instruction; .trans for the [k][n] tiles), so every tile and row stride is 16-byte aligned.
#ifndef LM_CUDA_KDA_SCAN_CUH
#define LM_CUDA_KDA_SCAN_CUH
#include "kda_common.cuh"
#include "mbarrier.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

#define KDA_LDK(K) ((K) + 8)   // row stride (elements) of [16][K] bf16 tiles
#define KDA_LD16 24            // row stride of [·][16] bf16 tiles
// M (per chunk, [16][16]) is kept as bf16 hi then lo; in shared memory as two [16][KDA_LD16]
// tiles. 16-byte piece i < 64 of the pair: tile i/32, row (i%32)/2, half i%2.
#define KDA_MTILE_OFF(i) (((i) >> 5) * 16 * KDA_LD16 + (((i) & 31) >> 1) * KDA_LD16 + ((i) & 1) * 8)
#define KDA_MSRC_OFF(i) (((i) >> 5) * 256 + (((i) & 31) >> 1) * 16 + ((i) & 1) * 8)
#define KDA_MTILE(sM, i) ((sM) + KDA_MTILE_OFF(i))
#define KDA_MSRC(gM, i) ((gM) + KDA_MSRC_OFF(i))

// Shared-memory layout of one pipeline stage of the forward scan and of the backward
// state-gradient scan (byte offsets): W, Qg [16][K+8], KrT [K][KDA_LD16], a 16-row slice of
// VB value columns (U forward, dO backward), M as bf16 hi + lo, gl [K] fp32.
struct ScanStage {
    int oW, oQg, oKrT, oVal, oM, ogl, bytes;
};
__host__ __device__ inline ScanStage scan_stage(int K, int VB) {
    ScanStage s;
    int off = 0;
    s.oW = off; off += 16 * (K + 8) * 2;
    s.oQg = off; off += 16 * (K + 8) * 2;
    s.oKrT = off; off += K * KDA_LD16 * 2;
    s.oVal = off; off += 16 * (VB + 8) * 2;
    s.oM = off; off += 2 * 16 * KDA_LD16 * 2;
    s.ogl = off; off += K * 4;
    s.bytes = (off + 127) & ~127;
    return s;
}

// A chunk's copies into a ScanStage: the 16-byte pieces of W, Qg, KrT (2K each; piece i of W,
// Qg is row i/(K/8), 8 columns from 8·(i%(K/8)), piece i of KrT row i/2, half i%2, and every
// tile is i·8 elements into the chunk), the value slice's 2·VB pieces (U forward, dO backward;
// at most one a thread), and M's 64 and gl's K/4 pieces. A thread takes pieces tid, tid + nthr,
// ...; the addresses are shifts and adds of i and the stage's shared address (ncu, session 21,
// forward scan at B1·T8192·H96: the copies' index arithmetic — divisions by the run-time slice
// width and stage count, 64-bit products — drew ~30% of the kernel's stall samples). The value
// piece's row and column (a division by the slice width) are worked out once per kernel.
struct ValuePiece {
    int row;        // −1: this thread has none
    int col;        // its first column in the slice
    uint32_t soff;  // its byte offset in a stage
};
__device__ __forceinline__ ValuePiece value_piece(const ScanStage &L, int VB) {
    ValuePiece v;
    const int tid = threadIdx.x;
    v.row = tid < 2 * VB ? tid / (VB / 8) : -1;
    v.col = (tid % (VB / 8)) * 8;
    v.soff = L.oVal + 2 * (v.row * (VB + 8) + v.col);
    return v;
}

// a chunk's copies into the stage at shared address st (layout L): the [16][K] tiles at gW,
// gQ (NULL: not copied), gK, M at gM, gl at ggl, and the value piece vp from gv (this thread's
// piece already; NULL: none) with vbytes of it (0: zeros)
template <int K>
__device__ __forceinline__ void copy_chunk(const ScanStage &L, uint32_t st, const bf16 *gW, const bf16 *gQ,
                                           const bf16 *gK, const bf16 *gM, const float *ggl, const ValuePiece &vp,
                                           const bf16 *gv, int vbytes) {
    const int tid = threadIdx.x, nthr = blockDim.x;
    for (int i = tid; i < 2 * K; i += nthr) {
        const uint32_t sw = st + L.oW + 16 * i + 16 * (i / (K / 8));   // row i/(K/8) of K + 8
        cp_async16_s(sw, gW + 8 * i);
        if (gQ) cp_async16_s(sw + (L.oQg - L.oW), gQ + 8 * i);
        cp_async16_s(st + L.oKrT + 2 * ((i >> 1) * KDA_LD16 + (i & 1) * 8), gK + 8 * i);
    }
    if (gv) cp_async16_s(st + vp.soff, gv, vbytes);
    for (int i = tid; i < 64 + K / 4; i += nthr) {
        if (i < 64) cp_async16_s(st + L.oM + 2 * KDA_MTILE_OFF(i), gM + KDA_MSRC_OFF(i));
        else cp_async16_s(st + L.ogl + 16 * (i - 64), ggl + 4 * (i - 64));
    }
}

// the chunk where segment sg of a two-level scan starts (relative to its sequence): segment 0
// has seg0c chunks, the others segc (seg0c > segc under the forward-only schedule, kda_fwd.cu)
__host__ __device__ inline int seg_start(int sg, int segc, int seg0c) { return sg == 0 ? 0 : seg0c + (sg - 1) * segc; }

// The warpgroup (wgmma) scan step's stage (one chunk, KS = 1), filled by bulk tensor copies
// (TMA) in the swizzled layouts the wgmma descriptors read (every region 1024-byte aligned):
//   [W; Qg]  K-major, 128-byte swizzle (wgmma.cuh): per 64 k a 4096-byte block of 32 rows,
//            W's 16 tokens then Qg's (oQg = oW + 2048); a k16 step j starts at
//            (j/4)·4096 + (j%4)·32;
//   KrT      K rows (channels) × 16 tokens, 32-byte swizzle (8-row atoms of 256 bytes);
//   M        hi then lo, 16 rows × 16 each, 32-byte swizzle (lo 512 bytes after hi);
//   value    the slice of U as VB/64 blocks of 16 rows × 64 values, 128-byte swizzle;
//   gl [K] fp32.
__host__ __device__ inline ScanStage scan_stage_wg(int K, int VB) {
    ScanStage s;
    int off = 0;
    s.oW = off; s.oQg = off + 2048; off += (K / 64) * 4096;
    s.oKrT = off; off += ((32 * K + 1023) & ~1023);
    s.oM = off; off += 1024;
    s.oVal = off; off += (VB / 64) * 2048;
    s.ogl = off; off += K * 4;
    s.bytes = (off + 1023) & ~1023;
    return s;
}
// bytes one chunk's copies bring into a scan_stage_wg stage: all of it, or without Qg and M
// (out = false: a pass without output) and without the value tile (val = false: U = 0)
__host__ __device__ inline int scan_stage_wg_tx(int K, int VB, bool out = true, bool val = true) {
    return (K / 64) * (out ? 4096 : 2048) + 32 * K + (out ? 1024 : 0) + (val ? (VB / 64) * 2048 : 0) + 4 * K;
}
// The tensor maps of those copies (kda_chunk_maps): W, Qg as [H·NC·16][K], KrT as
// [H·NC·K][16], M as [H·NC·32][16] (hi rows, then lo), gl as [H·NC][2K] (its fp32 bytes as
// bf16 pairs: a tensor copy, not a plain bulk one, whose completion compute-sanitizer's
// racecheck does not follow), and the value tile's source: U as [H·NC·16][V] (the forward),
// or dO as [tokens][H][V] (the state-gradient scan)
struct ChunkMaps {
    CUtensorMap W, Qg, KrT, M, gl, val;
};
// val = false: no value-tile map (the transitions, U = 0, whose p has V = K)
cudaError_t kda_chunk_maps(ChunkMaps *m, const kda_params *p, const KWs &w, bool dO, bool val = true);
// chunk hc (= h·NC + gc) into the stage at st, counted on the mbarrier bar; the value tile's
// VB/64 boxes at (vc0 + 64·b, vc1) of U, or (vc0 + 64·b, h = vc1, token vc2) of dO (DO). One
// thread issues it all. OUT = false leaves out Qg and M, val = false the value tile (the
// two-level scan's passes without output, scan_stage_wg_tx).
template <int K, bool DO, bool OUT = true>
__device__ __forceinline__ void chunk_load_wg(const ChunkMaps &m, const ScanStage &L, uint32_t st, uint32_t bar, int hc,
                                              int VB, int vc0, int vc1, int vc2, bool val = true) {
    mb_expect_tx(bar, scan_stage_wg_tx(K, VB, OUT, val));
#pragma unroll
    for (int kb = 0; kb < K / 64; kb++) {
        tma_2d(st + L.oW + 4096 * kb, &m.W, 64 * kb, 16 * hc, bar);
        if (OUT) tma_2d(st + L.oQg + 4096 * kb, &m.Qg, 64 * kb, 16 * hc, bar);
    }
    tma_2d(st + L.oKrT, &m.KrT, 0, K * hc, bar);
    if (OUT) tma_2d(st + L.oM, &m.M, 0, 32 * hc, bar);
    if (val)
        for (int b = 0; b < VB / 64; b++) {
            if (DO) tma_3d(st + L.oVal + 2048 * b, &m.val, vc0 + 64 * b, vc1, vc2, bar);
            else tma_2d(st + L.oVal + 2048 * b, &m.val, vc0 + 64 * b, vc1, bar);
        }
    tma_2d(st + L.ogl, &m.gl, 0, hc, bar);
}
// The warpgroup scans' stage ring: per stage (16 bytes at bars) a full mbarrier (the copies'
// bytes) and an empty one (each of the nw consumer warps arrives when done with the stage). The
// CTA's last warpgroup gives its registers to the consumers and one of its threads fills the
// stages in order: step i into stage i % nst once that stage's previous use is released,
// load(i, stage) issuing the copies. Returns true in the consumer warps.
template <class F>
__device__ __forceinline__ bool wg_ring_start(uint32_t bars, int nst, int nw, int nsteps, F load) {
    if (threadIdx.x == 0) {
        for (int st = 0; st < nst; st++) {
            mb_init(bars + 16 * st, 1);
            mb_init(bars + 16 * st + 8, nw);
        }
        mb_init_fence();
    }
    __syncthreads();
    return wg_consumer(nw, [&] {
        for (int i = 0, st = 0, use = 0; i < nsteps; i++) {
            if (use > 0) mb_wait(bars + 16 * st + 8, (use - 1) & 1);
            load(i, st);
            if (++st == nst) st = 0, use++;
        }
    });
}
// a consumer warp done with stage st. No proxy fence: the refill's async writes come after its
// reads through the empty mbarrier's arrive (release) and the producer's wait (acquire), as in
// CUTLASS's consumer release; a fence.proxy.async here compiled to MEMBAR.ALL.CTA, which waits
// for the warp's outstanding memory operations — the output stores of the step before
__device__ __forceinline__ void wg_ring_release(uint32_t bars, int st, int lane) {
    __syncwarp();
    if (lane == 0) mb_arrive(bars + 16 * st + 8);
}

// the ldmatrix.trans address of lane `lane` for the [16 tokens][16 values] tile at local
// value v0 of a scan_stage_wg value slice (value v, token r: block v/64, row r, 16-byte chunk
// ((v%64)/8) ^ (r%8)) — the same tile lda_trans_sm / vprime_from read from a padded slice
__device__ __forceinline__ const bf16 *wg_val_tile(const unsigned char *sval, int v0, int lane) {
    const int r = 8 * (lane >> 4) + (lane & 7), v = v0 + 8 * ((lane >> 3) & 1);
    return (const bf16 *)(sval + 2048 * (v >> 6) + 128 * r + 16 * (((v & 63) >> 3) ^ (r & 7)));
}

// A fragments (hi and lo) of state columns 16j..16j+15 from the C fragments s[2j], s[2j+1]
template <bool SPLIT>
__device__ __forceinline__ void state_afrag(const float s0[4], const float s1[4], uint32_t ah[4], uint32_t al[4]) {
    if (SPLIT) {
        split_bf16(s0[0], s0[1], ah[0], al[0]);
        split_bf16(s0[2], s0[3], ah[1], al[1]);
        split_bf16(s1[0], s1[1], ah[2], al[2]);
        split_bf16(s1[2], s1[3], ah[3], al[3]);
    } else {
        ah[0] = pack_bf16(s0[0], s0[1]);
        ah[1] = pack_bf16(s0[2], s0[3]);
        ah[2] = pack_bf16(s1[0], s1[1]);
        ah[3] = pack_bf16(s1[2], s1[3]);
    }
}

// acc[2] (16 rows × tokens 0–7, 8–15) += Sᵀ Xᵀ for a [16][K] bf16 tile X (W or Qg), row
// stride ld (a warp holding only K of the state's columns passes X at its first column).
// k-steps go round-robin to 4 accumulator sets (short dependency chains: this product is
// on the serial critical path of the scan), summed in a fixed order at the end.
template <int K, bool SPLIT>
__device__ __forceinline__ void state_times_tile(const float (*s)[4], const bf16 *X, int lane, float acc[2][4],
                                                 int ld = KDA_LDK(K)) {
    float part[3][2][4] = {};
#pragma unroll
    for (int j = 0; j < K / 16; j++) {
        uint32_t ah[4], al[4], b[4];
        state_afrag<SPLIT>(s[2 * j], s[2 * j + 1], ah, al);
        ldb_nk2_sm(b, X, ld, 0, 16 * j, lane);
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            float *c = (j & 3) ? part[(j & 3) - 1][nt] : acc[nt];
            mma16816(c, ah, b + 2 * nt);
            if (SPLIT) mma16816(c, al, b + 2 * nt);
        }
    }
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[nt][e] += (part[0][nt][e] + part[1][nt][e]) + part[2][nt][e];
}

// acc[gi] (16 rows × tokens 0–7, 8–15) += Sᵀ X[gi]ᵀ for G [16][K] bf16 tiles (a 64-token
// step's W~ chunks): one pass over the state's k-steps, its A fragments packed once for all G
// tiles, 2G independent accumulators (enough to hide the tensor cores' latency)
template <int K, bool SPLIT, int G>
__device__ __forceinline__ void state_times_tiles(const float (*s)[4], const bf16 *const *X, int lane, float (*acc)[2][4],
                                                  int ld) {
#pragma unroll
    for (int j = 0; j < K / 16; j++) {
        uint32_t ah[4], al[4];
        state_afrag<SPLIT>(s[2 * j], s[2 * j + 1], ah, al);
#pragma unroll
        for (int gi = 0; gi < G; gi++) {
            uint32_t b[4];
            ldb_nk2_sm(b, X[gi], ld, 0, 16 * j, lane);
#pragma unroll
            for (int nt = 0; nt < 2; nt++) {
                mma16816(acc[gi][nt], ah, b + 2 * nt);
                if (SPLIT) mma16816(acc[gi][nt], al, b + 2 * nt);
            }
        }
    }
}

// vp from U's tile already loaded by one ldmatrix.trans: word 2·nt + h holds tokens 8nt + 2t,
// +1 of value vl0 + 8h + g, i.e. elements e = 2h, 2h + 1 of n-tile nt
__device__ __forceinline__ void vprime_from_u(const float p[2][4], const uint32_t u[4], float vp[2][4],
                                              bool zero_u = false) {
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const uint32_t w = u[2 * nt + (e >> 1)];
            const float uv = __uint_as_float((e & 1) ? (w & 0xffff0000u) : (w << 16));
            vp[nt][e] = (zero_u ? 0.f : uv) - p[nt][e];
        }
}
// vp = V'ᵀ tile = Uᵀ − p for p = Sᵀ Wᵀ (C fragments): rows = the warp's value rows (local
// column vl0 + g (+8) of sU [16][ldu]); zero_u: U = 0 (the two-level scan's transitions). U is
// read either way (then discarded by a select, never multiplied: the tile may hold garbage),
// so the loads stay free to issue ahead of the product — a pointer test in their place made
// the one-warp-per-slice scan 28% slower (H200, B1·T8192·H96, session 8)
__device__ __forceinline__ void vprime_from(const float p[2][4], const bf16 *sU, int ldu, int vl0, int lane,
                                            float vp[2][4], bool zero_u = false) {
    uint32_t u[4];   // U's tile [16 tokens][16 values]
    ldsm_x4_t(u, sU + (8 * (lane >> 4) + (lane & 7)) * ldu + vl0 + 8 * ((lane >> 3) & 1));
    vprime_from_u(p, u, vp, zero_u);
}

template <int K, bool SPLIT>
__device__ __forceinline__ void scan_vprime(const float (*s)[4], const bf16 *sW, const bf16 *sU, int ldu, int vl0,
                                            int lane, float vp[2][4], bool zero_u = false) {
    float p[2][4] = {};
    state_times_tile<K, SPLIT>(s, sW, lane, p);
    vprime_from(p, sU, ldu, vl0, lane, vp, zero_u);
}

// bf16 A fragment of a 16 × 16 (rows × tokens) C-fragment pair, optionally negated
__device__ __forceinline__ void tok_afrag(const float x[2][4], uint32_t a[4], float sign) {
    a[0] = pack_bf16(sign * x[0][0], sign * x[0][1]);
    a[1] = pack_bf16(sign * x[0][2], sign * x[0][3]);
    a[2] = pack_bf16(sign * x[1][0], sign * x[1][1]);
    a[3] = pack_bf16(sign * x[1][2], sign * x[1][3]);
}

// o (Oᵀ tile, fp32) = Sᵀ Qgᵀ (+ V'ᵀ Mᵀ when with_m: a warp holding K of the state's columns
// passes sQg at its first one, its tile's row stride ld, and adds M's term once per slice)
template <int K, bool SPLIT>
__device__ __forceinline__ void scan_out(const float (*s)[4], const bf16 *sQg, const bf16 *sM, const uint32_t av[4],
                                         int lane, float o[2][4], bool with_m = true, int ld = KDA_LDK(K)) {
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[nt][e] = 0.f;
    state_times_tile<K, SPLIT>(s, sQg, lane, o, ld);
    if (!with_m) return;
    uint32_t bh[4], bl[4];
    ldb_nk2_sm(bh, sM, KDA_LD16, 0, 0, lane);
    ldb_nk2_sm(bl, sM + 16 * KDA_LD16, KDA_LD16, 0, 0, lane);
#pragma unroll
    for (int nt = 0; nt < 2; nt++) {
        mma16816(o[nt], av, bh + 2 * nt);
        mma16816(o[nt], av, bl + 2 * nt);
    }
}

// Sᵀ ← Sᵀ Diag(gl) on its own (the warpgroup steps, whose update product then adds into s)
template <int K>
__device__ __forceinline__ void state_decay(float (*s)[4], const float *sgl, int lane) {
    const int t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < K / 8; nt++) {
        const float2 g = *reinterpret_cast<const float2 *>(sgl + 8 * nt + 2 * t);
        s[nt][0] *= g.x; s[nt][1] *= g.y; s[nt][2] *= g.x; s[nt][3] *= g.y;
    }
}

// Sᵀ ← Sᵀ Diag(gl) + V'ᵀ Kr   (av = A fragment of V'ᵀ)
template <int K>
__device__ __forceinline__ void scan_update(float (*s)[4], const uint32_t av[4], const bf16 *sKrT, const float *sgl,
                                            int lane) {
    int t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < K / 8; nt += 2) {
        uint32_t b[4];
        ldb_nk2_sm(b, sKrT, KDA_LD16, 8 * nt, 0, lane);
#pragma unroll
        for (int u = 0; u < 2; u++) {
            float g0 = sgl[8 * (nt + u) + 2 * t], g1 = sgl[8 * (nt + u) + 2 * t + 1];
            s[nt + u][0] *= g0; s[nt + u][1] *= g1; s[nt + u][2] *= g0; s[nt + u][3] *= g1;
            mma16816(s[nt + u], av, b + 2 * u);
        }
    }
}

// dvp = dV'ᵀ tile = dOᵀ M + dSᵀ Krᵀ; aO receives the A fragment of dOᵀ (rows vl0..vl0+15
// of sdO [16][ldo] read transposed)
template <int K, bool SPLIT>
__device__ __forceinline__ void rscan_dvp(const float (*ds)[4], const bf16 *sdO, int ldo, int vl0, const bf16 *sM,
                                          const bf16 *sKrT, int lane, float dvp[2][4], uint32_t aO[4]) {
    float odd[2][4] = {};
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) dvp[nt][e] = 0.f;
    lda_trans_sm(aO, sdO, ldo, vl0, 0, lane);
    {
        uint32_t bh[4], bl[4];
        ldb_kn2_sm(bh, sM, KDA_LD16, 0, 0, lane);
        ldb_kn2_sm(bl, sM + 16 * KDA_LD16, KDA_LD16, 0, 0, lane);
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            mma16816(dvp[nt], aO, bh + 2 * nt);
            mma16816(dvp[nt], aO, bl + 2 * nt);
        }
    }
#pragma unroll
    for (int j = 0; j < K / 16; j++) {
        uint32_t ah[4], al[4], b[4];
        state_afrag<SPLIT>(ds[2 * j], ds[2 * j + 1], ah, al);
        ldb_kn2_sm(b, sKrT, KDA_LD16, 0, 16 * j, lane);
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
            float *c = (j & 1) ? odd[nt] : dvp[nt];
            mma16816(c, ah, b + 2 * nt);
            if (SPLIT) mma16816(c, al, b + 2 * nt);
        }
    }
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) dvp[nt][e] += odd[nt][e];
}

// dSᵀ ← dSᵀ Diag(gl) + dOᵀ Qg per chunk (the 64-token steps: on its own, the W~ term once
// the group's dV' are known)
template <int K>
__device__ __forceinline__ void rscan_decay_out(float (*ds)[4], const uint32_t aO[4], const bf16 *sQg, const float *sgl,
                                                int lane) {
    int t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < K / 8; nt += 2) {
        uint32_t b[4];
        ldb_kn2_sm(b, sQg, KDA_LDK(K), 8 * nt, 0, lane);
#pragma unroll
        for (int u = 0; u < 2; u++) {
            float g0 = sgl[8 * (nt + u) + 2 * t], g1 = sgl[8 * (nt + u) + 2 * t + 1];
            ds[nt + u][0] *= g0; ds[nt + u][1] *= g1; ds[nt + u][2] *= g0; ds[nt + u][3] *= g1;
            mma16816(ds[nt + u], aO, b + 2 * u);
        }
    }
}
// dSᵀ −= dV'ᵀ W
template <int K>
__device__ __forceinline__ void rscan_minus_w(float (*ds)[4], const float dvp[2][4], const bf16 *sW, int lane) {
    uint32_t am[4];
    tok_afrag(dvp, am, -1.f);
#pragma unroll
    for (int nt = 0; nt < K / 8; nt += 2) {
        uint32_t b[4];
        ldb_kn2_sm(b, sW, KDA_LDK(K), 8 * nt, 0, lane);
        mma16816(ds[nt], am, b);
        mma16816(ds[nt + 1], am, b + 2);
    }
}
// dSᵀ ← dSᵀ Diag(gl) + dOᵀ Qg − dV'ᵀ W (per element in that order: the same arithmetic as
// the two halves interleaved per column tile)
template <int K>
__device__ __forceinline__ void rscan_update(float (*ds)[4], const float dvp[2][4], const uint32_t aO[4],
                                             const bf16 *sQg, const bf16 *sW, const float *sgl, int lane) {
    rscan_decay_out<K>(ds, aO, sQg, sgl, lane);
    rscan_minus_w<K>(ds, dvp, sW, lane);
}

// state fragments ↔ memory. Transposed [V][K] fp32 (checkpoints): element (v, c) at X[v·ld + c]
// (ld = K unless the warp holds only K of the columns: then X points at its first one);
// K-first [K][V] fp32 (the API's S0/S_out): at X[c·V + v]. v0 = the warp's first value row.
template <int K>
__device__ __forceinline__ void frag_load_vk(float (*s)[4], const float *X, int v0, int lane) {
    int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < K / 8; nt++) {
        float2 a = *reinterpret_cast<const float2 *>(X + (size_t)(v0 + g) * K + 8 * nt + 2 * t);
        float2 b = *reinterpret_cast<const float2 *>(X + (size_t)(v0 + g + 8) * K + 8 * nt + 2 * t);
        s[nt][0] = a.x; s[nt][1] = a.y; s[nt][2] = b.x; s[nt][3] = b.y;
    }
}
template <int K>
__device__ __forceinline__ void frag_store_vk(const float (*s)[4], float *X, int v0, int lane, int ld = K) {
    int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < K / 8; nt++) {
        *reinterpret_cast<float2 *>(X + (size_t)(v0 + g) * ld + 8 * nt + 2 * t) = make_float2(s[nt][0], s[nt][1]);
        *reinterpret_cast<float2 *>(X + (size_t)(v0 + g + 8) * ld + 8 * nt + 2 * t) = make_float2(s[nt][2], s[nt][3]);
    }
}
// The per-chunk states of KWs::cstates go out through a per-warp staging tile in shared
// memory so that every global store is a whole 16-byte piece of a row: stored straight from
// the fragments (4-byte words, 8 rows of 16 bytes per instruction) they doubled the time of
// both scans (H200, session 27). Values are rounded as the products' A fragments are.
//
// A warp's 16 × KP tile of the state (rows v0 .. v0 + 15 in fragments s, its KP columns) to the
// bf16 rows X[r·ld + c], r = 0..15 (X points at row v0 and the warp's first column); stg: the
// warp's [16][KP + 8] staging tile
// (sa: the tile already packed as the products' A fragments, state_afrag)
template <int KP>
__device__ __forceinline__ void frag_store_vk_bf16(const uint32_t (*sa)[4], bf16 *stg, bf16 *X, int ld, int lane) {
    const int r = lane & 7, j = lane >> 3;
#pragma unroll
    for (int nt = 0; nt < KP / 8; nt += 2) {   // matrices j: rows 8·(j & 1) .., columns 8·(nt + (j >> 1)) ..
        unsigned a = (unsigned)__cvta_generic_to_shared(stg + (r + 8 * (j & 1)) * (KP + 8) + 8 * (nt + (j >> 1)));
        asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(a),
                     "r"(sa[nt / 2][0]), "r"(sa[nt / 2][1]), "r"(sa[nt / 2][2]), "r"(sa[nt / 2][3])
                     : "memory");
    }
    __syncwarp();
#pragma unroll
    for (int p = lane; p < 2 * KP; p += 32) {   // 16 rows of KP/8 pieces
        const int row = p / (KP / 8), cc = p % (KP / 8);
        *reinterpret_cast<uint4 *>(X + (size_t)row * ld + 8 * cc) =
            *reinterpret_cast<const uint4 *>(stg + row * (KP + 8) + 8 * cc);
    }
    __syncwarp();   // the tile is written again later in the step
}
template <int KP>
__device__ __forceinline__ void frag_store_vk_bf16(const float (*s)[4], bf16 *stg, bf16 *X, int ld, int lane) {
    uint32_t sa[KP / 16][4], unused[4];
#pragma unroll
    for (int j = 0; j < KP / 16; j++) state_afrag<false>(s[2 * j], s[2 * j + 1], sa[j], unused);
    frag_store_vk_bf16<KP>(sa, stg, X, ld, lane);
}
// A 16 × 16 tile x (value rows v0 .. v0 + 15 × tokens, C fragments) to the bf16 rows
// X[token·ld + v0 ..] (a token's values contiguous: V' and dV' as [16][V]) through stg [16][24]
__device__ __forceinline__ void store_tok_tile(const float x[2][4], bf16 *stg, bf16 *X, int ld, int v0, int lane) {
    store_acc_rows<2>(stg, 24, 0, x, lane);
    __syncwarp();
    const int row = lane >> 1, hf = lane & 1;
    *reinterpret_cast<uint4 *>(X + (size_t)row * ld + v0 + 8 * hf) = *reinterpret_cast<const uint4 *>(stg + row * 24 + 8 * hf);
    __syncwarp();
}
// bytes of a warp's staging tile (either use)
template <int KP> __host__ __device__ constexpr int cstate_stage_bytes() { return 16 * (KP + 8 > 24 ? KP + 8 : 24) * 2; }

template <int K>
__device__ __forceinline__ void frag_load_kv(float (*s)[4], const float *X, int V, int v0, int lane) {
    int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < K / 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int c = 8 * nt + 2 * t + (e & 1), v = v0 + g + 8 * (e >> 1);
            s[nt][e] = X ? X[(size_t)c * V + v] : 0.f;
        }
}
template <int K>
__device__ __forceinline__ void frag_store_kv(const float (*s)[4], float *X, int V, int v0, int lane) {
    int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < K / 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int c = 8 * nt + 2 * t + (e & 1), v = v0 + g + 8 * (e >> 1);
            X[(size_t)c * V + v] = s[nt][e];
        }
}

#endif
