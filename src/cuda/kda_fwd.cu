// kda_fwd.cu — chunked KDA forward (docs/cuda_kda.md): two kernels in the FlashKDA style,
// with 16-token chunks.
//
// 1. kda_prep_kernel — chunk-parallel (one block per (chunk, head)): L2 norms of q, k,
//    β = σ(logit), the gate and its cumulative sum G inside the chunk (log2 units), then
//      L = β_row ⊙ StrictTril(Σ_c k̂_ic k̂_jc e^{G_ic − G_jc}),  M = scale·Tril(Σ_c q̂_ic k̂_jc e^{G_ic − G_jc}),
//      INV = (I + L)^{-1} (forward substitution, fp32),
//      W = INV·Diag(β)(K̂⊙e^G),  U = INV·Diag(β)V,  Qg = scale·Q̂⊙e^G,  Kr = K̂⊙e^{G_last − G},
//      gl = e^{G_last}.
//    Bounded gate: L and M are tensor-core products of factored exponentials,
//    (x⊙e^{G−c0})·(k̂⊙e^{c0−G})ᵀ with c0 = 7.5·lb: every factor within e^{±42.5} for
//    g ≥ lb = −5 (bf16 holds them; never fp16, never clamped). The anchor depends only on
//    the chunk start, so outputs never depend on later gates.
//    Unbounded gate (or exact = 1): exact decays e^{G_i − G_j} split at binary-tree anchors
//    (kda_tree.cuh): four tensor-core products whose factors are all ≤ 1, safe for any gate.
// 2. kda_scan_kernel — one block per (sequence, head, value slice), serial over chunks:
//      V' = U − W S;  O = Qg S + M V';  S ← Diag(gl) S + Krᵀ V'
//    with the fp32 state in tensor-core C fragments (kda_scan.cuh), chunk data streamed
//    through a cp.async pipeline, optional 64-token state checkpoints for the backward.
#include "kda_common.cuh"
#include "kda_scan.cuh"
#include "kda_tree.cuh"
#include "wgmma_ops.cuh"
#include "tma.cuh"
#include "mbarrier.cuh"
#include <cudaTypedefs.h>
#include <pthread.h>
#include <stdlib.h>
#include <type_traits>

#define PREP_THREADS 128
// prep blocks per SM: the shared memory (PrepSmem, 37,888 bytes at K = V = 128, with the 1 KB the
// driver keeps a block: exactly a SM's 228 KB, asserted below) and 80 registers allow six; five
// (96 registers, 41,984 bytes) until session 40, which measured six 5–8% faster (bench/RESULTS.md)
#ifndef PREP_BLOCKS
#define PREP_BLOCKS 6
#endif
#define PREP_GRID_Y 32768   // the prep grid's chunks per y row (gridDim.y ≤ 65535; 1M tokens are 65536 chunks)

// ---------------------------------------------------------------------------------------
// workspace

static size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }

// chunks per segment of the two-level scans (kda_scan_segs): whole checkpoint groups
static int seg_chunks(int nc, int nseg) {
    int per = (nc + nseg - 1) / nseg;
    return ((per + KDA_SEG - 1) / KDA_SEG) * KDA_SEG;
}
static void scan_first_plan(const kda_params *p, int *nseg, int *segc, int *seg0c);

KWs kda_ws_layout(const kda_params *p, void *base, int backward) {
    KWs w;
    memset(&w, 0, sizeof w);
    if (p->cu_seqlens) {
        w.NC = p->T / KDA_C + p->N;
        w.NS = p->T / (KDA_C * KDA_SEG) + p->N;
    } else {
        w.NC = p->N * ((p->T + KDA_C - 1) / KDA_C);
        w.NS = p->N * ((p->T + KDA_C * KDA_SEG - 1) / (KDA_C * KDA_SEG));
    }
    size_t H = p->H, K = p->K, V = p->V, NC = w.NC, NS = w.NS, off = 0;
    // the forward's part (through ckpt) lives in ws_fwd when the caller gave one
    char *b = (char *)(p->ws_fwd ? p->ws_fwd : base);
#define TAKE(ptr, type, n)                                  \
    do {                                                    \
        w.ptr = b ? (type *)(b + off) : NULL;               \
        off += align256((size_t)(n) * sizeof(type));        \
    } while (0)
    TAKE(coff, int, p->N + 1);
    TAKE(soff, int, p->N + 1);
    TAKE(W, bf16, H * NC * 16 * K);
    TAKE(Qg, bf16, H * NC * 16 * K);
    TAKE(KrT, bf16, H * NC * 16 * K);
    TAKE(U, bf16, H * NC * 16 * V);
    TAKE(M, bf16, H * NC * 2 * 16 * 16);   // hi then lo
    TAKE(gl, float, H * NC * K);
    w.group = kda_scan_group(p);
    w.cstates = kda_chunk_states(p);
    if (w.cstates) {
        w.cs.gs = kda_vgroup();
        w.cs.ps = w.cs.gs > 1 ? (w.NC + w.cs.gs - 1) / w.cs.gs : 0;
        w.cs.n = w.cs.ps ? w.cs.ps + p->N : w.NC;
    }
    const size_t NSC = w.cs.n;
    if (w.cstates && (p->save || backward)) {
        TAKE(Sc, bf16, H * NSC * V * K);
        TAKE(Vp, bf16, H * NC * 16 * V);
    } else if (p->save || backward) {
        TAKE(ckpt, float, H * NS * V * K);
    }
    if (p->save || backward) TAKE(Lx, float, H * NC * KDA_LX);
    // the two-level scan's per-segment states: scratch of the forward scan (and of the
    // backward's recompute), in the forward's part so that a forward needs only ws_fwd
    w.nseg = kda_scan_segs(p);
    w.segc = w.nseg > 1 ? seg_chunks((p->T + KDA_C - 1) / KDA_C, w.nseg) : 0;
    w.seg0c = w.segc;
    if (w.nseg > 1 && !p->save && !backward) scan_first_plan(p, &w.nseg, &w.segc, &w.seg0c);
    if (w.nseg > 1) {
        const size_t nhs = (size_t)p->N * H * w.nseg;
        TAKE(segL, float, nhs * K * V);
        TAKE(segA, float, nhs * K * K);
        TAKE(segS0, float, nhs * K * V);
    }
    // the 64-token steps' merged W~, U~ (kda_merge.cu): beside W and U, which the backward's
    // chunk-level kernels still read
    if (w.group > 1) {
        TAKE(Wt, bf16, H * NC * 16 * K);
        TAKE(Ut, bf16, H * NC * 16 * V);
    }
    w.fwd_bytes = off;
    if (p->ws_fwd) {
        b = (char *)base;
        off = 0;
    }
    if (backward) {
        if (w.cstates) TAKE(dSc, bf16, H * NSC * V * K);
        else TAKE(dckpt, float, H * NS * V * K);
        TAKE(dQg, bf16, H * NC * 16 * K);
        TAKE(dWg, bf16, H * NC * 16 * K);
        TAKE(dKr, bf16, H * NC * 16 * K);
        TAKE(dgl, float, H * NC * K);
        TAKE(dM, float, H * NC * 16 * 16);
        TAKE(dU, bf16, H * NC * 16 * V);
        TAKE(pA, float, H * NC);
        TAKE(pdb, float, H * NC * K);
    }
#undef TAKE
    w.bytes = off;
    return w;
}

size_t kda_workspace_size(const kda_params *p, int backward) { return kda_ws_layout(p, NULL, backward).bytes; }
size_t kda_saved_size(const kda_params *p) {
    kda_params q = *p;
    q.save = 1;
    q.ws_fwd = NULL;
    return kda_ws_layout(&q, NULL, 0).fwd_bytes;
}

KSeq kda_seq(const kda_params *p, const KWs &w) {
    KSeq s;
    s.cu = p->cu_seqlens;
    s.coff = w.coff;
    s.soff = w.soff;
    s.N = p->N;
    s.T = p->T;
    s.nc = (p->T + KDA_C - 1) / KDA_C;
    s.ns = (p->T + KDA_C * KDA_SEG - 1) / (KDA_C * KDA_SEG);
    return s;
}

// chunk and segment offsets of a packed batch (one thread: N is small)
__global__ void kda_offsets_kernel(const int *cu, int N, int *coff, int *soff) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    int c = 0, s = 0;
    for (int n = 0; n < N; n++) {
        coff[n] = c;
        soff[n] = s;
        int len = cu[n + 1] - cu[n];
        int nc = (len + KDA_C - 1) / KDA_C;
        c += nc;
        s += (nc + KDA_SEG - 1) / KDA_SEG;
    }
    coff[N] = c;
    soff[N] = s;
}

cudaError_t kda_offsets(const kda_params *p, const KWs &w) {
    if (!p->cu_seqlens) return cudaSuccess;
    kda_offsets_kernel<<<1, 32, 0, p->stream>>>(p->cu_seqlens, p->N, w.coff, w.soff);
    return cudaGetLastError();
}

int kda_scan_stages(long long blocks, int stage_bytes, int fixed_bytes, bool wg) {
    const char *e = getenv("KDA_STAGES");
    if (e && *e) return atoi(e) < 2 ? 2 : atoi(e) > KDA_STAGES_MAX ? KDA_STAGES_MAX : atoi(e);
    // blocks resident per SM at once; each may use an equal share of the 227 KiB
    // (wg: one, as their registers allow — more blocks than SMs run in waves)
    long long per_sm = wg ? 1 : (blocks + kda_num_sms() - 1) / kda_num_sms();
    if (per_sm < 1) per_sm = 1;
    if (per_sm > 4) per_sm = 4;
    // wg: the TMA ring's 1024-byte alignment and its mbarriers (16 bytes a stage) besides
    int budget = (int)((227 * 1024) / per_sm) - fixed_bytes - 1024 - (wg ? 1024 + 16 * KDA_STAGES_MAX : 0);
    int st = budget / stage_bytes;
    // measured on H200 (bench/RESULTS.md): deeper pipelines than 3 did not help the scans'
    // cp.async stages; the warpgroup steps' TMA rings take 5 (session 36, B1·T8192·H96: the
    // state-gradient scan 0.592 → 0.547–0.552 ms, the forward scan 0.376 → 0.372–0.373; 4 gave
    // 0.558–0.561 and 0.374–0.375)
    const int cap = wg ? 5 : 3;
    st = st > cap ? cap : st;
    return st < 2 ? 2 : st;
}

int kda_num_sms(void) {
    static int n = 0;
    if (!n) {
        int dev = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
        if (n <= 0) n = 132;
    }
    return n;
}

// ---------------------------------------------------------------------------------------
// 1. chunk-parallel preparation

struct PrepArgs {
    KSeq sq;
    int H, NC;
    float lb, scale, c0;      // c0: the factored anchor shift in log2 units (7.5·lb·log2 e)
    const bf16 *q, *k, *v, *f, *beta;
    const float *A_log, *dt_bias;
    bf16 *W, *Qg, *KrT, *U, *M;
    float *gl;
    float *Lx;   // NULL, or the solve kept for the backward (KDA_LX a chunk-head)
    // q, k, f ([tokens][H][K]) and v ([tokens][H][V]) for the input copies: q, k, f boxes of one
    // head's 16 whole rows (prep_input_map), v 64-channel boxes with the 128-byte swizzle (PrepSmem::vs)
    CUtensorMap mq, mk, mf, mv;
};

// component i (0–3) of v
__device__ __forceinline__ float f4_at(float4 v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }
// the 16 bytes of v at token row r, channels c .. c + 7 (c a multiple of 8) in the [V/64][16][64]
// tile the 128-byte-swizzled boxes land in (16-byte piece j of a 128-byte row at j ^ (r mod 8); the
// tile 1024-byte aligned): ldmatrix's 8 rows of one piece fall in 8 distinct bank groups
__device__ __forceinline__ const bf16 *prep_v_row(const bf16 (*vs)[16][64], int r, int c) {
    return &vs[c >> 6][r][8 * (((c >> 3) & 7) ^ (r & 7))];
}
// 16-byte half h of row c of a [K][16] bf16 factor tile: the halves of rows c with bit 2 set
// swapped, so 8 consecutive rows' same halves (a thread per row storing, or ldmatrix reading
// 8 rows) fall in 8 distinct bank groups of a 32-byte-row tile
__device__ __forceinline__ uint4 *prep_fac_row(const bf16 (*T)[16], int c, int h) {
    return reinterpret_cast<uint4 *>(const_cast<bf16 *>(&T[c][8 * (h ^ ((c >> 2) & 1))]));
}

