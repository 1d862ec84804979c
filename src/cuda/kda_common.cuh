// kda_common.cuh — device helpers shared by the KDA kernels (internal to src/cuda/kda_*.cu;
// mla.cu's tensor-core decode uses the product, fragment and cp.async helpers too):
// bf16 packing, the m16n8k16 tensor-core product, cp.async, the gate, and the map from a
// global chunk / segment index to its sequence.
//
// Tensor-core fragment layouts (PTX ISA, mma.m16n8k16, bf16 in, fp32 accumulate), with
// g = lane / 4 and t = lane % 4:
//   A (16×16, row):  a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..]
//   B (16×8, col):   b0 = B[2t..2t+1][g],  b1 = B[2t+8..2t+9][g]
//   C (16×8, fp32):  c0,c1 = C[g][2t], C[g][2t+1];  c2,c3 = C[g+8][2t], C[g+8][2t+1]
// Two adjacent C tiles (columns 0–7 and 8–15) packed to bf16 are exactly one A fragment
// (rows g, g+8; k columns 2t, 2t+8): the scan kernels keep the state transposed (V rows,
// K columns) in C fragments and feed it straight back as the A operand.
#ifndef LM_CUDA_KDA_COMMON_CUH
#define LM_CUDA_KDA_COMMON_CUH
#include <cuda_bf16.h>
#include <stdint.h>
#include "kda.cuh"
#include "ldmatrix.cuh"

typedef __nv_bfloat16 bf16;

#define KDA_C 16          // chunk length (tokens) of every chunked kernel
// The prep kernel's solve kept for the backward, per chunk and head (fp32, 16-byte multiple):
// [16][16] with INV = (I + L)^{-1} below the diagonal (its unit diagonal implied), the raw
// Σ_ch k̂_i,ch k̂_j,ch e^{G_i,ch − G_j,ch} (i > j, before β) mirrored above it at [j][i], β on the
// diagonal; then rq[16], rk[16] (the rows' reciprocal norms). Saves the backward chunk kernel the
// norms, the L products and the serial forward substitution.
#define KDA_LX (16 * 16 + 32)
#define KDA_SEG 4         // chunks per backward checkpoint segment (64 tokens)
#define KDA_STAGES_MAX 8  // pipeline depth of the scan kernels (cp.async or TMA ring): 2..8, chosen at launch
#define KDA_LOG2E 1.4426950408889634f

// ---- bf16 ----
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}
// two bf16 (raw bits) into one register, lo in the low half
__device__ __forceinline__ uint32_t pack_raw(bf16 lo, bf16 hi) {
    return (uint32_t)__bfloat16_as_ushort(lo) | ((uint32_t)__bfloat16_as_ushort(hi) << 16);
}
// x = hi + lo with hi = bf16(x), lo = bf16(x − hi): ~16 mantissa bits from two bf16 products
__device__ __forceinline__ void split_bf16(float x0, float x1, uint32_t &hi, uint32_t &lo) {
    __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
    float2 hf = __bfloat1622float2(h);
    hi = *reinterpret_cast<uint32_t *>(&h);
    lo = pack_bf16(x0 - hf.x, x1 - hf.y);
}
__device__ __forceinline__ uint32_t ld_u32(const bf16 *p) { return *reinterpret_cast<const uint32_t *>(p); }
// N ∈ {2, 4} consecutive bf16 from global memory (2N-byte aligned) as N/2 packed words; zeros if !ok
template <int N> __device__ __forceinline__ void ld_bf16x(uint32_t (&w)[N / 2], const bf16 *p, bool ok) {
    static_assert(N == 2 || N == 4, "two or four bf16");
    if constexpr (N == 4) {
        uint2 x = ok ? *reinterpret_cast<const uint2 *>(p) : make_uint2(0u, 0u);
        w[0] = x.x;
        w[1] = x.y;
    } else {
        w[0] = ok ? *reinterpret_cast<const uint32_t *>(p) : 0u;
    }
}
// element e of packed bf16 pairs (lo half first), as fp32 (exact)
template <int W> __device__ __forceinline__ float bf_at(const uint32_t (&w)[W], int e) {
    uint32_t x = w[e >> 1];
    return __uint_as_float((e & 1) ? (x & 0xffff0000u) : (x << 16));
}
__device__ __forceinline__ float bf(bf16 x) { return __bfloat162float(x); }