template <int K, int V>
struct PrepSmem {
    // the B operands of [W | U] = (INV·Diag β)·[K̂⊙e^G | V]: the chunk's v rows as they land
    // (boxes of 64 channels, 128-byte swizzle: prep_v_row), read by ldmatrix.trans — they were
    // transposed into a [V][16] tile by a thread per channel, 26 instructions a thread and 96
    // shared-memory wavefronts a block (session 40); K̂⊙e^G transposed [channel][token] by its
    // channel's thread, swizzled as the factor tiles (prep_fac_row; 32-byte rows, no padding)
    alignas(1024) bf16 vs[V / 64][16][64];
    bf16 KeT[K][16];
    float L[16][17], Mm[16][17], INV[16][17];
    alignas(16) float rq[16], rk[16];   // read four rows at a time
    float beta[16], qk[16];   // qk: the exact path's diagonal of M
    uint64_t bar;   // the input copies' mbarrier
    alignas(128) union {   // 128: the input copies' destination
        // bounded: A0 = scale·q̂⊙2^{G−c0}, A1 = k̂⊙2^{G−c0}, A2 = k̂⊙2^{c0−G} as bf16 hi + lo,
        // split once by the channel's thread (T[2i] hi, T[2i+1] lo of Ai), transposed [channel]
        // [token] for ldmatrix (prep_fac_row: the 16-byte halves swizzled, no padding). Each
        // product warp split its fp32 operands itself before (A2 four times, A0 and A1 twice):
        // 20% of the kernel's instructions (ncu, session 26)
        struct { bf16 T[6][K][16]; } fac;
        TreeLevel<K> tree[2];   // exact: two tree levels at a time (the same bytes as fac)
        struct { bf16 q[16][K], k[16][K], f[16][K]; } in;   // the chunk's rows, first (TMA)
        struct { bf16 W[16][K + 8], U[16][V + 8], Qg[16][K + 8]; } out;   // output staging, after L and M
    } u;
};

static_assert(PREP_BLOCKS * (sizeof(PrepSmem<128, 128>) + 1024) <= 228 * 1024,
              "PrepSmem no longer lets PREP_BLOCKS prep blocks share a SM");

template <int K, int V, int MODE>
__global__ void __launch_bounds__(PREP_THREADS, PREP_BLOCKS) kda_prep_kernel(const __grid_constant__ PrepArgs a) {
    constexpr bool EXACT = MODE != KDA_BOUNDED;
    constexpr int GATE = MODE == KDA_UNBOUNDED ? 1 : 0;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    PrepSmem<K, V> &S = *reinterpret_cast<PrepSmem<K, V> *>(smem_raw);
    // (head, chunk) from a 2-D grid in the same order as h + H·gc (no division by H before the
    // block's first copies can be issued)
    const int h = blockIdx.x, gc = blockIdx.y + PREP_GRID_Y * blockIdx.z;
    int n, c, len;
    long long t0;
    if (gc >= a.NC || !a.sq.chunk(gc, n, c, t0, len)) return;
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    size_t hc = (size_t)h * a.NC + gc;
    constexpr int CPL = K / 32, RPW = 16 / (PREP_THREADS / 32);

    // the chunk's rows of q, k, f, v into shared memory by 3 + V/64 bulk tensor copies (q, k, f a
    // box of one head's 16 rows each, v by 64 channels; issued by one thread), read from there by
    // channel and by row. 16-byte
    // cp.async copies before: their address arithmetic, and their shared-memory writes (two
    // wavefronts per 128 bytes) were 14% of the kernel's wavefronts with L1 75% busy (ncu, session
    // 32). Rows past the sequence's end come from the next sequence (zeros past the last token)
    // and are zeroed below
    const uint32_t bar = (uint32_t)__cvta_generic_to_shared(&S.bar);
    if (tid == 0) {
        // the swizzled v boxes assume a 1024-byte aligned tile (the dynamic block starts there)
        if ((uint32_t)__cvta_generic_to_shared(&S.vs[0][0][0]) & 1023u) __trap();
        mb_init(bar, 1);
        mb_init_fence();
    }
    __syncthreads();
    if (tid == 0) {
        mb_expect_tx(bar, 16 * (3 * K + V) * (int)sizeof(bf16));
        const int tk = (int)t0;
        tma_3d((uint32_t)__cvta_generic_to_shared(&S.u.in.q[0][0]), &a.mq, 0, h, tk, bar);
        tma_3d((uint32_t)__cvta_generic_to_shared(&S.u.in.k[0][0]), &a.mk, 0, h, tk, bar);
        tma_3d((uint32_t)__cvta_generic_to_shared(&S.u.in.f[0][0]), &a.mf, 0, h, tk, bar);
#pragma unroll
        for (int b = 0; b < V / 64; b++) tma_3d((uint32_t)__cvta_generic_to_shared(&S.vs[b][0][0]), &a.mv, 64 * b, h, tk, bar);
    }
    float rbl[RPW];
    chunk_beta_rows<RPW, PREP_THREADS>(rbl, a.beta, t0, a.H, h, len, warp);
    mb_wait(bar, 0);
    if (len < 16) {   // a sequence's last chunk: its rows past the end as zeros
        chunk_zero_tail<K, PREP_THREADS, 3>({&S.u.in.q[0][0], &S.u.in.k[0][0], &S.u.in.f[0][0]}, len, tid);
        if constexpr (V == 64) chunk_zero_tail<64, PREP_THREADS, 1>({&S.vs[0][0][0]}, len, tid);   // whole rows:
        else chunk_zero_tail<64, PREP_THREADS, 2>({&S.vs[0][0][0], &S.vs[1][0][0]}, len, tid);     // the swizzle moot
    }
    __syncthreads();
    const int cch = tid;
    // the rows' q and k as packed bf16 pairs (one vector load per row and tensor)
    uint32_t rqx[RPW][CPL / 2], rkx[RPW][CPL / 2];
#pragma unroll
    for (int i = 0; i < RPW; i++) {
        int r = warp + i * (PREP_THREADS / 32);
        ld_bf16x<CPL>(rqx[i], &S.u.in.q[r][lane * CPL], true);
        ld_bf16x<CPL>(rkx[i], &S.u.in.k[r][lane * CPL], true);
    }
    if constexpr (EXACT) {   // the tree levels write only their pairs (bounded: all of L, M)
        for (int e = tid; e < 16 * 17; e += PREP_THREADS) {
            (&S.L[0][0])[e] = 0.f;
            (&S.Mm[0][0])[e] = 0.f;
        }
    }
    // rows: reciprocal norms, β (exact: the diagonal of M, scale·q̂·k̂)
    static_assert(RPW == 4, "four rows a warp");
    chunk_row_rnorms<CPL>(rqx, rkx, warp, lane, S.rq, S.rk);
    if constexpr (EXACT) {
        float sqk[RPW];
#pragma unroll
        for (int i = 0; i < RPW; i++) {
            sqk[i] = 0.f;
#pragma unroll
            for (int e = 0; e < CPL; e++) sqk[i] = fmaf(bf_at(rqx[i], e), bf_at(rkx[i], e), sqk[i]);
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) sqk[i] += __shfl_xor_sync(0xffffffffu, sqk[i], o);
        }
        __syncwarp();   // the warp's rq, rk written
        if (lane == 0) {
#pragma unroll
            for (int i = 0; i < RPW; i++) {
                int r = warp + i * (PREP_THREADS / 32);
                S.qk[r] = sqk[i] * S.rq[r] * S.rk[r] * a.scale;
            }
        }
    }
    if (lane == 0) {
#pragma unroll
        for (int i = 0; i < RPW; i++) {
            int r = warp + i * (PREP_THREADS / 32);
            S.beta[r] = r < len ? sigmoidf_(rbl[i]) : 0.f;
        }
    }
    // the channel's rows (after the norms: their 48 registers are not live across the
    // reductions; the unbounded variant spilled)
    float fr[16], qr[16], kr[16];
    if (cch < K) chunk_channel<K>(fr, qr, kr, S.u.in.q, S.u.in.k, S.u.in.f, cch);
    __syncthreads();

    // per channel: gate, cumulative sum (log2), decayed rows; from here on qr holds scale·q̂
    // and kr holds k̂ (the exact path's tree levels read them with Gs; bounded: k̂⊙2^{c0−G} after
    // the loop)
    float Gs[16];
    uint32_t qgp[8];   // this channel's Qg rows as bf16 pairs, staged after L and M (vector stores)
    uint32_t kep[4];   // its K̂⊙e^G rows, four pairs at a time, for KeT (16-byte stores, as the factor tiles)
    float qe0 = 0.f, ke0 = 0.f;   // an even row's Qg and K̂⊙e^G until its pair is packed
    float fx[3][2];             // bounded: this row pair's factors A0, A1, A2 ...
    uint32_t fh[3][4], fl[3][4];   // ... split, four row pairs at a time
    if (cch < K) {
        float eA = expf(a.A_log[h]), db = a.dt_bias[(size_t)h * K + cch];
        float Cd = 0.f;   // bounded: 2^{−c0}
        if constexpr (!EXACT) Cd = ex2f_(-a.c0);
        float G = 0.f;
        float4 rq4, rk4;
#pragma unroll
        for (int r = 0; r < 16; r++) {
            const float g = chunk_gate_row<GATE>(a.lb, eA, fr[r] + db, r, len);
            G = fmaf(g, KDA_LOG2E, G);
            Gs[r] = G;
            if ((r & 3) == 0) {   // four rows' reciprocal norms by one broadcast load each
                rq4 = *reinterpret_cast<const float4 *>(&S.rq[r]);
                rk4 = *reinterpret_cast<const float4 *>(&S.rk[r]);
            }
            float qs = qr[r] * f4_at(rq4, r & 3) * a.scale;
            qr[r] = qs;
            kr[r] *= f4_at(rk4, r & 3);
            const float E = ex2f_(G), qe = qs * E, ke = kr[r] * E;
            // Qg and K̂⊙e^G rounded a row pair at a time (one packing conversion for two rows)
            if (r & 1) {
                qgp[r >> 1] = pack_bf16(qe0, qe);
                kep[(r >> 1) & 3] = pack_bf16(ke0, ke);
            } else {
                qe0 = qe;
                ke0 = ke;
            }
            if ((r & 7) == 7)   // rows r − 7 .. r: one 16-byte half of KeT's row cch
                *prep_fac_row(S.KeT, cch, r >> 3) = make_uint4(kep[0], kep[1], kep[2], kep[3]);
            if constexpr (!EXACT) {
                // 2^{G−c0} = 2^G·2^{−c0}: the rows of Qg and K̂⊙e^G scaled, an exponential a row fewer
                // (G ≥ 16·lb·log2 e ≥ −116 for lb ≥ −5, so 2^G is a normal float; q̂·2^G and k̂·2^G
                // may be subnormal, kept as such — this needs a build without flush-to-zero, which
                // would lose those terms where 2^{G−c0} directly did not)
                const float Fi = ex2f_(a.c0 - G);
                fx[0][r & 1] = qe * Cd;
                fx[1][r & 1] = ke * Cd;
                fx[2][r & 1] = kr[r] * Fi;
                kr[r] = fx[2][r & 1];   // k̂⊙2^{c0−G}: Kr below by one exponential (Gs, kr not kept)
                if (r & 1) {
#pragma unroll
                    for (int i = 0; i < 3; i++) split_bf16(fx[i][0], fx[i][1], fh[i][(r >> 1) & 3], fl[i][(r >> 1) & 3]);
                }
                if ((r & 7) == 7) {   // rows r − 7 .. r: one 16-byte half of each tile's row cch
#pragma unroll
                    for (int i = 0; i < 3; i++) {
                        *prep_fac_row(S.u.fac.T[2 * i], cch, r >> 3) = make_uint4(fh[i][0], fh[i][1], fh[i][2], fh[i][3]);
                        *prep_fac_row(S.u.fac.T[2 * i + 1], cch, r >> 3) = make_uint4(fl[i][0], fl[i][1], fl[i][2], fl[i][3]);
                    }
                }
            }
        }
        if constexpr (EXACT) {
            tree_store<K, 3>(S.u.tree[0], cch, Gs, kr, qr);
            tree_store<K, 2>(S.u.tree[1], cch, Gs, kr, qr);
        }
        a.gl[hc * K + cch] = ex2f_(G);
        uint32_t pk[8];
        if constexpr (!EXACT) {   // Kr = k̂⊙2^{c0−G}·2^{G_last−c0}, the backward chunk kernel's factoring
            const float El = ex2f_(G - a.c0);
#pragma unroll
            for (int r = 0; r < 16; r += 2) pk[r / 2] = pack_bf16(kr[r] * El, kr[r + 1] * El);
        } else {
#pragma unroll
            for (int r = 0; r < 16; r += 2)
                pk[r / 2] = pack_bf16(kr[r] * ex2f_(G - Gs[r]), kr[r + 1] * ex2f_(G - Gs[r + 1]));
        }
        uint4 *dst = reinterpret_cast<uint4 *>(a.KrT + (hc * K + cch) * 16);
        dst[0] = make_uint4(pk[0], pk[1], pk[2], pk[3]);
        dst[1] = make_uint4(pk[4], pk[5], pk[6], pk[7]);
    }
    __syncthreads();

    // L (strict, ×β) and M (inclusive; q already scaled)
    if constexpr (!EXACT) {
        // warps 0, 1: L columns 0–7, 8–15; warps 2, 3: M. Factors as bf16 hi + lo, three
        // products (hi·hi + hi·lo + lo·hi): ~16-bit factors on the tensor cores
        const bf16 (*Xh)[16] = S.u.fac.T[warp < 2 ? 2 : 0], (*Xl)[16] = S.u.fac.T[warp < 2 ? 3 : 1];
        int nt = warp & 1;
        float acc[4] = {}, acc2[4] = {};
#pragma unroll
        for (int j = 0; j < K / 16; j++) {
            // A = X (rows × channels) from Xᵀ; B = A2ᵀ (channels × rows): this warp's n-tile of
            // A2 hi (lanes 0–15) and lo (lanes 16–31) by one ldmatrix, b[0..1] hi, b[2..3] lo
            // (both n-tiles of each and a select of one cost a load and four selects more)
            uint32_t ah[4], al[4], b[4];
            const int ra = 16 * j + (lane & 7) + 8 * (lane >> 4), rb = 16 * j + (lane & 7) + 8 * ((lane >> 3) & 1);
            ldsm_x4_t(ah, (const bf16 *)prep_fac_row(Xh, ra, (lane >> 3) & 1));
            ldsm_x4_t(al, (const bf16 *)prep_fac_row(Xl, ra, (lane >> 3) & 1));
            ldsm_x4_t(b, (const bf16 *)prep_fac_row(S.u.fac.T[lane < 16 ? 4 : 5], rb, nt));
            mma16816(acc, ah, b);
            mma16816(acc2, ah, b + 2);
            mma16816(acc2, al, b);
        }
        int g = lane >> 2, t = lane & 3;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int row = g + 8 * (e >> 1), col = 8 * nt + 2 * t + (e & 1);
            float val = acc[e] + acc2[e];
            if (warp < 2) {
                S.L[row][col] = col < row ? S.beta[row] * val : 0.f;
                if (a.Lx && col < row) a.Lx[hc * KDA_LX + 16 * col + row] = val;   // raw, mirrored (KDA_LX)
            } else {
                S.Mm[row][col] = col <= row ? val : 0.f;
            }
        }
    } else {
        // the tree levels 8, 4, then 2, 1 (kda_tree.cuh), a warp each; the diagonal of M apart
        auto put = [&](int i, int j, float val, bool isq) {
            if (isq) {
                S.Mm[i][j] = val;
            } else {   // i > j
                S.L[i][j] = S.beta[i] * val;
                if (a.Lx) a.Lx[hc * KDA_LX + 16 * j + i] = val;   // raw, mirrored (KDA_LX)
            }
        };
        if (warp < 2) tree_mma<K>(S.u.tree[warp], 3 - warp, lane, put);
        if (tid < 16) S.Mm[tid][tid] = S.qk[tid];
        __syncthreads();
        if (cch < K) {
            tree_store<K, 1>(S.u.tree[0], cch, Gs, kr, qr);
            tree_store<K, 0>(S.u.tree[1], cch, Gs, kr, qr);
        }
        __syncthreads();
        if (warp < 2) tree_mma<K>(S.u.tree[warp], 1 - warp, lane, put);
    }
    __syncthreads();

    // INV = (I + L)^{-1}: column c by forward substitution (4 partial sums per row)
    if (tid < 16) {
        int cc = tid;
        float x[16];
#pragma unroll
        for (int i = 0; i < 16; i++) {
            float p0 = i == cc ? 1.f : 0.f, p1 = 0.f, p2 = 0.f, p3 = 0.f;
#pragma unroll
            for (int j = 0; j < i; j++) {
                float term = -S.L[i][j] * x[j];
                if ((j & 3) == 0) p0 += term;
                else if ((j & 3) == 1) p1 += term;
                else if ((j & 3) == 2) p2 += term;
                else p3 += term;
            }
            x[i] = (p0 + p1) + (p2 + p3);
        }
#pragma unroll
        for (int i = 0; i < 16; i++) S.INV[i][cc] = x[i];
        if (a.Lx)   // INV's column cc below the diagonal (KDA_LX; stores only: no loads on this serial path)
#pragma unroll
            for (int r = 1; r < 16; r++)
                if (r > cc) a.Lx[hc * KDA_LX + 16 * r + cc] = x[r];
    } else if (tid >= 32 && tid < 48 && a.Lx) {   // β and the rows' reciprocal norms (warp 1 is idle)
        const int i = tid - 32;
        a.Lx[hc * KDA_LX + 17 * i] = S.beta[i];
        a.Lx[hc * KDA_LX + 256 + i] = S.rq[i];
        a.Lx[hc * KDA_LX + 272 + i] = S.rk[i];
    }
    // M as bf16 hi [16][16] then lo [16][16]
    if (tid >= 64) {   // four elements a thread (warps 2, 3 while INV runs on warp 0)
        const int e = 4 * (tid - 64);
        const float *m = &S.Mm[e >> 4][e & 15];
        uint2 hi, lo;
        split_bf16(m[0], m[1], hi.x, lo.x);
        split_bf16(m[2], m[3], hi.y, lo.y);
        *reinterpret_cast<uint2 *>(a.M + hc * 512 + e) = hi;
        *reinterpret_cast<uint2 *>(a.M + hc * 512 + 256 + e) = lo;
    }
    __syncthreads();

    // [W | U] = (INV·Diag β) · [K̂⊙e^G | V], the left factor as bf16 hi + lo
    {
        int g = lane >> 2, t = lane & 3;
        uint32_t ah[4], al[4];
        const float *b = S.beta;
        split_bf16(S.INV[g][2 * t] * b[2 * t], S.INV[g][2 * t + 1] * b[2 * t + 1], ah[0], al[0]);
        split_bf16(S.INV[g + 8][2 * t] * b[2 * t], S.INV[g + 8][2 * t + 1] * b[2 * t + 1], ah[1], al[1]);
        split_bf16(S.INV[g][2 * t + 8] * b[2 * t + 8], S.INV[g][2 * t + 9] * b[2 * t + 9], ah[2], al[2]);
        split_bf16(S.INV[g + 8][2 * t + 8] * b[2 * t + 8], S.INV[g + 8][2 * t + 9] * b[2 * t + 9], ah[3], al[3]);
        // 16-column pairs of n-tiles: W's K/16, then U's V/16, a warp every fourth (K/16 is a
        // multiple of the four warps, so whether a pass is W's is known at compile time)
        constexpr int NWP = PREP_THREADS / 32;
        static_assert((K / 16) % NWP == 0 && (V / 16) % NWP == 0, "whole passes per tensor");
#pragma unroll
        for (int ps = 0; ps < (K + V) / 16 / NWP; ps++) {
            const bool isW = ps < K / 16 / NWP;
            const int n0 = 16 * (warp + NWP * (isW ? ps : ps - K / 16 / NWP));
            uint32_t bb[4];
            if (isW)   // ldb_nk2_sm's lanes: rows n0 + 0..15 by lane bits 0–2 and 4, token half by bit 3
                ldsm_x4(bb, (const bf16 *)prep_fac_row(S.KeT, n0 + (lane & 7) + 8 * (lane >> 4), (lane >> 3) & 1));
            else   // [token][channel]: token rows by lane bits 0–3, channels n0 + 8·(lane bit 4)
                ldsm_x4_t(bb, prep_v_row(S.vs, lane & 15, n0 + 8 * (lane >> 4)));
            bf16 *dst = isW ? &S.u.out.W[0][0] : &S.u.out.U[0][0];
            const int ld = isW ? K + 8 : V + 8;
#pragma unroll
            for (int h2 = 0; h2 < 2; h2++) {
                float acc[4] = {};
                mma16816(acc, ah, bb + 2 * h2);
                mma16816(acc, al, bb + 2 * h2);
                const int c0 = n0 + 8 * h2 + 2 * t;
                *reinterpret_cast<uint32_t *>(dst + g * ld + c0) = pack_bf16(acc[0], acc[1]);
                *reinterpret_cast<uint32_t *>(dst + (g + 8) * ld + c0) = pack_bf16(acc[2], acc[3]);
            }
        }
    }
    if (cch < K) {
#pragma unroll
        for (int r = 0; r < 16; r++)
            S.u.out.Qg[r][cch] = __ushort_as_bfloat16((unsigned short)(qgp[r >> 1] >> (16 * (r & 1))));
    }
    __syncthreads();
    {
        // fixed passes of 16-byte pieces (a run-time loop over tid cost ~23 instructions a piece:
        // ncu, session 32); all loads first, then the stores
        static_assert((16 * K / 8) % PREP_THREADS == 0 && (16 * V / 8) % PREP_THREADS == 0, "whole passes");
        constexpr int PK = 16 * K / 8 / PREP_THREADS, PV = 16 * V / 8 / PREP_THREADS;
        const unsigned ut = threadIdx.x;
        uint4 xq[PK], xw[PK], xu[PV];
#pragma unroll
        for (int ps = 0; ps < PK; ps++) {
            const unsigned i = ut + ps * PREP_THREADS, r = i / (K / 8), pc = i % (K / 8);
            xq[ps] = *reinterpret_cast<const uint4 *>(&S.u.out.Qg[r][pc * 8]);
            xw[ps] = *reinterpret_cast<const uint4 *>(&S.u.out.W[r][pc * 8]);
        }
#pragma unroll
        for (int ps = 0; ps < PV; ps++) {
            const unsigned i = ut + ps * PREP_THREADS, r = i / (V / 8), pc = i % (V / 8);
            xu[ps] = *reinterpret_cast<const uint4 *>(&S.u.out.U[r][pc * 8]);
        }
        uint4 *gQ = reinterpret_cast<uint4 *>(a.Qg + hc * 16 * K) + ut, *gW = reinterpret_cast<uint4 *>(a.W + hc * 16 * K) + ut;
        uint4 *gU = reinterpret_cast<uint4 *>(a.U + hc * 16 * V) + ut;
#pragma unroll
        for (int ps = 0; ps < PK; ps++) {
            gQ[ps * PREP_THREADS] = xq[ps];
            gW[ps * PREP_THREADS] = xw[ps];
        }
#pragma unroll
        for (int ps = 0; ps < PV; ps++) gU[ps * PREP_THREADS] = xu[ps];
    }
}

// ---------------------------------------------------------------------------------------
// 2. the serial scan over chunks

struct ScanArgs {
    KSeq sq;
    int H, V, NC, NS, stages;
    const bf16 *W, *Qg, *KrT, *U, *M;
    const float *gl, *S0;
    bf16 *o;
    float *S_out, *ckpt;
    bf16 *Sc, *Vp;   // per-chunk states instead of ckpt (KWs::cstates)
    CSlots cs;       // which chunks keep their state in Sc, and where
    // the two-level scan (fixed-length batches): block (n, h, σ) runs chunks [seg_start(σ),
    // seg_start(σ + 1)) of its sequence, σ = sg0 + blockIdx.x % sgn. mode: SCAN_PLAIN (nseg 1), SCAN_LOCAL (from S = 0,
    // final state to seg_out), SCAN_TRANS (U = 0 from S = I, V = K: the segment's transition
    // to seg_out), SCAN_SEEDED (from seg_S0[σ]; S_out from the last segment), SCAN_FIRST
    // (segment 0 from S0 with output, its final state to seg_out[1]: the forward-only
    // schedule, launch_scan_first). The launch covers segments [sg0, sg0 + sgn) of nseg;
    // segment 0 has seg0c chunks, the others segc (seg_start)
    int mode, nseg, segc, seg0c, sg0, sgn;
    const float *seg_S0;
    float *seg_out;
    ChunkMaps maps;   // the warpgroup step's bulk tensor copies (value tile: U)
};
enum { SCAN_PLAIN = 0, SCAN_LOCAL = 1, SCAN_TRANS = 2, SCAN_SEEDED = 3, SCAN_FIRST = 4 };
// what a scan pass keeps for the backward (a template argument: each kernel has one kind of
// store, whose addresses would otherwise crowd the other's registers): nothing, fp32 states
// every 64 tokens, or every chunk's bf16 state and V' (KWs::cstates)
enum { SCAN_NOCKPT = 0, SCAN_CKPT = 1, SCAN_CSTATES = 2 };