// ---- tensor cores: C += A·B, m16n8k16, bf16 × bf16 → fp32 ----
__device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], const uint32_t b[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// A fragment from a row-major bf16 tile A[m][k] (row stride ld elements), k offset k0
__device__ __forceinline__ void lda_row(uint32_t a[4], const bf16 *A, int ld, int k0, int lane) {
    int g = lane >> 2, t = lane & 3;
    a[0] = ld_u32(A + g * ld + k0 + 2 * t);
    a[1] = ld_u32(A + (g + 8) * ld + k0 + 2 * t);
    a[2] = ld_u32(A + g * ld + k0 + 2 * t + 8);
    a[3] = ld_u32(A + (g + 8) * ld + k0 + 2 * t + 8);
}
// A fragment of Xᵀ from a row-major bf16 tile X[k][m] (A[m][k] = X[k][m]); m0, k0 offsets
__device__ __forceinline__ void lda_trans(uint32_t a[4], const bf16 *X, int ld, int m0, int k0, int lane) {
    int g = lane >> 2, t = lane & 3;
    const bf16 *p = X + (k0 + 2 * t) * ld + m0 + g;
    a[0] = pack_raw(p[0], p[ld]);
    a[1] = pack_raw(p[8], p[ld + 8]);
    a[2] = pack_raw(p[8 * ld], p[9 * ld]);
    a[3] = pack_raw(p[8 * ld + 8], p[9 * ld + 8]);
}
// B fragment from Bt[n][k] (k contiguous: "col-major" B), n offset n0, k offset k0
__device__ __forceinline__ void ldb_nk(uint32_t b[2], const bf16 *Bt, int ld, int n0, int k0, int lane) {
    int g = lane >> 2, t = lane & 3;
    const bf16 *p = Bt + (n0 + g) * ld + k0 + 2 * t;
    b[0] = ld_u32(p);
    b[1] = ld_u32(p + 8);
}
// B fragment from B[k][n] (n contiguous: row-major B), n offset n0, k offset k0
__device__ __forceinline__ void ldb_kn(uint32_t b[2], const bf16 *B, int ld, int n0, int k0, int lane) {
    int g = lane >> 2, t = lane & 3;
    const bf16 *p = B + (k0 + 2 * t) * ld + n0 + g;
    b[0] = pack_raw(p[0], p[ld]);
    b[1] = pack_raw(p[8 * ld], p[9 * ld]);
}

// fragments by ldmatrix (ldmatrix.cuh) / stmatrix (shared memory; every row address 16-byte aligned)
// lda_trans by one ldmatrix.trans: tile j = lane >> 3 covers k0 + 8·(j >> 1), m0 + 8·(j & 1)
__device__ __forceinline__ void lda_trans_sm(uint32_t a[4], const bf16 *X, int ld, int m0, int k0, int lane) {
    ldsm_x4_t(a, X + (k0 + (lane & 7) + 8 * (lane >> 4)) * ld + m0 + 8 * ((lane >> 3) & 1));
}
// ldb_kn for two n-tiles (n0 and n0 + 8) by one ldmatrix.trans: b[0..1] of n0, b[2..3] of n0 + 8
__device__ __forceinline__ void ldb_kn2_sm(uint32_t b[4], const bf16 *B, int ld, int n0, int k0, int lane) {
    ldsm_x4_t(b, B + (k0 + (lane & 7) + 8 * ((lane >> 3) & 1)) * ld + n0 + 8 * (lane >> 4));
}
// lda_row by one ldmatrix: lanes 0–7 / 8–15 give rows 0–7 / 8–15 at k0, lanes 16–31 the same at k0 + 8
__device__ __forceinline__ void lda_row_sm(uint32_t a[4], const bf16 *A, int ld, int k0, int lane) {
    ldsm_x4(a, A + ((lane & 7) + 8 * ((lane >> 3) & 1)) * ld + k0 + 8 * (lane >> 4));
}
// ldb_nk for two n-tiles (n0 and n0 + 8) by one ldmatrix: b[0..1] of n0, b[2..3] of n0 + 8
__device__ __forceinline__ void ldb_nk2_sm(uint32_t b[4], const bf16 *Bt, int ld, int n0, int k0, int lane) {
    ldsm_x4(b, Bt + (n0 + (lane & 7) + 8 * (lane >> 4)) * ld + k0 + 8 * ((lane >> 3) & 1));
}
// An fp32 accumulator Xᵀ [m = v0 + 0..15][n = 0..8·NT−1] (m16n8 fragments f[NT][4]) rounded to
// bf16 and stored as rows X[n][v0 .. v0 + 15] (row stride ld): four 8×8 tiles per stmatrix.trans,
// instead of a 2-byte store per element (adjacent elements of a fragment sit in adjacent rows)
template <int NT>
__device__ __forceinline__ void store_acc_rows(bf16 *X, int ld, int v0, const float (*f)[4], int lane) {
    static_assert(NT % 2 == 0, "n-tiles go in pairs");
    const int j = lane >> 3, r = lane & 7;
#pragma unroll
    for (int nt = 0; nt < NT; nt += 2) {
        unsigned s = (unsigned)__cvta_generic_to_shared(X + (8 * (nt + (j >> 1)) + r) * ld + v0 + 8 * (j & 1));
        asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(s),
                     "r"(pack_bf16(f[nt][0], f[nt][1])), "r"(pack_bf16(f[nt][2], f[nt][3])),
                     "r"(pack_bf16(f[nt + 1][0], f[nt + 1][1])), "r"(pack_bf16(f[nt + 1][2], f[nt + 1][3]))
                     : "memory");
    }
}

// fp32 operands as bf16 hi + lo (x = hi + lo to ~16 bits); mma3: C += Ah·Bh + Ah·Bl + Al·Bh
__device__ __forceinline__ void mma3(float c[4], const uint32_t ah[4], const uint32_t al[4], const uint32_t bh[2],
                                     const uint32_t bl[2]) {
    mma16816(c, ah, bh);
    mma16816(c, ah, bl);
    mma16816(c, al, bh);
}
// A fragment (hi, lo) of a 16×16 fp32 tile X (row stride ld, any alignment); trans: A = Xᵀ
__device__ __forceinline__ void lda_f32_16(uint32_t ah[4], uint32_t al[4], const float *X, int ld, bool trans, int lane) {
    int g = lane >> 2, t = lane & 3;
    auto at = [&](int m, int k) { return trans ? X[k * ld + m] : X[m * ld + k]; };
    split_bf16(at(g, 2 * t), at(g, 2 * t + 1), ah[0], al[0]);
    split_bf16(at(g + 8, 2 * t), at(g + 8, 2 * t + 1), ah[1], al[1]);
    split_bf16(at(g, 2 * t + 8), at(g, 2 * t + 9), ah[2], al[2]);
    split_bf16(at(g + 8, 2 * t + 8), at(g + 8, 2 * t + 9), ah[3], al[3]);
}

// ---- cp.async (16 bytes; src_bytes = 0 fills zeros) ----
// to shared address s (a 32-bit shared-window address: the scans add offsets to one per stage)
__device__ __forceinline__ void cp_async16_s(uint32_t s, const void *gmem, int src_bytes = 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, int src_bytes = 16) {
    cp_async16_s((uint32_t)__cvta_generic_to_shared(smem), gmem, src_bytes);
}
// the 128-byte line holding p into L2
__device__ __forceinline__ void prefetch_l2(const void *p) { asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p)); }
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
// every copy landed, as a compiler barrier for memory too: global loads written before it (the
// backward chunk kernel's β logits and gate parameters) are issued before it, their latency
// overlapping the copies' (without the clobber nvcc sank the β loads below the wait; ncu, session
// 21: chunk kernel 2.11 → 1.99 ms at B1·T8192·H96; the same in prep made it 13% slower)
__device__ __forceinline__ void cp_async_wait_all_loads() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
// wait until at most n (< 8) groups are pending, n at run time. The scans' counts (1 and 0: three
// or two stages) are tested first: a switch alone compiles to a jump table in their step loop
// (ncu, session 21)
__device__ __forceinline__ void cp_async_wait_n(int n) {
    if (n == 1) cp_async_wait<1>();
    else if (n == 0) cp_async_wait<0>();
    else switch (n) {
    case 2: cp_async_wait<2>(); break;
    case 3: cp_async_wait<3>(); break;
    case 4: cp_async_wait<4>(); break;
    case 5: cp_async_wait<5>(); break;
    case 6: cp_async_wait<6>(); break;
    default: cp_async_wait<7>(); break;
    }
}