// chunk gc of head h into the stage at shared address st: W, Qg (when needQg), KrT, the value
// slice [vb0, vb0 + VB) of U (when needU), M, gl
template <int K>
__device__ __forceinline__ void scan_load(const ScanArgs &a, const ScanStage &L, const ValuePiece &vp, uint32_t st,
                                          int h, int gc, int vb0, bool needQg, bool needU = true) {
    const size_t hc = (size_t)h * a.NC + gc;
    const bf16 *gv = needU && vp.row >= 0 ? a.U + hc * 16 * a.V + (size_t)vp.row * a.V + vb0 + vp.col : NULL;
    copy_chunk<K>(L, st, a.W + hc * 16 * K, needQg ? a.Qg + hc * 16 * K : NULL, a.KrT + hc * 16 * K, a.M + hc * 512,
                  a.gl + hc * K, vp, gv, 16);
}
// bytes after the pipeline stages: the block's output tile (bf16 [16G][VB+8] when KS = 1;
// KS fp32 partials [16G][VB+4] otherwise) and the V' partials exchanged between the KS warps
// of a value slice (NWV·KS·32 lanes × 8G fp32); G chunks per step
__host__ __device__ inline int scan_fixed_bytes(int VB, int KS, int G) {
    return KS == 1 ? 16 * G * (VB + 8) * 2 : KS * 16 * G * (VB + 4) * 4 + (VB / 16) * KS * 32 * 8 * G * 4;
}

// acc (8 fp32, row-major) += x0 then x1, in order
__device__ __forceinline__ void add8(float (&acc)[2][4], const float4 x0, const float4 x1) {
    acc[0][0] += x0.x; acc[0][1] += x0.y; acc[0][2] += x0.z; acc[0][3] += x0.w;
    acc[1][0] += x1.x; acc[1][1] += x1.y; acc[1][2] += x1.z; acc[1][3] += x1.w;
}
// acc += the 8 fp32 at p (16-byte aligned)
__device__ __forceinline__ void add8(float (&acc)[2][4], const float *p) {
    add8(acc, reinterpret_cast<const float4 *>(p)[0], reinterpret_cast<const float4 *>(p)[1]);
}

__device__ __forceinline__ void named_barrier(int id, int nthreads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(nthreads) : "memory");
}

// One chunk's step with warpgroup MMAs (KS = 1): a warpgroup's four warps hold 64 value rows
// of Sᵀ in the wgmma accumulator layout, which is the mma.sync C-fragment layout of each
// warp's 16 rows, so the state and the helpers are those of the warp-level step; its bf16
// A fragments (state_afrag) are the A operand from registers. [P | Oᵀ] = Sᵀ [W; Qg]ᵀ is one
// chain of K/16 m64n32k16 products, V'ᵀ = Uᵀ − P, then Oᵀ += V'ᵀ Mᵀ (M hi and lo) and
// Sᵀ ← Sᵀ Diag(gl) + V'ᵀ Kr (one m64nKk16 product); the B operands are read by the tensor
// cores from the stage (scan_stage_wg), no ldmatrix. The sums run in another order than the
// warp-level step's (fp32 accumulators either way).
template <int K, bool OUT, int CKPT>
__device__ __forceinline__ void scan_step_wg(const ScanArgs &a, const ScanStage &L, float (*s)[4], uint32_t sst,
                                             const unsigned char *st, bf16 *sO, bf16 *sStg, int warp, int lane, int VB,
                                             int h, int gc, bf16 *sdst, bool zero_u) {
    constexpr int NPO = OUT ? 32 : 16;   // P (tokens 0–15), then Oᵀ's state part
    const int v0 = 16 * warp;            // local value row of the warp
    uint32_t sa[K / 16][4], unused[4];
#pragma unroll
    for (int j = 0; j < K / 16; j++) state_afrag<false>(s[2 * j], s[2 * j + 1], sa[j], unused);
    float po[NPO / 8][4];   // C fragments: P in po[0..1], Oᵀ's state part in po[2..3]
    const uint64_t dwq = wb_desc(sst + L.oW, 16, 1024);   // + (j/4)·4096 + (j%4)·32 bytes, in 16-byte units
    wg_fence();
#pragma unroll
    for (int j = 0; j < K / 16; j++) wg_rs<NPO, 0>(&po[0][0], sa[j], dwq + (uint64_t)((j >> 2) * 256 + (j & 3) * 2), j > 0);
    wg_commit();
    if (CKPT == SCAN_CSTATES && sdst)   // the state entering the chunk (bf16) for the backward
        frag_store_vk_bf16<K>(sa, sStg, sdst + (size_t)(16 * warp + VB * blockIdx.y) * K, K, lane);
    state_decay<K>(s, (const float *)(st + L.ogl), lane);   // while the products run (they read sa, not s)
    // U's tile of the warp's 16 values × 16 tokens by one ldmatrix.trans from the swizzled
    // slice (value v, token r at block v/64, row r, 16-byte chunk ((v%64)/8) ^ (r%8))
    uint32_t u[4];
    ldsm_x4_t(u, wg_val_tile(st + L.oVal, v0, lane));
    wg_wait<0>();
    float vp[2][4];
    vprime_from_u(po, u, vp, zero_u);
    uint32_t av[4];
    tok_afrag(vp, av, 1.f);
    if (CKPT == SCAN_CSTATES)   // the chunk's V' (bf16) for the backward
        store_tok_tile(vp, sStg, a.Vp + ((size_t)h * a.NC + gc) * 16 * a.V, a.V, VB * blockIdx.y + v0, lane);
    float om[2][4];   // V'ᵀ Mᵀ
    wg_fence();
    if (OUT) {
        wg_rs<16, 0>(&om[0][0], av, wb_desc_sw32(sst + L.oM, 256), 0);
        wg_rs<16, 0>(&om[0][0], av, wb_desc_sw32(sst + L.oM + 512, 256), 1);
        wg_commit();
    }
    wg_rs<K, 0>(&s[0][0], av, wb_desc_sw32(sst + L.oKrT, 256), 1);
    wg_commit();
    if (OUT) {
        wg_wait<1>();
        float o[2][4];
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) o[nt][e] = po[2 + nt][e] + om[nt][e];
        store_acc_rows<2>(sO, VB + 8, v0, o, lane);
    }
    wg_wait<0>();
}