// The chunk kernels' inputs (prep, backward chunk). A [16][K] bf16 tile in shared memory is
// either a flat pointer or a pointer to rows of K; row r of it:
template <int K> __device__ __forceinline__ bf16 *tile_row(bf16 *p, int r) { return p + r * K; }
template <int K> __device__ __forceinline__ bf16 *tile_row(bf16 (*p)[K], int r) { return p[r]; }
// NT W-wide tensors' 16 chunk rows (row r at (row0 + r·rs)·W) into tiles of row stride ld
// (rows r ≥ len zero-filled) by 16-byte cp.async from NTHR threads (not committed), the NT
// copies of a row issued together. A thread's pieces share their column, so its source offset
// steps by a constant (the index arithmetic of a general piece loop was ~130 instructions a
// copy, ncu session 26).
template <int W, int NTHR, int NT>
__device__ __forceinline__ void chunk_rows_async(bf16 *const (&sx)[NT], int ld, const bf16 *const (&x)[NT], size_t row0,
                                                 size_t rs, int len, int tid) {
    static_assert(NTHR % (W / 8) == 0 && 16 % (NTHR / (W / 8)) == 0, "whole rows per pass");
    constexpr int RPI = NTHR / (W / 8);
    const int pc = tid % (W / 8), r0 = tid / (W / 8);
    size_t off = (row0 + (size_t)r0 * rs) * W + pc * 8;
#pragma unroll
    for (int it = 0; it < 16 / RPI; it++, off += (size_t)RPI * rs * W) {
        const int r = r0 + it * RPI;
        const bool ok = r < len;
#pragma unroll
        for (int j = 0; j < NT; j++) cp_async16(sx[j] + r * ld + pc * 8, x[j] + (ok ? off : 0), ok ? 16 : 0);
    }
}
// ... or, where bulk copies brought whole [16][W] tiles (a sequence's last chunk reads the next
// sequence's rows), rows len .. 15 of NT such tiles zeroed afterwards, in fixed unrolled passes
template <int W, int NTHR, int NT>
__device__ __forceinline__ void chunk_zero_tail(bf16 *const (&sx)[NT], int len, int tid) {
    static_assert((16 * W / 8) % NTHR == 0, "whole passes");
#pragma unroll
    for (int ps = 0; ps < 16 * W / 8 / NTHR; ps++) {
        const unsigned i = (unsigned)tid + ps * NTHR, r = i / (W / 8), pc = i % (W / 8);
        if ((int)r >= len)
#pragma unroll
            for (int j = 0; j < NT; j++) *reinterpret_cast<uint4 *>(sx[j] + r * W + 8 * pc) = make_uint4(0u, 0u, 0u, 0u);
    }
}
// ... the β logits of a warp's rows warp + i·NTHR/32 (0 past len) while the copies land ...
template <int RPW, int NTHR>
__device__ __forceinline__ void chunk_beta_rows(float (&rbl)[RPW], const bf16 *beta, long long t0, int H, int h,
                                                int len, int warp) {
#pragma unroll
    for (int i = 0; i < RPW; i++) {
        int r = warp + i * (NTHR / 32);
        rbl[i] = r < len ? bf(beta[((size_t)t0 + r) * H + h]) : 0.f;
    }
}
// ... and, once they have, channel cch < K of the three tiles as fp32
template <int K, typename Tile>
__device__ __forceinline__ void chunk_channel(float (&fr)[16], float (&qr)[16], float (&kr)[16], Tile sq, Tile sk,
                                              Tile sf, int cch) {
#pragma unroll
    for (int r = 0; r < 16; r++) {
        fr[r] = bf(tile_row<K>(sf, r)[cch]);
        qr[r] = bf(tile_row<K>(sq, r)[cch]);
        kr[r] = bf(tile_row<K>(sk, r)[cch]);
    }
}