// grid (N·H·sgn, V/VB), block (VB/16)·KS warps (WG: + a producer warpgroup); OUT: write o and
// S_out; CKPT: what the backward keeps.
// Warp w owns value rows v0 .. v0+15 (v0 = vb0 + 16·(w / KS)) and, when KS > 1, only the
// state columns kp0 .. kp0 + K/KS − 1 (kp0 = (w % KS)·K/KS): the KS warps of a value slice
// add their partial Sᵀ Wᵀ through shared memory (a named barrier per slice), each then has
// V' and updates its own columns; the partial outputs are added when o is written. KS > 1
// shortens each warp's serial chain per chunk, for shapes with few (sequence, head) pairs.
// G = KDA_SEG: a step takes a whole 64-token group, W and U being the merged W~, U~
// (kda_merge.cu): the group's four V' come from one product with the state, then each chunk's
// output and state update in turn (the update no longer waits on the next chunk's V').
// WG (KS = 1, G = 1, whole warpgroups): the step's products as warpgroup MMAs (scan_step_wg).
template <int K, bool SPLIT, bool OUT, int CKPT, int KS, int G, bool WG>
__global__ void __launch_bounds__(WG ? 384 : 256, OUT || WG ? 1 : 2) kda_scan_kernel(const __grid_constant__ ScanArgs a) {
    static_assert(!WG || (KS == 1 && G == 1 && !SPLIT), "the warpgroup step holds whole state rows, one chunk a step");
    constexpr int KP = K / KS;
    extern __shared__ __align__(16) unsigned char smem_dyn[];
    // the warpgroup step's stages are 1024-byte aligned (the swizzle atoms of its copies)
    unsigned char *smem_raw = WG ? smem_dyn + ((1024 - ((uint32_t)__cvta_generic_to_shared(smem_dyn) & 1023)) & 1023) : smem_dyn;
    const int sg = a.sg0 + blockIdx.x % a.sgn, nhx = blockIdx.x / a.sgn;
    int n = nhx / a.H, h = nhx % a.H;
    // WG: one more warpgroup, the last, gives its registers to the others and fills the stages
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, NW = (blockDim.x >> 5) - (WG ? 4 : 0);
    int vs = warp / KS, ks = warp % KS, kp0 = ks * KP;
    int VB = 16 * (NW / KS), vb0 = blockIdx.y * VB, v0 = vb0 + 16 * vs;
    ScanStage L = WG ? scan_stage_wg(K, VB) : scan_stage(K, VB);
    const int NSt = a.stages, SB = G * L.bytes;   // a stage holds G chunks
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(smem_raw);
    bf16 *sO = (bf16 *)(smem_raw + NSt * SB);                      // KS = 1: [16G][VB+8]
    float *sOp = (float *)(smem_raw + NSt * SB);                   // KS > 1: [KS][16G][VB+4]
    float *sRed = sOp + KS * 16 * G * (VB + 4);                    // KS > 1: [NW][32][8G]
    bf16 *sStg = (bf16 *)(smem_raw + NSt * SB + scan_fixed_bytes(VB, KS, G)) + warp * (cstate_stage_bytes<KP>() / 2);
    int nc_n = a.sq.nchunks(n), cbase = a.sq.chunk0(n), len_n = a.sq.seq_len(n);
    long long bos = a.sq.seq_bos(n);
    size_t nh = (size_t)n * a.H + h;
    // this block's chunks [c0, nc)
    const int c0 = a.nseg > 1 ? min(nc_n, seg_start(sg, a.segc, a.seg0c)) : 0,
              nc = a.nseg > 1 ? min(nc_n, seg_start(sg + 1, a.segc, a.seg0c)) : nc_n;
    const bool zero_u = a.mode == SCAN_TRANS;
    // WG: per stage a full barrier (the copies' bytes) and an empty one (a consumer warp's
    // arrival each), after the block's fixed shared memory
    const uint32_t bars = sbase + NSt * SB + scan_fixed_bytes(VB, KS, G) + (CKPT == SCAN_CSTATES ? NW * cstate_stage_bytes<KP>() : 0);
    if constexpr (WG) {
        if (!wg_ring_start(bars, NSt, NW, nc - c0, [&](int i, int st) {   // chunk c0 + i
                const int hc = h * a.NC + cbase + c0 + i;
                chunk_load_wg<K, false, OUT>(a.maps, L, sbase + st * SB, bars + 16 * st, hc, VB, vb0, 16 * hc, 0, !zero_u);
            }))
            return;
    }

    float s[KP / 8][4];
    if (a.mode == SCAN_TRANS) {   // S = I (the value index runs over K here)
        const int g = lane >> 2, t = lane & 3;
#pragma unroll
        for (int nt = 0; nt < KP / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[nt][e] = kp0 + 8 * nt + 2 * t + (e & 1) == v0 + g + 8 * (e >> 1) ? 1.f : 0.f;
    } else {
        const float *S0 = a.mode == SCAN_SEEDED ? a.seg_S0 + (nh * a.nseg + sg) * K * a.V
                          : a.mode == SCAN_LOCAL ? NULL : a.S0 ? a.S0 + nh * K * a.V : NULL;
        frag_load_kv<KP>(s, S0 ? S0 + (size_t)kp0 * a.V : NULL, a.V, v0, lane);
    }

    // the step from chunk cs: its (up to) G chunks into stage buf
    const ValuePiece vpc = value_piece(L, VB);
    auto load_step = [&](int buf, int cs) {
#pragma unroll
        for (int j = 0; j < G; j++)
            if (cs + j < nc)
                scan_load<K>(a, L, vpc, sbase + buf * SB + j * L.bytes, h, cbase + cs + j, vb0, OUT, !zero_u);
    };
    int phase = 0;   // WG: of this step's full barrier; flips as the stage ring wraps
    if (!WG) {
        for (int st = 0; st < NSt - 1; st++) {
            if (c0 + st * G < nc) load_step(st, c0 + st * G);
            cp_async_commit();
        }
    }
    // stages: this step's (rd) and the one refilled in it (wr, the previous step's)
    for (int c = c0, rd = 0, wr = NSt - 1; c < nc; c += G, rd = rd + 1 == NSt ? 0 : rd + 1, wr = wr + 1 == NSt ? 0 : wr + 1) {
        const int cn = c + (NSt - 1) * G;
        // one block barrier per step: past it, this step's stage has landed for every thread
        // and every warp is done with the previous step's stage, which the copies issued next
        // refill (and, KS > 1, with the output partials). A KS = 1 warp writes its own output
        // columns, so no second barrier is needed after the step.
        if (WG) {   // no block barrier: the stage's copies have landed; the producer waits for its release
            mb_wait(bars + 16 * rd, phase);
            if (rd == NSt - 1) phase ^= 1;
        } else {
            cp_async_wait_n(NSt - 2);
            __syncthreads();
            if (cn < nc) load_step(wr, cn);
            cp_async_commit();
        }
        unsigned char *st = smem_raw + rd * SB;
        const int nsub = min(G, nc - c);
        if (CKPT == SCAN_CKPT && (c % KDA_SEG) == 0)
            frag_store_vk<KP>(s, a.ckpt + ((size_t)h * a.NS + a.sq.seg0(n) + c / KDA_SEG) * a.V * K + kp0, v0, lane, K);
        // the tile of the state entering chunk c, where it is kept for the backward (CSlots)
        bf16 *sdst = CKPT == SCAN_CSTATES && a.cs.keep_state(cbase + c, c)
                         ? a.Sc + ((size_t)h * a.cs.n + a.cs.state_slot(cbase + c, n)) * a.V * K : NULL;
        if constexpr (WG) {
            scan_step_wg<K, OUT, CKPT>(a, L, s, sbase + rd * SB, st, sO, sStg, warp, lane, VB, h, cbase + c, sdst, zero_u);
            wg_ring_release(bars, rd, lane);
        } else {
        if (CKPT == SCAN_CSTATES && sdst)   // the state entering the chunk (bf16) for the backward
            frag_store_vk_bf16<KP>(s, sStg, sdst + (size_t)v0 * K + kp0, K, lane);
        // V' of the step's chunks (a chunk past the sequence's end computes garbage, unused)
        float vp[G][2][4];
        {
            float pp[G][2][4] = {};
            if (G == 1) {
                state_times_tile<KP, SPLIT>(s, (const bf16 *)(st + L.oW) + kp0, lane, pp[0], KDA_LDK(K));
            } else {
                const bf16 *Xs[G];
#pragma unroll
                for (int j = 0; j < G; j++) Xs[j] = (const bf16 *)(st + j * L.bytes + L.oW) + kp0;
                state_times_tiles<KP, SPLIT, G>(s, Xs, lane, pp, KDA_LDK(K));
            }
            if (KS > 1) {
                // [warp][2G][32 lanes] float4: a warp's stores and loads are 512 contiguous bytes
                float4 *mine = reinterpret_cast<float4 *>(sRed) + (size_t)warp * 2 * G * 32 + lane;
#pragma unroll
                for (int j = 0; j < G; j++) {
                    mine[64 * j] = make_float4(pp[j][0][0], pp[j][0][1], pp[j][0][2], pp[j][0][3]);
                    mine[64 * j + 32] = make_float4(pp[j][1][0], pp[j][1][1], pp[j][1][2], pp[j][1][3]);
                }
                named_barrier(1 + vs, 32 * KS);
#pragma unroll
                for (int j = 0; j < G; j++) {   // fixed order: every warp of the slice gets the same V'
#pragma unroll
                    for (int nt = 0; nt < 2; nt++)
#pragma unroll
                        for (int e = 0; e < 4; e++) pp[j][nt][e] = 0.f;   // this warp's part is in sRed
#pragma unroll
                    for (int i = 0; i < KS; i++) {
                        const float4 *x = reinterpret_cast<const float4 *>(sRed) + (size_t)(vs * KS + i) * 2 * G * 32 + 64 * j + lane;
                        add8(pp[j], x[0], x[32]);
                    }
                }
            }
#pragma unroll
            for (int j = 0; j < G; j++)
                vprime_from(pp[j], (const bf16 *)(st + j * L.bytes + L.oVal), VB + 8, 16 * vs, lane, vp[j], zero_u);
        }
#pragma unroll
        for (int j = 0; j < G; j++) {
            if (j >= nsub) break;
            const unsigned char *sj = st + j * L.bytes;
            const bf16 *sQ = (const bf16 *)(sj + L.oQg), *sK = (const bf16 *)(sj + L.oKrT), *sM = (const bf16 *)(sj + L.oM);
            const float *sgl = (const float *)(sj + L.ogl);
            uint32_t av[4];
            tok_afrag(vp[j], av, 1.f);
            if (CKPT == SCAN_CSTATES && (KS == 1 || ks == 0))   // the chunk's V' (bf16) for the backward
                store_tok_tile(vp[j], sStg, a.Vp + ((size_t)h * a.NC + cbase + c) * 16 * a.V, a.V, v0, lane);
            if (OUT) {
                float o[2][4];
                int g = lane >> 2, t = lane & 3;
                scan_out<KP, SPLIT>(s, sQ + kp0, sM, av, lane, o, KS == 1 || ks == 0, KDA_LDK(K));   // M's term once per slice
                if (KS == 1) {
                    store_acc_rows<2>(sO + 16 * j * (VB + 8), VB + 8, 16 * vs, o, lane);
                } else {
                    float *op = sOp + (size_t)ks * 16 * G * (VB + 4);
#pragma unroll
                    for (int nt = 0; nt < 2; nt++)
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            op[(16 * j + 8 * nt + 2 * t + (e & 1)) * (VB + 4) + 16 * vs + g + 8 * (e >> 1)] = o[nt][e];
                }
            }
            scan_update<KP>(s, av, sK + kp0 * KDA_LD16, sgl + kp0, lane);
        }
        }
        if (KS == 1 && OUT && a.o) {   // this warp's 16 value columns of the step's rows: 32 bytes a row
            __syncwarp();
            const int len = min(16 * G, len_n - 16 * c);
            for (int i = lane; i < 2 * len; i += 32) {
                const int r = i >> 1, hf = i & 1;
                bf16 *dst = a.o + ((size_t)(bos + 16 * c + r) * a.H + h) * a.V + v0 + 8 * hf;
                *reinterpret_cast<uint4 *>(dst) = *reinterpret_cast<const uint4 *>(sO + r * (VB + 8) + 16 * vs + 8 * hf);
            }
        }
        if (KS > 1) __syncthreads();
        if (KS > 1 && OUT && a.o) {
            int len = min(16 * G, len_n - 16 * c);
            for (int i = tid; i < len * VB / 8; i += blockDim.x) {
                int r = i / (VB / 8), pc = i % (VB / 8);
                bf16 *dst = a.o + ((size_t)(bos + 16 * c + r) * a.H + h) * a.V + vb0 + pc * 8;
                float acc[2][4] = {};
#pragma unroll
                for (int j = 0; j < KS; j++) add8(acc, sOp + ((size_t)j * 16 * G + r) * (VB + 4) + pc * 8);
                uint4 u;
                u.x = pack_bf16(acc[0][0], acc[0][1]); u.y = pack_bf16(acc[0][2], acc[0][3]);
                u.z = pack_bf16(acc[1][0], acc[1][1]); u.w = pack_bf16(acc[1][2], acc[1][3]);
                *reinterpret_cast<uint4 *>(dst) = u;
            }
        }
    }
    if (!WG) cp_async_wait<0>();
    if (a.mode == SCAN_LOCAL || a.mode == SCAN_TRANS || a.mode == SCAN_FIRST)   // FIRST: segment 1's initial state
        frag_store_kv<KP>(s, a.seg_out + (nh * a.nseg + sg + (a.mode == SCAN_FIRST)) * K * a.V + (size_t)kp0 * a.V, a.V, v0,
                          lane);
    else if (OUT && a.S_out && sg == a.nseg - 1)
        frag_store_kv<KP>(s, a.S_out + nh * K * a.V + (size_t)kp0 * a.V, a.V, v0, lane);
}

// The two-level scans' carry, serial over a sequence's segments: S_start(0) = S0 (or 0),
// S_start(σ+1) = A(σ) S_start(σ) + L(σ), written to segS0 [N·H·nseg, K, V] (from segment it0:
// S_start(it0) read at S0 + (sequence, head)·s0_stride — the forward-only schedule starts at 1
// from segS0 itself); REV (the
// backward): from the last segment down, dS_end(last) = dS_out, dS_end(σ−1) = A(σ)ᵀ dS_end(σ)
// + L(σ). Block: one (sequence, head) and CW value columns, 256 threads; a thread holds 4 rows
// × TC adjacent columns of the state in registers (rows 4g .. 4g + 3 for REV, g + K/4·i
// otherwise: either way a warp's 16-byte reads of A fall in distinct banks). fp32, each sum
// over A's columns (rows, REV) in order from L. The transitions do not depend on the carried
// state, so the next segment's A is copied into the other of two shared-memory buffers while
// this one's product runs. CW (carry_cw): the widest that still gives about a block per SM —
// wide blocks read each A once for more columns. (Session 12: 32 columns per block with A staged
// 32 columns at a time; then 8 columns and one thread per column, 4 rows each, with 16 blocks per
// (sequence, head): four waves of blocks at the small preset's B4 shape.)
template <int K> __host__ __device__ constexpr int carry_lda() { return K + 4; }   // 16-byte rows
// TC adjacent floats (TC-aligned) in one vector access
template <int TC> __device__ __forceinline__ void ld_cols(float (&x)[TC], const float *p) {
    if constexpr (TC == 4) {
        const float4 v = *reinterpret_cast<const float4 *>(p);
        x[0] = v.x; x[1] = v.y; x[2] = v.z; x[3] = v.w;
    } else if constexpr (TC == 2) {
        const float2 v = *reinterpret_cast<const float2 *>(p);
        x[0] = v.x; x[1] = v.y;
    } else {
        x[0] = *p;
    }
}
template <int TC> __device__ __forceinline__ void st_cols(float *p, const float (&x)[TC]) {
    if constexpr (TC == 4) *reinterpret_cast<float4 *>(p) = make_float4(x[0], x[1], x[2], x[3]);
    else if constexpr (TC == 2) *reinterpret_cast<float2 *>(p) = make_float2(x[0], x[1]);
    else *p = x[0];
}
template <int K> constexpr int carry_smem(int cw) { return (2 * K * carry_lda<K>() + K * (cw + 4)) * 4; }
template <int K, int CW, bool REV>
__global__ void __launch_bounds__(256) kda_seg_carry_kernel(const float *S0, size_t s0_stride, const float *segA,
                                                            const float *segL, float *segS0, int V, int nseg, int it0) {
    constexpr int LDA = carry_lda<K>(), NCG = 1024 / K, TC = CW / NCG, LDS = CW + 4, RG = K / 4;
    static_assert(TC == 1 || TC == 2 || TC == 4, "a thread holds 1, 2 or 4 columns");
    extern __shared__ __align__(16) float carry_smem_raw[];
    float *sA0 = carry_smem_raw, *sS = carry_smem_raw + 2 * K * LDA;   // sS [K][LDS]
    const size_t nh = blockIdx.x;
    const int tid = threadIdx.x, g = tid / NCG, cl = TC * (tid % NCG), c = CW * blockIdx.y + cl;
    auto row = [&](int i) { return REV ? 4 * g + i : g + RG * i; };
    auto seg_of = [&](int it) { return nh * nseg + (REV ? nseg - 1 - it : it); };
    // A(σ) as stored, [K][K] in rows of LDA floats, by 16-byte copies
    auto copy_A = [&](int it) {
        const float *A = segA + seg_of(it) * K * K;
        float *dst = sA0 + (it & 1) * K * LDA;
        for (int i = tid; i < K * K / 4; i += 256) cp_async16(dst + (i / (K / 4)) * LDA + 4 * (i % (K / 4)), A + 4 * i);
        cp_async_commit();
    };
    float st[4][TC];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (S0) ld_cols<TC>(st[i], S0 + nh * s0_stride + (size_t)row(i) * V + c);
        else
#pragma unroll
            for (int t = 0; t < TC; t++) st[i][t] = 0.f;
    }
    if (it0 < nseg - 1) copy_A(it0);
    for (int it = it0; it < nseg; it++) {
        const size_t seg = seg_of(it);
#pragma unroll
        for (int i = 0; i < 4; i++) st_cols<TC>(segS0 + seg * K * V + (size_t)row(i) * V + c, st[i]);
        if (it == nseg - 1) break;
#pragma unroll
        for (int i = 0; i < 4; i++) st_cols<TC>(sS + row(i) * LDS + cl, st[i]);
        const float *Lm = segL + seg * K * V;
        float acc[4][TC];
#pragma unroll
        for (int i = 0; i < 4; i++) ld_cols<TC>(acc[i], Lm + (size_t)row(i) * V + c);
        if (it + 1 < nseg - 1) {   // the next product's A, into the other buffer
            copy_A(it + 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();   // this A has landed and sS holds S_start, for every thread
        const float *sA = sA0 + (it & 1) * K * LDA;
#pragma unroll 2
        for (int m = 0; m < K; m += 4) {
            float a[4][4], x[4][TC];   // a[i][j]: the coefficient of row(i) and m + j
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const float4 v = *reinterpret_cast<const float4 *>(REV ? sA + (m + j) * LDA + 4 * g : sA + row(j) * LDA + m);
                if (REV) { a[0][j] = v.x; a[1][j] = v.y; a[2][j] = v.z; a[3][j] = v.w; }
                else { a[j][0] = v.x; a[j][1] = v.y; a[j][2] = v.z; a[j][3] = v.w; }
                ld_cols<TC>(x[j], sS + (m + j) * LDS + cl);
            }
#pragma unroll
            for (int j = 0; j < 4; j++)
#pragma unroll
                for (int i = 0; i < 4; i++)
#pragma unroll
                    for (int t = 0; t < TC; t++) acc[i][t] += a[i][j] * x[j][t];
        }
        __syncthreads();   // every thread is done with sS and this A (refilled two segments on)
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int t = 0; t < TC; t++) st[i][t] = acc[i][t];
    }
}

// columns per carry block (KDA_CARRY_CW overrides: 8, 16 or 32 at K = 128; 16, 32 or 64 at 64):
// the widest whose blocks still cover two thirds of the SMs
static int carry_cw(const kda_params *p) {
    const int lo = 1024 / p->K, forced = getenv("KDA_CARRY_CW") ? atoi(getenv("KDA_CARRY_CW")) : 0;
    if (forced == lo || forced == 2 * lo || forced == 4 * lo) return forced;
    const long long pairs = (long long)p->N * p->H;
    for (int cw = 4 * lo; cw > lo; cw /= 2)
        if (pairs * (p->V / cw) * 3 >= 2LL * kda_num_sms()) return cw;
    return lo;
}

template <int K, int CW, bool REV>
static cudaError_t launch_carry(const kda_params *p, const KWs &w, bool from1) {
    const dim3 grid((unsigned)(p->N * p->H), p->V / CW);
    const int smem = carry_smem<K>(CW);
    cudaError_t e = cudaFuncSetAttribute(kda_seg_carry_kernel<K, CW, REV>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
    const size_t kv = (size_t)K * p->V;
    kda_seg_carry_kernel<K, CW, REV><<<grid, 256, smem, p->stream>>>(
        from1 ? w.segS0 + kv : REV ? p->dS_out : p->S0, from1 ? w.nseg * kv : kv, w.segA, w.segL, w.segS0, p->V, w.nseg,
        from1 ? 1 : 0);
    return cudaGetLastError();
}

template <int K, bool REV>
static cudaError_t launch_carry_k(const kda_params *p, const KWs &w, bool from1) {
    const int cw = carry_cw(p) / (1024 / K);   // 1, 2 or 4 columns a thread
    if (cw == 4) return launch_carry<K, 4096 / K, REV>(p, w, from1);
    if (cw == 2) return launch_carry<K, 2048 / K, REV>(p, w, from1);
    return launch_carry<K, 1024 / K, REV>(p, w, from1);
}

cudaError_t kda_seg_carry(const kda_params *p, const KWs &w, bool rev, bool from1) {
    if (rev && from1) return cudaErrorInvalidValue;
    if (p->K == 64) return rev ? launch_carry_k<64, true>(p, w, false) : launch_carry_k<64, false>(p, w, from1);
    return rev ? launch_carry_k<128, true>(p, w, false) : launch_carry_k<128, false>(p, w, from1);
}

// ---------------------------------------------------------------------------------------
// host side

cudaError_t kda_check_params(const kda_params *p) {
    if (!p || p->N < 0 || p->T < 0 || p->H <= 0) return cudaErrorInvalidValue;
    if (!((p->K == 64 || p->K == 128) && (p->V == 64 || p->V == 128))) return cudaErrorInvalidValue;
    if (p->gate_mode != 0 && p->gate_mode != 1) return cudaErrorInvalidValue;
    if (p->gate_mode == 0 && !(p->lb >= -5.f && p->lb < 0.f)) return cudaErrorInvalidValue;
    if (!p->ws && !p->ws_fwd) return cudaErrorInvalidValue;
    if (((uintptr_t)p->q | (uintptr_t)p->k | (uintptr_t)p->v | (uintptr_t)p->f) % 16) return cudaErrorMisalignedAddress;
    // the two-level scans' carry reads the initial state and dS_out by 16-byte vectors
    if (((uintptr_t)p->S0 | (uintptr_t)p->dS_out) % 16) return cudaErrorMisalignedAddress;
    return cudaSuccess;
}

static int env_int(const char *name, int dflt) {
    const char *s = getenv(name);
    return s && *s ? atoi(s) : dflt;
}
static int scan_split(void) { return env_int("KDA_SPLIT", 0); }
// the forward scan's step as warpgroup MMAs where a block's warps are whole warpgroups holding
// whole state rows (KS = 1, 16-token steps); KDA_SCAN_WG=0: the warp-level step
int kda_scan_wg(void) { return env_int("KDA_SCAN_WG", 1); }
// the two-level scans' passes without output (forward: local, transitions; backward: local) on
// the warpgroup step too (KDA_SCAN_WG_SEGS=0: the warp-level step, two blocks per SM)
int kda_scan_wg_segs(void) { return env_int("KDA_SCAN_WG_SEGS", 1); }
// whether a forward scan pass of ks-way blocks of nw value-slice warps takes the warpgroup step
// (launch_scan_ks): whole warpgroups holding whole state rows, one chunk a step; out = false, a
// pass without output (the two-level scan's local and transition passes), only under
// KDA_SCAN_WG_SEGS. The forward-only schedule (scan_first_plan) is planned on the same rule
static bool scan_wg_step(const kda_params *p, int ks, int nw, bool out) {
    return ks == 1 && nw % 4 == 0 && !scan_split() && kda_scan_group(p) == 1 && kda_scan_wg() && (out || kda_scan_wg_segs());
}

// Few (sequence, head) pairs of long fixed-length sequences: a scan block per pair with all
// its value rows (eight warps at V = 128, each with the state's columns whole), and the
// two-level scan cutting each sequence into segments to fill the SMs: every chunk load then
// serves the whole head. Only when the sequences are long enough for one block per SM per
// pass (segments of at least 32 chunks). H200 (session 9, bench_kda variants): B2·T16384·H16
// scan 1.289 → 1.176 ms, state-gradient scan 1.718 → 1.193; B1·T65536·H32 5.12 → 4.44 and
// 6.77 → 4.49; at B1·T4096·H8, where the segments would be cut short, 0.270 → 0.274 and
// 0.284 → 0.329 (hence the length condition).
// Also whenever the pairs alone fill two thirds of the SMs or more (no segments then): every
// chunk load serves eight warps instead of four. Session 27 (H200, bench_kda --quick, four-warp
// blocks of half a head → eight-warp blocks of a whole head, forward / forward + backward in
// ms): B1·T8192·H96 1.418 / 6.20 → 1.345 / 5.88, B2·T2048·H48 0.380 / 1.587 → 0.363 / 1.525,
// B1·T8192·H128 1.614 / 7.82 → 1.546 / 7.30, B8·T2048·H32 0.847 / 3.97 → 0.795 / 3.63,
// B4·T4096·H64 1.604 / 7.91 → 1.546 / 7.24; at 64 pairs (B4·T2048·H16, half the SMs idle)
// it was slower, 0.257 / 1.08 → 0.304 / 1.21.
// Packed batches too, by the first rule only (their lengths are on the device). Session 39
// (H200, bench/bench_flashkda.py --split --bwd, 8,192 packed tokens at 96 heads, four-warp →
// eight-warp blocks in one call): lengths 1300, 547, 2048, 963, 271, 3063 scan 0.507 → 0.361 ms,
// forward 1.137 → 1.001, forward + backward 4.47 → 3.98–4.00; 8 × 1024 scan 0.517 → 0.348–0.360,
// forward 1.214 → 1.022–1.040 (fixed-length B8·T1024·H96: scan 0.362–0.367, forward 0.97–1.02).
static bool scan_whole_heads(const kda_params *p) {
    if (p->N <= 0 || p->T <= 0 || p->V > 128) return false;
    const long long pairs = (long long)p->N * p->H, sms = kda_num_sms(), want = sms / pairs;
    if (3 * pairs >= 2 * sms) return true;
    if (p->cu_seqlens) return false;
    const int most = (p->T + KDA_C - 1) / KDA_C / (8 * KDA_SEG);
    return want >= 3 && most >= want;
}

// value-slice warps per scan block, each with ks − 1 partners (ks = 1: the backward's scans)
int kda_scan_warps(const kda_params *p, int ks) {
    int maxw = p->V / 16, nw = p->scan_warps ? p->scan_warps : env_int("KDA_SCAN_WARPS", 0);
    if (nw > 0) {   // asked for: a divisor of the slices, at most 8 warps in all
        while (maxw % nw) nw--;
        while (nw * ks > 8) nw >>= 1;
        return nw;
    }
    // four warps in all: the chunk loads are shared by a block's warps, and the cost of a
    // step is mostly their issue — fewer warps per block (more blocks) lost at every
    // benchmark shape, even when a block per SM was left idle (bench/RESULTS.md, session 7).
    // Eight (a whole head at V = 128) where scan_whole_heads says so — pairs enough to fill
    // two thirds of the SMs, or few long sequences — and for the 64-token steps, which load
    // 4x the bytes per step
    nw = (kda_scan_group(p) > 1 || scan_whole_heads(p) ? 8 : 4) / ks;
    return maxw < nw ? maxw : nw;
}

// warps sharing one 16-wide value slice of the forward scan (state columns split KS ways):
// KDA_SCAN_KS = 1, 2 or 4; 1 for whole-head blocks and the 64-token steps; else 2 when there
// are under 512 slices (measured: 3–6% faster at 256 slices, slower at 768 and above; 4 was
// slower everywhere)
int kda_scan_ks(const kda_params *p) {
    int ks = env_int("KDA_SCAN_KS", 0);
    if (ks == 1 || ks == 2 || ks == 4) return ks;
    if (kda_scan_group(p) > 1 || scan_whole_heads(p)) return 1;
    long long slices = (long long)p->N * p->H * (p->V / 16);
    return slices < 512 ? 2 : 1;
}

// Time segments of the forward scan (the two-level scan): the plain scan has one block per
// (sequence, head, value slice), each serial over all its chunks, so with few of them most
// SMs idle. Cutting each sequence into nseg segments gives nseg× the blocks for three passes
// of the chunk work: per segment the state from zero (local) and the K × K transition from I,
// a short serial carry over the segments, then the scan again from each segment's true
// initial state. An SM runs a second or third scan block at only ~1.9× the rate of one
// (H200, bench_kda, session 8: forced on at 128–192 blocks it was 1.5–1.9× slower), so the
// passes pay only when the plain scan leaves two thirds of the SMs idle: then two blocks per
// SM per pass (the warpgroup passes, which take one block per SM, run them in two waves —
// session 37) (session 9, whole-head blocks, B2·T16384·H16 scan 1.174 → 1.079 ms and state-
// gradient scan 1.201 → 1.096 with 8 segments instead of 4; 6 segments, a wave and a half,
// were slower than 4), segments of at least 8 checkpoint groups (32 chunks). KDA_SCAN_SEGS
// overrides (1 = off). Fixed-length batches only (packed ones keep the plain scan).
int kda_scan_segs(const kda_params *p) {
    if (p->cu_seqlens || p->N <= 0 || p->T <= 0) return 1;
    const int nc = (p->T + KDA_C - 1) / KDA_C, forced = env_int("KDA_SCAN_SEGS", 0);
    int nseg = forced;
    if (nseg <= 0) {
        const int ks = kda_scan_ks(p), nw = kda_scan_warps(p, ks);
        const long long blocks = (long long)p->N * p->H * (p->V / (16 * nw)), sms = kda_num_sms();
        nseg = 3 * blocks > sms ? 1 : (int)(2 * sms / blocks);
        const int most = nc / (8 * KDA_SEG);
        if (nseg > most) nseg = most;
    }
    if (nseg <= 1) return 1;
    const int segc = seg_chunks(nc, nseg);
    return (nc + segc - 1) / segc;
}

// The forward-only schedule (launch_scan_first): segment 0, of seg0c chunks, runs its output
// pass beside the local and transition passes of segments 1 .. nseg − 2, then the seeded pass
// runs segments 1 .. nseg − 1 in one wave of blocks: nseg − 1 ≤ SMs / (blocks a segment)
// (KDA_SCAN_SEGS forced: that many), and never more segments than the uniform layout's. Segment 0 is KDA_SCAN_SEG0 % (default 150) of the
// others' length, so that it ends with the second wave of local and transition blocks on the
// SMs it leaves (its steps have output and cost more). Only where the scans take a block
// per SM (the warpgroup passes); KDA_SCAN_FIRST=0 keeps the uniform schedule.
static void scan_first_plan(const kda_params *p, int *nseg, int *segc, int *seg0c) {
    if (!env_int("KDA_SCAN_FIRST", 1)) return;
    const int ks = kda_scan_ks(p), nw = kda_scan_warps(p, ks);
    if (!scan_wg_step(p, ks, nw, false)) return;   // its passes with and without output on the warpgroup step
    const int nc = (p->T + KDA_C - 1) / KDA_C, forced = env_int("KDA_SCAN_SEGS", 0);
    const long long blocks = (long long)p->N * p->H * (p->V / (16 * nw));
    const int m = forced > 0 ? forced - 1 : (int)(kda_num_sms() / blocks);   // segments after the first
    const int r = env_int("KDA_SCAN_SEG0", 150);
    if (m < 2 || r < 100) return;
    int sc = (int)(((long long)nc * 100 / (r + 100LL * m) + KDA_SEG - 1) / KDA_SEG * KDA_SEG);
    if (sc < (forced > 0 ? KDA_SEG : 8 * KDA_SEG)) return;   // as kda_scan_segs: at least 32 chunks
    int s0 = (nc - m * sc + KDA_SEG - 1) / KDA_SEG * KDA_SEG;
    if (s0 <= sc) return;
    const int n = 1 + (nc - s0 + sc - 1) / sc;
    if (n < 3 || n > *nseg) return;   // never more segment buffers than the uniform layout's
    *nseg = n; *segc = sc; *seg0c = s0;
}

// Chunks per scan step. One chunk (the default): each step's V' = U − W S waits on the
// previous step's state update, a chain of dependent tensor-core products. KDA_SEG
// (KDA_SCAN_GROUP=4, opt-in): 64-token steps over the merged W~, U~ of kda_merge.cu — one
// product with the state gives the group's four V', and the four updates follow without
// waiting on each other's V'. The scans themselves are faster (H200, session 9, whole-head
// blocks: B1·T65536·H32 scan 4.44 → 3.43 ms, state-gradient scan 4.49 → 3.99), but the merge
// kernel costs more than they gain (1.44 ms there: it writes W~, U~ beside W, U, which the
// backward's chunk kernels still need), at every benchmark shape (bench/RESULTS.md).
int kda_scan_group(const kda_params *p) {
    (void)p;
    const int forced = env_int("KDA_SCAN_GROUP", 0);
    return forced == KDA_SEG ? KDA_SEG : 1;
}

// What the backward keeps of the forward's states. Per chunk (the default): the scan writes
// the bf16 state entering each chunk and its V', the state-gradient scan each chunk's dS' and
// dV', and the products that contract over the value dimension (dQg, dW, dKr, dgl, dM) run
// chunk-parallel from them: the forward's own bf16 S and V' (the same gradients as the
// checkpoint path, bit for bit, wherever the forward scan holds whole state rows, KS = 1).
// Otherwise (KDA_CSTATES=0, the experimental hi + lo state split, 64-token steps, whose
// state-gradient scan has no per-chunk dS'): fp32 checkpoints every 64 tokens, from which a
// kernel per 64-token segment recomputes the four states and state gradients serially (less
// memory, more time: B1·T8192·H96 forward + backward 6.22 → 6.62 ms; bench/RESULTS.md, session 27).
int kda_chunk_states(const kda_params *p) {
    return !scan_split() && kda_scan_group(p) == 1 && env_int("KDA_CSTATES", 1) != 0;
}
int kda_vgroup(void) {
    const int g = env_int("KDA_VGROUP", 2);
    return g == 1 || g == 4 ? g : 2;
}

// a token-major input x [tokens][H][W] (q, k, f, v, dO) in boxes of box_w columns of one head's
// 16 rows (rows past the last token read as zeros; a sequence's next one is the kernel's to mask)
static cudaError_t kda_tma_map(CUtensorMap *m, const void *base, int rank, const cuuint64_t *dims,
                               const cuuint64_t *strides, const cuuint32_t *box, CUtensorMapSwizzle sw);
cudaError_t kda_rows_map(CUtensorMap *m, const bf16 *x, const kda_params *p, int W, int box_w, CUtensorMapSwizzle sw) {
    const uint64_t tokens = p->cu_seqlens ? (uint64_t)p->T : (uint64_t)p->N * p->T;
    const cuuint64_t dims[3] = {(cuuint64_t)W, (cuuint64_t)p->H, tokens},
                     strides[2] = {(cuuint64_t)W * 2, (cuuint64_t)p->H * W * 2};
    const cuuint32_t box[3] = {(cuuint32_t)box_w, 1, 16};
    return kda_tma_map(m, x, 3, dims, strides, box, sw);
}
// the prep kernel's input maps for q, k, f (W = K): whole rows, no swizzle (v: 64-channel boxes,
// 128-byte swizzle, PrepSmem::vs)
static cudaError_t prep_input_map(CUtensorMap *m, const bf16 *x, const kda_params *p, int W) {
    return kda_rows_map(m, x, p, W, W, CU_TENSOR_MAP_SWIZZLE_NONE);
}

template <int K, int V, int MODE>
static cudaError_t launch_prep(const kda_params *p, const KWs &w) {
    PrepArgs a;
    a.sq = kda_seq(p, w);
    a.H = p->H; a.NC = w.NC;
    a.lb = p->lb; a.scale = p->scale; a.c0 = 7.5f * p->lb * KDA_LOG2E;
    a.q = p->q; a.k = p->k; a.v = p->v; a.f = p->f; a.beta = p->beta;
    a.A_log = p->A_log; a.dt_bias = p->dt_bias;
    a.W = w.W; a.Qg = w.Qg; a.KrT = w.KrT; a.U = w.U; a.M = w.M; a.gl = w.gl; a.Lx = w.Lx;
    size_t smem = sizeof(PrepSmem<K, V>);
    cudaError_t e = cudaFuncSetAttribute(kda_prep_kernel<K, V, MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    if ((long long)w.NC * p->H == 0) return cudaSuccess;
    if ((e = prep_input_map(&a.mq, p->q, p, K)) != cudaSuccess || (e = prep_input_map(&a.mk, p->k, p, K)) != cudaSuccess ||
        (e = prep_input_map(&a.mf, p->f, p, K)) != cudaSuccess ||
        (e = kda_rows_map(&a.mv, p->v, p, V, 64, CU_TENSOR_MAP_SWIZZLE_128B)) != cudaSuccess)
        return e;
    const dim3 grid((unsigned)p->H, (unsigned)(w.NC < PREP_GRID_Y ? w.NC : PREP_GRID_Y),
                    (unsigned)((w.NC + PREP_GRID_Y - 1) / PREP_GRID_Y));
    kda_prep_kernel<K, V, MODE><<<grid, PREP_THREADS, smem, p->stream>>>(a);
    return cudaGetLastError();
}

// A bf16 tensor map for the warpgroup scans' copies: dims[0] innermost (contiguous),
// strides[i] the byte step of dimension i + 1, boxes of box[·]. The encoder comes from the
// driver through the runtime (no -lcuda).
static cudaError_t kda_tma_map(CUtensorMap *m, const void *base, int rank, const cuuint64_t *dims,
                               const cuuint64_t *strides, const cuuint32_t *box, CUtensorMapSwizzle sw) {
    static PFN_cuTensorMapEncodeTiled_v12000 enc = NULL;
    if (!enc) {
        cudaDriverEntryPointQueryResult q;
        cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&enc, 12000,
                                                         cudaEnableDefault, &q);
        if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !enc) {
            enc = NULL;
            return e != cudaSuccess ? e : cudaErrorNotSupported;
        }
    }
    const cuuint32_t es[3] = {1, 1, 1};
    CUresult r = enc(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, (cuuint32_t)rank, const_cast<void *>(base), dims, strides, box,
                     es, CU_TENSOR_MAP_INTERLEAVE_NONE, sw, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                     CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}
cudaError_t kda_tma_map2(CUtensorMap *m, const void *base, uint64_t inner, uint64_t rows, uint32_t box_inner,
                         uint32_t box_rows, CUtensorMapSwizzle sw) {
    const cuuint64_t dims[2] = {inner, rows}, strides[1] = {inner * 2};
    const cuuint32_t box[2] = {box_inner, box_rows};
    return kda_tma_map(m, base, 2, dims, strides, box, sw);
}

cudaError_t kda_chunk_maps(ChunkMaps *m, const kda_params *p, const KWs &w, bool dO, bool val) {
    const uint64_t K = p->K, V = p->V, rows = (uint64_t)p->H * w.NC * 16;
    cudaError_t e;
    if ((e = kda_tma_map2(&m->W, w.W, K, rows, 64, 16, CU_TENSOR_MAP_SWIZZLE_128B)) != cudaSuccess ||
        (e = kda_tma_map2(&m->Qg, w.Qg, K, rows, 64, 16, CU_TENSOR_MAP_SWIZZLE_128B)) != cudaSuccess ||
        (e = kda_tma_map2(&m->KrT, w.KrT, 16, rows * K / 16, 16, (uint32_t)K, CU_TENSOR_MAP_SWIZZLE_32B)) != cudaSuccess ||
        (e = kda_tma_map2(&m->M, w.M, 16, rows * 2, 16, 32, CU_TENSOR_MAP_SWIZZLE_32B)) != cudaSuccess ||
        (e = kda_tma_map2(&m->gl, w.gl, 2 * K, rows / 16, (uint32_t)(2 * K), 1, CU_TENSOR_MAP_SWIZZLE_NONE)) != cudaSuccess)
        return e;
    if (!val) return cudaSuccess;
    if (!dO) return kda_tma_map2(&m->val, w.U, V, rows, 64, 16, CU_TENSOR_MAP_SWIZZLE_128B);
    // dO [tokens][H][V] in 64-column boxes, 128-byte swizzled like the stage's other tiles
    return kda_rows_map(&m->val, p->d_o, p, (int)V, 64, CU_TENSOR_MAP_SWIZZLE_128B);
}

// one launch of the scan kernel: its mode and segments (ScanArgs)
struct ScanPass {
    int mode, nseg, segc;
    const float *seg_S0;
    float *seg_out;
    int sg0 = 0, sgn = 0;   // the segments launched: [sg0, sg0 + sgn) (sgn 0: all nseg)
};

// nw: value-slice warps per block (each with KS − 1 partners); G chunks per step
template <int K, bool SPLIT, bool OUT, int CKPT, int KS, int G, bool WG = false>
static cudaError_t launch_scan_t(const kda_params *p, const KWs &w, int nw, const ScanPass &sp) {
    ScanArgs a = {};
    a.mode = sp.mode; a.nseg = sp.nseg; a.segc = sp.segc; a.seg_S0 = sp.seg_S0; a.seg_out = sp.seg_out;
    a.seg0c = sp.nseg > 1 ? w.seg0c : 0; a.sg0 = sp.sg0; a.sgn = sp.sgn > 0 ? sp.sgn : sp.nseg;
    a.sq = kda_seq(p, w);
    a.H = p->H; a.V = p->V; a.NC = w.NC; a.NS = w.NS;
    a.W = G > 1 ? w.Wt : w.W; a.Qg = w.Qg; a.KrT = w.KrT; a.U = G > 1 ? w.Ut : w.U; a.M = w.M; a.gl = w.gl;
    a.S0 = p->S0; a.o = p->o; a.S_out = p->S_out; a.ckpt = w.ckpt;
    a.Sc = w.Sc; a.Vp = w.Vp; a.cs = w.cs;
    int VB = 16 * nw;
    long long blocks = (long long)p->N * p->H * a.sgn * (p->V / VB);
    int fixed = scan_fixed_bytes(VB, KS, G) + (CKPT == SCAN_CSTATES ? nw * KS * cstate_stage_bytes<K / KS>() : 0);
    int sb = G * (WG ? scan_stage_wg(K, VB) : scan_stage(K, VB)).bytes;
    a.stages = kda_scan_stages(blocks, sb, fixed, WG);
    size_t smem = (size_t)a.stages * sb + fixed + (WG ? 1024 + 16 * a.stages : 0);   // WG: alignment, mbarriers
    if (WG) {
        cudaError_t e = kda_chunk_maps(&a.maps, p, w, false, sp.mode != SCAN_TRANS);
        if (e != cudaSuccess) return e;
    }
    auto kern = kda_scan_kernel<K, SPLIT, OUT, CKPT, KS, G, WG>;
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    if ((long long)p->N * p->H == 0) return cudaSuccess;
    dim3 grid((unsigned)(p->N * p->H * a.sgn), p->V / VB);
    kern<<<grid, 32 * nw * KS + (WG ? 128 : 0), smem, p->stream>>>(a);
    return cudaGetLastError();
}

// the 64-token steps are built without the experimental hi + lo state split (KDA_SPLIT)
template <int K, int KS>
static cudaError_t launch_scan_ks(const kda_params *p, const KWs &w, bool out, bool ckpt, int nw, const ScanPass &sp) {
    bool split = scan_split();
    const int ck = !ckpt ? SCAN_NOCKPT : w.cstates ? SCAN_CSTATES : SCAN_CKPT;
    if (w.group > 1) {
#define SCAN_CASE(O, C) if (out == O && ck == C) return launch_scan_t<K, false, O, C, KS, KDA_SEG>(p, w, nw, sp)
        SCAN_CASE(true, SCAN_NOCKPT);
        SCAN_CASE(true, SCAN_CKPT);
        SCAN_CASE(false, SCAN_CKPT);
        SCAN_CASE(false, SCAN_NOCKPT);
#undef SCAN_CASE
    }
    // the warpgroup step for the passes with output, but not with 64-token checkpoints, from
    // which the segment kernel recomputes the states by the warp-level step; and for the
    // two-level scan's local and transition passes (one block per SM, where the warp-level
    // step runs two: its state, A fragments and products do not fit 128 registers)
    if (scan_wg_step(p, KS, nw, out)) {
        if (out && ck == SCAN_NOCKPT) return launch_scan_t<K, false, true, SCAN_NOCKPT, KS, 1, KS == 1>(p, w, nw, sp);
        if (out && ck == SCAN_CSTATES) return launch_scan_t<K, false, true, SCAN_CSTATES, KS, 1, KS == 1>(p, w, nw, sp);
        if (!out && ck == SCAN_NOCKPT && (sp.mode == SCAN_LOCAL || sp.mode == SCAN_TRANS))
            return launch_scan_t<K, false, false, SCAN_NOCKPT, KS, 1, KS == 1>(p, w, nw, sp);
    }
#define SCAN_CASE(S, O, C) if (split == S && out == O && ck == C) return launch_scan_t<K, S, O, C, KS, 1>(p, w, nw, sp)
    SCAN_CASE(true, true, SCAN_NOCKPT);
    SCAN_CASE(true, true, SCAN_CKPT);
    SCAN_CASE(true, false, SCAN_CKPT);
    SCAN_CASE(true, false, SCAN_NOCKPT);
    SCAN_CASE(false, true, SCAN_NOCKPT);
    SCAN_CASE(false, true, SCAN_CKPT);
    SCAN_CASE(false, true, SCAN_CSTATES);
    SCAN_CASE(false, false, SCAN_CKPT);
    SCAN_CASE(false, false, SCAN_CSTATES);
    SCAN_CASE(false, false, SCAN_NOCKPT);
#undef SCAN_CASE
    return cudaErrorInvalidValue;
}

template <int K>
static cudaError_t launch_scan_pass(const kda_params *p, const KWs &w, bool out, bool ckpt, const ScanPass &sp) {
    int ks = kda_scan_ks(p), nw = kda_scan_warps(p, ks);
    if (ks == 4) return launch_scan_ks<K, 4>(p, w, out, ckpt, nw, sp);
    if (ks == 2) return launch_scan_ks<K, 2>(p, w, out, ckpt, nw, sp);
    return launch_scan_ks<K, 1>(p, w, out, ckpt, nw, sp);
}

// The forward-only schedule of the two-level scan (kda_ws_layout: w.seg0c > w.segc, nseg ≥ 3).
// The uniform schedule runs three passes over every segment, but A(σ) and L(σ) of the last
// segment are never used, nor those of segment 0 once its true initial state (S0) is known. So
// segment 0 — longer than the others — runs its output pass from S0 on a second stream while
// the local and transition passes run over segments 1 .. nseg − 2 beside it; then the carry
// from segment 1 and the seeded pass over segments 1 .. nseg − 1, one wave of blocks.
//
// The side stream and its two events are made once, on the device current then, and used under
// a lock, so that each forward's fork and join records are the ones its waits take. Where they
// cannot serve — another device, their creation failed, or p->stream is being captured into a
// graph (a shared stream must not join another thread's capture) — the uniform schedule runs
// instead: it is correct on these segments too (every pass over all of them, the carry from S0).
static pthread_mutex_t side_lock = PTHREAD_MUTEX_INITIALIZER;
static bool scan_side_stream(cudaStream_t *side, cudaEvent_t *fork, cudaEvent_t *join) {
    static int state = 0, dev = -1;   // 0: not tried, 1: made, −1: failed
    static cudaStream_t s;
    static cudaEvent_t f, j;
    int cur = -1;
    if (cudaGetDevice(&cur) != cudaSuccess) return false;
    if (state == 0) {
        state = -1;
        bool ok = cudaEventCreateWithFlags(&f, cudaEventDisableTiming) == cudaSuccess;
        if (ok && !(ok = cudaEventCreateWithFlags(&j, cudaEventDisableTiming) == cudaSuccess)) cudaEventDestroy(f);
        if (ok && !(ok = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess)) {
            cudaEventDestroy(f);
            cudaEventDestroy(j);
        }
        if (!ok) {
            (void)cudaGetLastError();   // the launches after this one report their own errors, not this
            return false;
        }
        state = 1;
        dev = cur;
    }
    if (state != 1 || cur != dev) return false;
    *side = s; *fork = f; *join = j;
    return true;
}

template <int K>
static cudaError_t launch_scan_uniform(const kda_params *p, const KWs &w, bool out, bool ckpt);

// the local and transition passes over segments [sg0, sg0 + sgn) (sgn 0: all of them)
template <int K>
static cudaError_t launch_local_trans(const kda_params *p, const KWs &w, int sg0, int sgn) {
    cudaError_t e = launch_scan_pass<K>(p, w, false, false, ScanPass{SCAN_LOCAL, w.nseg, w.segc, NULL, w.segL, sg0, sgn});
    if (e != cudaSuccess) return e;
    kda_params q = *p;   // the transitions: K × K "states", value index over K
    q.V = p->K;
    return launch_scan_pass<K>(&q, w, false, false, ScanPass{SCAN_TRANS, w.nseg, w.segc, NULL, w.segA, sg0, sgn});
}

template <int K>
static cudaError_t launch_scan_first(const kda_params *p, const KWs &w) {
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    cudaError_t e = cudaStreamIsCapturing(p->stream, &cap);
    if (e != cudaSuccess) return e;
    cudaStream_t side;
    cudaEvent_t fork, join;
    pthread_mutex_lock(&side_lock);
    if (cap != cudaStreamCaptureStatusNone || !scan_side_stream(&side, &fork, &join)) {
        pthread_mutex_unlock(&side_lock);
        return launch_scan_uniform<K>(p, w, true, false);
    }
    if ((e = cudaEventRecord(fork, p->stream)) == cudaSuccess && (e = cudaStreamWaitEvent(side, fork, 0)) == cudaSuccess) {
        kda_params ps = *p;   // segment 0 on the side stream, launched first (default priority)
        ps.stream = side;
        e = launch_scan_pass<K>(&ps, w, true, false, ScanPass{SCAN_FIRST, w.nseg, w.segc, NULL, w.segS0, 0, 1});
        if (e == cudaSuccess) e = launch_local_trans<K>(p, w, 1, w.nseg - 2);   // segments 1 .. nseg − 2
        // the join, also after a failed launch: nothing queued on the side stream outlives this call
        cudaError_t ej = cudaEventRecord(join, side);
        if (ej == cudaSuccess) ej = cudaStreamWaitEvent(p->stream, join, 0);
        if (e == cudaSuccess) e = ej;
    }
    pthread_mutex_unlock(&side_lock);
    if (e != cudaSuccess) return e;
    if ((e = kda_seg_carry(p, w, false, true)) != cudaSuccess) return e;
    return launch_scan_pass<K>(p, w, true, false, ScanPass{SCAN_SEEDED, w.nseg, w.segc, w.segS0, NULL, 1, w.nseg - 1});
}

// every pass over all the segments (any lengths: seg_start), the carry from S0
template <int K>
static cudaError_t launch_scan_uniform(const kda_params *p, const KWs &w, bool out, bool ckpt) {
    cudaError_t e = launch_local_trans<K>(p, w, 0, 0);
    if (e != cudaSuccess) return e;
    if ((e = kda_seg_carry(p, w, false)) != cudaSuccess) return e;
    return launch_scan_pass<K>(p, w, out, ckpt, ScanPass{SCAN_SEEDED, w.nseg, w.segc, w.segS0, NULL});
}

// the forward scan: one plain pass, or the two-level scan over w.nseg segments
template <int K>
static cudaError_t launch_scan_k(const kda_params *p, const KWs &w, bool out, bool ckpt) {
    if (w.nseg <= 1) return launch_scan_pass<K>(p, w, out, ckpt, ScanPass{SCAN_PLAIN, 1, 0, NULL, NULL});
    if (w.seg0c > w.segc && out && !ckpt) return launch_scan_first<K>(p, w);
    return launch_scan_uniform<K>(p, w, out, ckpt);
}

// the chunk products, and the 64-token steps' merged W~, U~ when the scans take them
cudaError_t kda_launch_prep(const kda_params *p, const KWs &w) {
    const int mode = kda_mode(p);
    cudaError_t e = cudaErrorInvalidValue;
#define PREP_CASE(KK, VV)                                                                     \
    if (p->K == KK && p->V == VV)                                                           \
        e = mode == KDA_UNBOUNDED       ? launch_prep<KK, VV, KDA_UNBOUNDED>(p, w)            \
            : mode == KDA_BOUNDED_EXACT ? launch_prep<KK, VV, KDA_BOUNDED_EXACT>(p, w)        \
                                        : launch_prep<KK, VV, KDA_BOUNDED>(p, w);
    PREP_CASE(64, 64) PREP_CASE(64, 128) PREP_CASE(128, 64) PREP_CASE(128, 128)
#undef PREP_CASE
    if (e != cudaSuccess) return e;
    return kda_launch_merge(p, w);
}

cudaError_t kda_launch_scan(const kda_params *p, const KWs &w, bool out, bool ckpt) {
    return p->K == 64 ? launch_scan_k<64>(p, w, out, ckpt) : launch_scan_k<128>(p, w, out, ckpt);
}

extern "C" cudaError_t kda_fwd_prep(const kda_params *p) {
    cudaError_t e = kda_check_params(p);
    if (e != cudaSuccess) return e;
    KWs w = kda_ws_layout(p, p->ws, 0);
    if ((e = kda_offsets(p, w)) != cudaSuccess) return e;
    return kda_launch_prep(p, w);
}

extern "C" cudaError_t kda_fwd_scan(const kda_params *p) {
    cudaError_t e = kda_check_params(p);
    if (e != cudaSuccess) return e;
    KWs w = kda_ws_layout(p, p->ws, 0);
    return kda_launch_scan(p, w, true, p->save != 0);
}

extern "C" cudaError_t kda_fwd(const kda_params *p) {
    cudaError_t e = kda_fwd_prep(p);
    if (e != cudaSuccess) return e;
    return kda_fwd_scan(p);
}