// ... and the reciprocal L2 norms 1/√(Σ x² + 1e−6) of a warp's four rows r = warp + 4i of q and
// k into srq[r], srk[r], from the rows as packed bf16 (CPL a lane). The per-lane partial sums
// are reduced by a reduce-scatter, 9 shuffles instead of a butterfly's 40: each level adds the
// same pairs as the butterfly (xor 16, 8, 4, 2, 1, the lane's own value first), so the sums are
// bit for bit the butterfly's; lane l ends with row 2·l[4] + l[3], q if l[2] = 0 else k.
template <int CPL>
__device__ __forceinline__ void chunk_row_rnorms(const uint32_t (&rqx)[4][CPL / 2], const uint32_t (&rkx)[4][CPL / 2],
                                                 int warp, int lane, float *srq, float *srk) {
    float sq[4], sk[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        sq[i] = 0.f;
        sk[i] = 0.f;
#pragma unroll
        for (int e = 0; e < CPL; e++) {
            float qv = bf_at(rqx[i], e), kv = bf_at(rkx[i], e);
            sq[i] = fmaf(qv, qv, sq[i]);
            sk[i] = fmaf(kv, kv, sk[i]);
        }
    }
    const bool b4 = lane & 16, b3 = lane & 8, b2 = lane & 4;
    float v[4];   // rows 0, 1 (b4 = 0) or 2, 3: q, k of the first, q, k of the second
#pragma unroll
    for (int j = 0; j < 2; j++) {
        v[2 * j] = (b4 ? sq[j + 2] : sq[j]) + __shfl_xor_sync(0xffffffffu, b4 ? sq[j] : sq[j + 2], 16);
        v[2 * j + 1] = (b4 ? sk[j + 2] : sk[j]) + __shfl_xor_sync(0xffffffffu, b4 ? sk[j] : sk[j + 2], 16);
    }
    const float w0 = (b3 ? v[2] : v[0]) + __shfl_xor_sync(0xffffffffu, b3 ? v[0] : v[2], 8);
    const float w1 = (b3 ? v[3] : v[1]) + __shfl_xor_sync(0xffffffffu, b3 ? v[1] : v[3], 8);
    float x = (b2 ? w1 : w0) + __shfl_xor_sync(0xffffffffu, b2 ? w0 : w1, 4);
    x += __shfl_xor_sync(0xffffffffu, x, 2);
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    if ((lane & 3) == 0) (b2 ? srk : srq)[warp + 4 * (2 * (int)b4 + (int)b3)] = rsqrtf(x + 1e-6f);
}

// ---- exp2 on the special-function unit: ex2.approx.ftz (relative error ~2^-22; a subnormal
// result flushes to zero). Every exponent here is a decay or a factor in [2^-126, 2^127] or
// one whose true value is below fp32's normal range anyway. The library exp2f / expf cost
// range checks and a Cody-Waite split around the same instruction: measured on the H200 as
// ~half the prep kernel's instructions (ncu source counters, session 10).
__device__ __forceinline__ float ex2f_(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// ---- gate (natural log), x = f + dt_bias, eA = exp(A_log) ----
// σ(x) = 1 / (1 + e^{−x}); __fdividef returns 0 for an infinite denominator (x ≪ 0)
__device__ __forceinline__ float sigmoidf_(float x) { return __fdividef(1.f, 1.f + ex2f_(-x * KDA_LOG2E)); }
__device__ __forceinline__ float softplusf_(float x) { return x > 20.f ? x : log1pf(ex2f_(x * KDA_LOG2E)); }
__device__ __forceinline__ float kda_gate(int mode, float lb, float eA, float x) {
    return mode == 0 ? lb * sigmoidf_(eA * x) : -eA * softplusf_(x);
}

// the gate of a chunk's row r (0 past the chunk's end, r ≥ len), x = f + dt_bias. Bounded:
// computed for every row (rows past the end are zero-filled, so it is finite) and selected, so
// the chunk kernels' unrolled rows carry no branches and schedule across each other (prep
// 0.675 → 0.637 ms at B1·T8192·H96, session 26). Unbounded: a branch (its softplus computed for
// every row spilled the prep kernel at 96 registers). Callers add it into G by an explicit fma
// (a select between the product and the sum lost nvcc's contraction and changed G's last bits).
template <int GATE> __device__ __forceinline__ float chunk_gate_row(float lb, float eA, float x, int r, int len) {
    if constexpr (GATE == 0) {
        const float g = kda_gate(0, lb, eA, x);
        return r < len ? g : 0.f;
    } else {
        return r < len ? kda_gate(1, lb, eA, x) : 0.f;
    }
}

// the chunk kernels' variants (a template argument, so that each holds one gate's code):
// the bounded gate with factored decays, the bounded gate with exact (tree) decays, the
// unbounded gate (always exact)
enum { KDA_BOUNDED = 0, KDA_BOUNDED_EXACT = 1, KDA_UNBOUNDED = 2 };
static inline int kda_mode(const kda_params *p) {
    return p->gate_mode == 1 ? KDA_UNBOUNDED : p->exact ? KDA_BOUNDED_EXACT : KDA_BOUNDED;
}

// ---- sequences, chunks (16 tokens) and segments (64 tokens) ----
// Fixed length (cu == NULL): N sequences of T tokens, nc = ⌈T/16⌉ chunks and ns = ⌈T/64⌉
// segments each. Packed (B = 1, cu_seqlens [N+1]): chunk offsets coff [N+1] and segment
// offsets soff [N+1] (in the workspace, made by kda_offsets_kernel).
struct KSeq {
    const int *cu, *coff, *soff;
    int N, T, nc, ns;
    __device__ __forceinline__ int seq_bos(int n) const { return cu ? cu[n] : n * T; }
    __device__ __forceinline__ int seq_len(int n) const { return cu ? cu[n + 1] - cu[n] : T; }
    __device__ __forceinline__ int chunk0(int n) const { return cu ? coff[n] : n * nc; }
    __device__ __forceinline__ int nchunks(int n) const { return cu ? coff[n + 1] - coff[n] : nc; }
    __device__ __forceinline__ int seg0(int n) const { return cu ? soff[n] : n * ns; }
    // the sequence holding item `i` of the offsets o [N+1] (largest n with o[n] ≤ i), −1 past the end
    __device__ int find(const int *o, int i) const {
        if (i >= o[N]) return -1;
        int lo = 0, hi = N - 1;
        while (lo < hi) {
            int mid = (lo + hi + 1) >> 1;
            if (o[mid] <= i) lo = mid; else hi = mid - 1;
        }
        return lo;
    }
    // global chunk gc → sequence n, chunk c inside it, first token t0 (packed), valid rows len
    __device__ bool chunk(int gc, int &n, int &c, long long &t0, int &len) const {
        if (cu) {
            n = find(coff, gc);
            if (n < 0) return false;
            c = gc - coff[n];
        } else {
            n = gc / nc;
            c = gc - n * nc;
            if (n >= N) return false;
        }
        t0 = (long long)seq_bos(n) + 16 * c;
        len = min(16, seq_len(n) - 16 * c);
        return true;
    }
    // global segment gs → sequence n, segment s inside it
    __device__ bool segment(int gs, int &n, int &s) const {
        if (cu) {
            n = find(soff, gs);
            if (n < 0) return false;
            s = gs - soff[n];
        } else {
            n = gs / ns;
            s = gs - n * ns;
            if (n >= N) return false;
        }
        return true;
    }
};

// ---- workspace (kda_fwd.cu): every intermediate the kernels pass to each other ----
// per head h and global chunk gc (16 tokens, padded rows zero):
//   W, Qg [H][NC][16][K] bf16, KrT [H][NC][K][16] bf16, U [H][NC][16][V] bf16,
//   M [H][NC][2][16][16] bf16 (hi, lo), gl [H][NC][K] fp32;
// the opt-in 64-token scan steps (group > 1): Wt, Ut (W~, U~ of kda_merge.cu) in W's and U's layout;
// state checkpoints per 64-token segment: ckpt, dckpt [H][NS][V][K] fp32 (Sᵀ);
// backward: dQg, dWg, dKr [H][NC][K][16] bf16 (a row of 16 tokens per key channel), dgl [H][NC][K] fp32, dM [H][NC][16][16] fp32,
//   dU [H][NC][16][V] bf16, pA [H][NC] fp32, pdb [H][NC][K] fp32.
// The backward's value products run per group of gs global chunks (gs·q .. gs·q + gs − 1; gs = 2,
// pairs, by default, 4 with KDA_VGROUP=4: kda_bwd_vgroup_kernel): from the state entering a unit's first chunk
// and the state gradient leaving its last, the others follow through steps of the recurrence, so
// the scans keep one state in gs: S entering a chunk at a group's start or a sequence's first, dS'
// leaving a chunk at a group's end or a sequence's last (a unit: the chunks of one sequence within
// one group). Slots per head: ps = ceil(NC / gs) group slots and one per sequence for the units
// that start (S) or end (dS') inside a group. ps = 0 (gs = 1, KDA_VGROUP=1): every chunk keeps
// both, slot = gc (kda_bwd_vprod_kernel).
struct CSlots {
    int gs, ps, n;   // chunks per group (1: per chunk), group slots (0: per chunk), slots per head
    __host__ __device__ bool keep_state(int gc, int c) const { return ps == 0 || !(gc & (gs - 1)) || c == 0; }
    __host__ __device__ bool keep_dstate(int gc, int c, int nc_n) const {
        return ps == 0 || (gc & (gs - 1)) == gs - 1 || c == nc_n - 1;
    }
    // the slots of chunk gc (of sequence seq) where it keeps them
    __host__ __device__ int state_slot(int gc, int seq) const {
        return ps == 0 ? gc : (gc & (gs - 1)) ? ps + seq : gc / gs;
    }
    __host__ __device__ int dstate_slot(int gc, int seq) const {
        return ps == 0 ? gc : (gc & (gs - 1)) == gs - 1 ? gc / gs : ps + seq;
    }
};

// x as bf16 hi (T[0]) and lo (T[1]) at (r, c): split_bf16's split, of one value
template <int LD>
__device__ __forceinline__ void split_bf16_at(bf16 (*T)[16][LD], int r, int c, float x) {
    const bf16 h = __float2bfloat16_rn(x);
    T[0][r][c] = h;
    T[1][r][c] = __float2bfloat16_rn(x - __bfloat162float(h));
}

// the solve kept for the backward (KDA_LX floats at lx, shared memory) unpacked by nthr threads
// from thread tid: INV unit lower triangular (fp32, and split into bf16 hi and lo in INVs),
// Lraw strict lower (zero elsewhere), β, rq, rk
template <int LD>
__device__ __forceinline__ void kda_lx_unpack(const float *lx, float (*INV)[17], bf16 (*INVs)[16][LD], float (*Lraw)[17],
                                              float *beta, float *rq, float *rk, int tid, int nthr) {
    for (int e = tid; e < 256; e += nthr) {
        // lx[16r + c] holds INV[r][c] below the diagonal and L[c][r] above it: element e read
        // in order for both (read transposed, L's loads were 8-way bank conflicts), L stored
        // transposed into the 17-float rows
        const int r = e >> 4, c = e & 15;
        const float x = lx[e];   // loaded, then selected (no divergence)
        const float inv = r > c ? x : r == c ? 1.f : 0.f;
        INV[r][c] = inv;
        split_bf16_at(INVs, r, c, inv);
        Lraw[c][r] = c > r ? x : 0.f;
    }
    if (tid < 16) {
        beta[tid] = lx[17 * tid];
        rq[tid] = lx[256 + tid];
        rk[tid] = lx[272 + tid];
    }
}

struct KWs {
    int NC, NS;                        // chunk and segment slots (upper bounds when packed)
    int *coff, *soff;
    bf16 *W, *Qg, *KrT, *U, *M;
    float *gl, *ckpt, *dckpt, *dgl, *dM, *pA, *pdb;
    bf16 *dQg, *dWg, *dKr;
    // save / backward: what the prep kernel solved that the backward chunk kernel reuses,
    // KDA_LX fp32 a chunk-head
    float *Lx;
    int nseg, segc;                    // the scans' time segments per sequence (1: one serial pass), chunks each
    int seg0c;                         // chunks of segment 0: segc, or more under the forward-only schedule (kda_fwd.cu)
    float *segL, *segA, *segS0;        // nseg > 1: per segment local state, transition, initial state
    int group;                         // chunks per step of the scans: 1, or KDA_SEG (64-token steps)
    bf16 *Wt, *Ut;                     // group > 1: the merged W~, U~ [H][NC][16][K or V] (kda_merge.cu)
    bf16 *dU;
    // cstates (the default): the scans keep the state and V' of every chunk (bf16) instead of
    // fp32 checkpoints every 64 tokens, and their state-gradient twins, so the backward's
    // value-contracting products run chunk-parallel (kda_bwd.cu); 0 under KDA_SPLIT or 64-token steps
    int cstates;
    CSlots cs;          // cstates: which chunks keep a state and where (below)
    bf16 *Sc, *Vp;      // cstates: Sᵀ entering a chunk [H][cs.n][V][K], V' [H][NC][16][V]
    bf16 *dSc;          // cstates: dS'ᵀ (the gradient of the state leaving a chunk) [H][cs.n][V][K]
    size_t bytes;       // of ws (everything, or what is not in p->ws_fwd)
    size_t fwd_bytes;   // of the forward's part (coff … ckpt)
};
// base = NULL: only sizes (bytes); backward adds the backward arrays; the forward's part
// is carved from p->ws_fwd when set
KWs kda_ws_layout(const kda_params *p, void *base, int backward);
KSeq kda_seq(const kda_params *p, const KWs &w);
cudaError_t kda_offsets(const kda_params *p, const KWs &w);
int kda_num_sms(void);
// the parameters every entry point needs (kda_fwd.cu): cudaErrorInvalidValue for a shape, gate or
// workspace the kernels do not take, cudaErrorMisalignedAddress for q, k or v not 16-byte aligned
cudaError_t kda_check_params(const kda_params *p);
// pipeline stages for a scan launch of `blocks` blocks of stage_bytes per stage (+ fixed bytes,
// + the TMA ring's alignment and mbarriers when wg)
int kda_scan_stages(long long blocks, int stage_bytes, int fixed_bytes, bool wg);
// time segments of the forward scan (kda_fwd.cu): 1, or nseg > 1 for a two-level scan
int kda_scan_segs(const kda_params *p);
// chunks per step of the scans (kda_fwd.cu): 1, or KDA_SEG for 64-token steps over the merged
// W~, U~ of kda_merge.cu
int kda_scan_group(const kda_params *p);
// the scans keep every chunk's state (KWs::cstates): 1 unless KDA_SPLIT, 64-token steps or
// KDA_CSTATES=0 (kda_fwd.cu)
int kda_chunk_states(const kda_params *p);
// chunks per group of the value products (CSlots): KDA_VGROUP (1, 2 or 4), 2 unless set (kda_fwd.cu)
int kda_vgroup(void);
// W~, U~ of every 64-token group from the prep kernel's W, U, KrT, gl (kda_merge.cu)
cudaError_t kda_launch_merge(const kda_params *p, const KWs &w);
// the two-level scans' serial carry over the segments (kda_fwd.cu). Forward: segS0[σ] =
// the state entering segment σ (from S0), through segA and segL. Backward (rev): segS0[σ] =
// dS leaving segment σ (from dS_out), through segAᵀ and the local dS in segL.
// from1 (forward only): from segment 1, whose initial state is already in segS0 (launch_scan_first)
cudaError_t kda_seg_carry(const kda_params *p, const KWs &w, bool rev, bool from1 = false);

#endif
