// moe_gemm.cu — the grouped expert GEMMs of the MoE layer (ops.h grouped_matmul_fwd/bwd and
// grouped_matmul2_fwd/bwd, two weights on one input).
//
//   fwd:  out [R,OC]  = per expert e, rows offsets[e]..offsets[e+1] of inp [R,C] · W[e]ᵀ
//   bwd:  dinp [R,C] += dout [R,OC] · W[e]        (same rows)
//         dW[e] [OC,C] += doutᵀ · inp             (summed over the expert's rows)
//   W [E,OC,C]; every tensor fp32 in device memory; offsets [E+1] read on the device only.
//
// Three kernels:
//   * the wgmma kernels of moe_gemm_tma.cu (forward) and moe_gemm_wg.cu (gradients)
//     (LM_GEMM_BF16, the default, when C and OC are multiples of 8): bf16 operands — the
//     activations rounded into the workspace per call (R, the rows allocated, sizes it), the
//     weights from weight_cache.cu's bf16 copies (remade only after the weights change; the
//     input gradient reads the same copy MN-major).
//   * tc_rows_k / tc_dw_k below (LM_MOE_GEMM=mma, and C or OC a multiple of 4 but not 8):
//     bf16 tensor cores on fp32 operands. They stream into shared memory with cp.async (4-stage
//     pipeline); each warp rounds its fragments to bf16 as it reads them (cvt.rn.bf16x2)
//     and multiplies with mma.sync m16n8k16, fp32 accumulation.
//   * gmm_k: plain fp32 CUDA-core tiles (exact; LM_GEMM_FP32 / TF32 modes, and the fallback
//     for shapes the tensor-core kernels do not take: C or OC not a multiple of 4, or
//     pointers not 16-byte aligned).
//
// Fragment trick: the mma's k index may be permuted freely as long as A and B use the same
// permutation. Logical k pairs (2t,2t+1) and (2t+8,2t+9) of thread t (lane%4) are taken
// from physical k 4t..4t+3 of the 16-wide slice, so a K-contiguous operand gives each
// thread its fragment pair with one 16-byte shared load. Operands whose k is the slow
// index (W in dinp; dout and inp in dW) are read with 4-byte loads.
//
// Why bf16 operands (measured on an H200, bench_moe, session 5): with fp32 operands in global
// memory a 128 × 256 tile moves 48 KB from L2 per 2.1 MFLOP of a 32-deep slice, and tc_k runs
// at 200–215 TFLOP/s at Kimi shapes, i.e. ~5 TB/s of L2 → SM traffic. A wgmma kernel that
// rounded each fp32 slice to bf16 once per CTA (commit b674bb6) landed on the same 203–216:
// the operand bytes, not the multiply instructions, set the limit.
//
// Work mapping (no host round trip; the tile lists are graph-friendly, but weight_cache.cu
// decides on the host whether a weight's bf16 copy must be remade, so a captured step would
// replay that decision):
//   fwd, dinp: a one-block kernel turns offsets into tile_start[e] (prefix sum of the
//     expert's 128-row tiles × column tiles) in the workspace; a persistent grid of one
//     CTA per SM walks the global tile list, finding each tile's expert by binary search.
//   dW: grid (OC tiles × C tiles, E); the expert's rows are the k loop, summed in order
//     inside one CTA: deterministic, no atomics. Experts with no rows return at once.
#include "cuda_common.cuh"
#include "moe_gemm.cuh"
#include <cub/block/block_scan.cuh>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// ---------------------------------------------------------------------------
// fp32 kernel (exact): 64×64 tiles, 16-deep k slices, 4×4 outputs per thread, k in order.
//   C[m,n] (= or +=) Σ_k A(m,k)·B(k,n), A(m,k) = A[m·sam + k·sak], B(k,n) = B[k·sbk + n·sbn]
// ROWS_M: the expert's rows are the m range (A and C start at row offsets[e]) and B is
// expert e's weight; else the expert's rows are the k range (A, B start at row
// offsets[e]) and C is expert e's weight gradient.
#define GM_M 64
#define GM_N 64
#define GM_K 16

template <bool ROWS_M, bool ACC>
__global__ static void __launch_bounds__(256) gmm_k(float *C, const float *A, const float *B, const int *offsets,
                                                     int Mfix, int Nn, int Kfix, long sam, long sak, long sbk, long sbn,
                                                     long ldc, long w_stride) {
    __shared__ float As[GM_K][GM_M + 4], Bs[GM_K][GM_N + 4];
    const int e = blockIdx.z, tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const int o0 = offsets[e], ne = offsets[e + 1] - o0;
    const int M = ROWS_M ? ne : Mfix, K = ROWS_M ? Kfix : ne;
    const float *Ae = A + (long)o0 * (ROWS_M ? sam : sak);
    const float *Be = ROWS_M ? B + (long)e * w_stride : B + (long)o0 * sbk;
    float *Ce = ROWS_M ? C + (long)o0 * ldc : C + (long)e * w_stride;
    const int n0 = blockIdx.x * GM_N;
    for (int m0 = blockIdx.y * GM_M; m0 < M; m0 += gridDim.y * GM_M) {
        float acc[4][4];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
        for (int k0 = 0; k0 < K; k0 += GM_K) {
            for (int l = tid; l < GM_M * GM_K; l += 256) {
                int mm, kk;
                if (sak == 1) { mm = l / GM_K; kk = l % GM_K; } else { mm = l % GM_M; kk = l / GM_M; }
                int gm = m0 + mm, gk = k0 + kk;
                As[kk][mm] = gm < M && gk < K ? Ae[(long)gm * sam + (long)gk * sak] : 0.0f;
            }
            for (int l = tid; l < GM_N * GM_K; l += 256) {
                int nn, kk;
                if (sbn == 1) { nn = l % GM_N; kk = l / GM_N; } else { nn = l / GM_K; kk = l % GM_K; }
                int gn = n0 + nn, gk = k0 + kk;
                Bs[kk][nn] = gn < Nn && gk < K ? Be[(long)gk * sbk + (long)gn * sbn] : 0.0f;
            }
            __syncthreads();
#pragma unroll
            for (int kk = 0; kk < GM_K; kk++) {
                float a[4], b[4];
#pragma unroll
                for (int i = 0; i < 4; i++) a[i] = As[kk][ty * 4 + i];
#pragma unroll
                for (int j = 0; j < 4; j++) b[j] = Bs[kk][tx * 4 + j];
#pragma unroll
                for (int i = 0; i < 4; i++)
#pragma unroll
                    for (int j = 0; j < 4; j++) acc[i][j] += a[i] * b[j];
            }
            __syncthreads();
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int gm = m0 + ty * 4 + i;
            if (gm >= M) continue;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int gn = n0 + tx * 4 + j;
                if (gn >= Nn) continue;
                float *c = Ce + (long)gm * ldc + gn;
                *c = ACC ? *c + acc[i][j] : acc[i][j];
            }
        }
    }
}

#define GM_ROW_BLOCKS 16   // blocks per (expert, column tile) walking the expert's row tiles

// ---------------------------------------------------------------------------
// bf16 tensor-core kernel.
//   CTA tile TM × TN = 128 × 256, k slice TK = 32 fp32, 8 warps as 2 (m) × 4 (n), each warp
//   64 × 64 (4 m16 × 8 n8 mma tiles, 128 fp32 accumulators per thread). 4 stages of
//   (128 + 256) × 32 fp32 = 48 KB: 192 KB of shared memory, one CTA per SM.
#define TC_M 128
#define TC_N 256
#define TC_K 32
#define TC_STAGES 4
#define TC_THREADS 256
#define TC_A_FLOATS (TC_M * TC_K)
#define TC_B_FLOATS (TC_N * TC_K)
#define TC_STAGE_FLOATS (TC_A_FLOATS + TC_B_FLOATS)
#define TC_SMEM (TC_STAGES * TC_STAGE_FLOATS * 4)

// Shared layouts (float offsets), XOR-swizzled on 16-byte chunks so that the fragment
// reads below hit 32 distinct banks per wavefront:
//   K-major tile [rows][32]: chunk c (k 4c..4c+3) of row r at chunk c ^ 4·(r&1) — a
//     quarter warp reads rows g, g+1 at chunks s·4+t: the two rows land in opposite halves.
//   k-major tile [32][cols]: chunk c (cols 4c..4c+3) of k row kk at chunk c ^ 2·((kk>>2)&3)
//     — a warp reads k rows 4t+i (t = 0..3) at two adjacent chunks: 8 distinct chunks.
__device__ __forceinline__ int sw_kmaj(int r, int c) { return r * TC_K + ((c ^ ((r & 1) << 2)) << 2); }
__device__ __forceinline__ int sw_mnmaj(int kk, int c, int cols) { return kk * cols + ((c ^ (((kk >> 2) & 3) << 1)) << 2); }

__device__ __forceinline__ void tc_cp16(float *sdst, const float *gsrc, bool valid) {
    unsigned s = (unsigned)__cvta_generic_to_shared(sdst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gsrc), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void tc_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int N> __device__ __forceinline__ void tc_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// two fp32 → one bf16x2 register, lo in the low half (the smaller logical k)
__device__ __forceinline__ uint32_t tc_pack(float lo, float hi) {
    uint32_t r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ void tc_mma(float c[4], const uint32_t a[4], const uint32_t b[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// One operand tile: ROWS rows of the m (or n) dimension × TK of k, from global
//   KMAJ: element (r, k) at g[r·ld + k]   (k contiguous)
//   else: element (r, k) at g[k·ld + r]   (r contiguous)
// valid rows r < nr, valid k < nk (both relative to the tile origin g); the rest zero.
template <int ROWS, bool KMAJ>
__device__ __forceinline__ void tc_load(float *s, const float *g, long ld, int nr, int nk, int tid) {
    if (KMAJ) {
#pragma unroll
        for (int it = 0; it < ROWS * 8 / TC_THREADS; it++) {
            int l = tid + it * TC_THREADS, r = l >> 3, c = l & 7;
            bool v = r < nr && 4 * c < nk;
            tc_cp16(s + sw_kmaj(r, c), v ? g + (long)r * ld + 4 * c : g, v);
        }
    } else {
        constexpr int CPR = ROWS / 4;   // chunks per k row
#pragma unroll
        for (int it = 0; it < ROWS * 8 / TC_THREADS; it++) {
            int l = tid + it * TC_THREADS, kk = l / CPR, c = l % CPR;
            bool v = kk < nk && 4 * c < nr;
            tc_cp16(s + sw_mnmaj(kk, c, ROWS), v ? g + (long)kk * ld + 4 * c : g, v);
        }
    }
}

// A fragment (m16 × k16 slice s of the stage) for rows r0..r0+15: a[0] (r0+g, k 4t,4t+1),
// a[1] (r0+g+8, same k), a[2] (r0+g, k 4t+2,4t+3), a[3] (r0+g+8, same k)
template <bool KMAJ>
__device__ __forceinline__ void tc_frag_a(uint32_t a[4], const float *s, int r0, int ks, int g, int t) {
    if (KMAJ) {
        float4 x = *reinterpret_cast<const float4 *>(s + sw_kmaj(r0 + g, ks * 4 + t));
        float4 y = *reinterpret_cast<const float4 *>(s + sw_kmaj(r0 + g + 8, ks * 4 + t));
        a[0] = tc_pack(x.x, x.y); a[1] = tc_pack(y.x, y.y);
        a[2] = tc_pack(x.z, x.w); a[3] = tc_pack(y.z, y.w);
    } else {
        float v[2][4];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int r = r0 + g + 8 * h;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int kk = ks * 16 + 4 * t + i;
                v[h][i] = s[sw_mnmaj(kk, r >> 2, TC_M) + (r & 3)];
            }
        }
        a[0] = tc_pack(v[0][0], v[0][1]); a[1] = tc_pack(v[1][0], v[1][1]);
        a[2] = tc_pack(v[0][2], v[0][3]); a[3] = tc_pack(v[1][2], v[1][3]);
    }
}
// B fragment (n8 × k16) for column n0+g: b[0] (k 4t,4t+1), b[1] (k 4t+2,4t+3)
template <bool KMAJ>
__device__ __forceinline__ void tc_frag_b(uint32_t b[2], const float *s, int n0, int ks, int g, int t) {
    const int n = n0 + g;
    if (KMAJ) {
        float4 x = *reinterpret_cast<const float4 *>(s + sw_kmaj(n, ks * 4 + t));
        b[0] = tc_pack(x.x, x.y); b[1] = tc_pack(x.z, x.w);
    } else {
        float v[4];
#pragma unroll
        for (int i = 0; i < 4; i++) v[i] = s[sw_mnmaj(ks * 16 + 4 * t + i, n >> 2, TC_N) + (n & 3)];
        b[0] = tc_pack(v[0], v[1]); b[1] = tc_pack(v[2], v[3]);
    }
}

// One CTA tile: Cout [M,N] (ldc) (= or +=) A·Bᵀ over k < K with
//   A: element (m, k) at A[m·lda + k] (A_KMAJ) or A[k·lda + m];  valid m < M
//   B: element (n, k) at B[n·ldb + k] (B_KMAJ) or B[k·ldb + n];  valid n < N
// (A, B, Cout already point at the tile origin; M, N count from there.)
template <bool A_KMAJ, bool B_KMAJ, bool ACC>
__device__ __forceinline__ void tc_tile(float *smem, float *Cout, long ldc, const float *A, long lda, const float *B,
                                        long ldb, int M, int N, int K) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wm = (warp & 1) * 64, wn = (warp >> 1) * 64;
    const int KT = (K + TC_K - 1) / TC_K;
    float acc[4][8][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) acc[i][j][q] = 0.0f;

    auto load_stage = [&](int kt) {
        float *s = smem + (kt % TC_STAGES) * TC_STAGE_FLOATS;
        const int k0 = kt * TC_K;
        const float *a = A_KMAJ ? A + k0 : A + (long)k0 * lda;
        const float *b = B_KMAJ ? B + k0 : B + (long)k0 * ldb;
        tc_load<TC_M, A_KMAJ>(s, a, lda, M, K - k0, tid);
        tc_load<TC_N, B_KMAJ>(s + TC_A_FLOATS, b, ldb, N, K - k0, tid);
    };
#pragma unroll
    for (int st = 0; st < TC_STAGES - 1; st++) {
        if (st < KT) load_stage(st);
        tc_commit();   // empty groups keep the wait count uniform
    }
    for (int kt = 0; kt < KT; kt++) {
        tc_wait<TC_STAGES - 2>();
        __syncthreads();   // stage kt visible to all; stage kt-1 free for the refill below
        if (kt + TC_STAGES - 1 < KT) load_stage(kt + TC_STAGES - 1);
        tc_commit();
        const float *sa = smem + (kt % TC_STAGES) * TC_STAGE_FLOATS, *sb = sa + TC_A_FLOATS;
#pragma unroll
        for (int ks = 0; ks < TC_K / 16; ks++) {
            // the A fragments stay in registers; B fragments are read one n8 tile at a time
            // (fewer live registers: 128 accumulators already)
            uint32_t af[4][4];
#pragma unroll
            for (int i = 0; i < 4; i++) tc_frag_a<A_KMAJ>(af[i], sa, wm + 16 * i, ks, g, t);
#pragma unroll
            for (int j = 0; j < 8; j++) {
                uint32_t bf[2];
                tc_frag_b<B_KMAJ>(bf, sb, wn + 8 * j, ks, g, t);
#pragma unroll
                for (int i = 0; i < 4; i++) tc_mma(acc[i][j], af[i], bf);
            }
        }
    }
    tc_wait<0>();
    __syncthreads();   // the next tile of a persistent CTA refills the stages
    // c[0],c[1]: (row g, cols 2t, 2t+1); c[2],c[3]: (row g+8, same cols). N is even.
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int m = wm + 16 * i + g + 8 * h;
            if (m >= M) continue;
            float *crow = Cout + (long)m * ldc;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int n = wn + 8 * j + 2 * t;
                if (n >= N) continue;
                float2 *p = reinterpret_cast<float2 *>(crow + n);
                float2 v = make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
                if (ACC) { float2 o = *p; v.x += o.x; v.y += o.y; }
                *p = v;
            }
        }
}

// tile_start [E+1]: tile_start[e] = Σ_{e'<e} ceil(rows_e' / tm) · ntn (one block; E small)
#define SCHED_THREADS 256
__global__ static void __launch_bounds__(SCHED_THREADS) tc_sched_k(int *tile_start, const int *offsets, int E, int ntn,
                                                                    int tm) {
    typedef cub::BlockScan<int, SCHED_THREADS> Scan;
    __shared__ typename Scan::TempStorage tmp;
    const int tid = threadIdx.x, per = (E + SCHED_THREADS - 1) / SCHED_THREADS;
    int s = 0;
    for (int e = tid * per; e < min(E, (tid + 1) * per); e++) s += (offsets[e + 1] - offsets[e] + tm - 1) / tm * ntn;
    int run, total;
    Scan(tmp).ExclusiveSum(s, run, total);   // block-wide scan (it was a serial loop over 1024 partials)
    if (tid == 0) tile_start[E] = total;
    for (int e = tid * per; e < min(E, (tid + 1) * per); e++) {
        tile_start[e] = run;
        run += (offsets[e + 1] - offsets[e] + tm - 1) / tm * ntn;
    }
}

// Rows-as-m GEMM (fwd, dinp), persistent over the tile list of tc_sched_k:
//   Out [R,N] (= or +=) per expert: A rows [offsets[e], offsets[e+1]) (A [R,K], K-major)
//   times B_e = B + e·w_stride (element (n,k) at n·ldb + k if B_KMAJ, else k·ldb + n).
// Tiles of an expert run m-fastest so that concurrent CTAs share B_e's column slab in L2.
template <bool B_KMAJ, bool ACC>
__global__ static void __launch_bounds__(TC_THREADS, 1)
    tc_rows_k(float *Out, const float *A, const float *B, const int *offsets, const int *tile_start, int E, int N,
              int K, long ldb, long w_stride) {
    extern __shared__ float4 smem4[];
    float *smem = reinterpret_cast<float *>(smem4);
    const int total = tile_start[E];
    for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
        const GroupedTile g = grouped_tile(tile, offsets, tile_start, E, TC_M, TC_N);
        const int e = g.e, o0 = g.o0, rows = g.rows, m0 = g.m0, n0 = g.n0;
        const float *Be = B + (long)e * w_stride + (B_KMAJ ? (long)n0 * ldb : n0);
        tc_tile<true, B_KMAJ, ACC>(smem, Out + (long)(o0 + m0) * N + n0, N, A + (long)(o0 + m0) * K, K, Be, ldb,
                                   rows - m0, N - n0, K);
    }
}

// dW [E, M, N] += per expert Σ over its rows r of A[r, m] · B[r, n]  (A [R,M], B [R,N]):
// grid (ceil(M/TC_M) · ceil(N/TC_N), E)
__global__ static void __launch_bounds__(TC_THREADS, 1)
    tc_dw_k(float *dW, const float *A, const float *B, const int *offsets, int M, int N) {
    extern __shared__ float4 smem4[];
    float *smem = reinterpret_cast<float *>(smem4);
    const int e = blockIdx.y, o0 = offsets[e], rows = offsets[e + 1] - o0;
    if (rows <= 0) return;
    const int ntm = (M + TC_M - 1) / TC_M;
    const int m0 = (blockIdx.x % ntm) * TC_M, n0 = (blockIdx.x / ntm) * TC_N;
    tc_tile<false, false, true>(smem, dW + (long)e * M * N + (long)m0 * N + n0, N, A + (long)o0 * M + m0, M,
                                B + (long)o0 * N + n0, N, M - m0, N - n0, rows);
}

static void tc_setup(void) {
    static int done = 0;
    if (done) return;
    cudaCheck(cudaFuncSetAttribute(tc_rows_k<true, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, TC_SMEM));
    cudaCheck(cudaFuncSetAttribute(tc_rows_k<false, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, TC_SMEM));
    cudaCheck(cudaFuncSetAttribute(tc_dw_k, cudaFuncAttributeMaxDynamicSharedMemorySize, TC_SMEM));
    done = 1;
}
// tile_start of the rows-as-m kernels (tiles of tm rows × tn columns) into ts [E+1]
static void tc_schedule(int *ts, const int *offsets, int E, int N, int tm, int tn) {
    tc_sched_k<<<1, SCHED_THREADS, 0, lm_cuda_stream()>>>(ts, offsets, E, (N + tn - 1) / tn, tm);
    cudaLaunchCheck();
}

// Kernel choice in the bf16 mode: LM_MOE_GEMM=auto|wg256|wg128|wg128x2|mma|tma (benchmarks
// and tests compare them). The wgmma kernels (moe_gemm_wg.cu, moe_gemm_tma.cu) take bf16
// operands: the activations are rounded into the workspace per call, the weights come from
// weight_cache.cu. mma: this file's kernel, fp32 operands rounded as they are read.
// auto: see moe_kernel.
enum { MOE_AUTO, MOE_WG256, MOE_WG128, MOE_WG128X2, MOE_MMA, MOE_TMA, MOE_NKERNELS };
static int g_moe_gemm = -1;
static const char *const MOE_GEMM_NAMES[] = {"auto", "wg256", "wg128", "wg128x2", "mma", "tma"};
int lm_cuda_moe_gemm(void) {
    if (g_moe_gemm < 0) {
        const char *s = getenv("LM_MOE_GEMM");
        g_moe_gemm = MOE_AUTO;
        if (s && *s) {
            g_moe_gemm = -1;
            for (int m = 0; m < MOE_NKERNELS; m++)
                if (strcmp(s, MOE_GEMM_NAMES[m]) == 0) g_moe_gemm = m;
            if (g_moe_gemm < 0) lm_die("LM_MOE_GEMM='%s' is not one of auto, wg256, wg128, wg128x2, mma, tma", s);
        }
    }
    return g_moe_gemm;
}
void lm_cuda_set_moe_gemm(int mode) {
    LM_CHECK(mode >= 0 && mode < MOE_NKERNELS, "bad MoE GEMM kernel %d", mode);
    g_moe_gemm = mode;
}
const char *lm_cuda_moe_gemm_name(int mode) { return mode >= 0 && mode < MOE_NKERNELS ? MOE_GEMM_NAMES[mode] : "?"; }
// The kernel for these shapes and this use (LM_MOE_USE_*): an LM_WG_* configuration, K_TMA,
// K_MMA, or K_FP32. auto (bench_moe, H200; TFLOP/s of the three GEMMs at Kimi shapes, 512
// rows per expert, and at the small preset's, 205 rows):
//   forward: TMA (moe_gemm_tma.cu) — Kimi 390–411 vs 310–327 for the best cp.async kernel
//     (two CTAs of 128 × 128 per SM), small 121–123 vs 120;
//   input gradient into a zeroed buffer (the experts op's deh, dxp): TMA, which writes
//     instead of adding (and takes dxp's two products as one);
//   input gradient added into fp32 (the grouped_matmul ops): two CTAs of 128 × 128 per SM
//     (`wg128x2`) — Kimi dinp 225–236 vs 182–189 for TMA and 164–172 for 128 × 256 tiles;
//     small 74 vs 48: their tiles are short (k = 1024) and the second CTA hides each one's
//     read-modify-write epilogue;
//   weight gradients: TMA (wt_dw_k, session 20) — the experts op's three written: Kimi 375
//     vs 265 for `wg128x2`, small (16K tokens) 465 vs 306 (dw_cfg below).
enum { K_FP32 = 0, K_MMA = 100, K_TMA = 101 };
// LM_MOE_DW=tma|big|pair: auto's weight-gradient kernel (benchmarks). Of the cp.async
// kernels, pair: with the gradients written (lm_experts_grads.dW_assign) 128 × 256 tiles are
// faster at Kimi shapes (bench_moe, H200: the experts op's dW 6.40 vs 7.05 ms) but slower in
// `small` training (B4: 117.3–117.7K vs 118.2–118.8K tok/s, the same call).
static int dw_cfg(void) {
    static int v = -1;
    if (v < 0) {
        const char *s = getenv("LM_MOE_DW");
        v = K_TMA;
        if (s && *s) {
            if (!strcmp(s, "big")) v = LM_WG_BIG;
            else if (!strcmp(s, "pair")) v = LM_WG_PAIR;
            else if (strcmp(s, "tma")) lm_die("LM_MOE_DW='%s' is not tma, big or pair", s);
        }
    }
    return v;
}
static int moe_kernel(int C, int OC, int aligned, int use) {
    if (lm_cuda_gemm_mode() != LM_GEMM_BF16 || C % 4 || OC % 4 || !aligned) return K_FP32;
    int m = lm_cuda_moe_gemm();
    if (m != MOE_MMA && (C % 8 || OC % 8)) m = MOE_MMA;   // wgmma copies 8-element chunks
    switch (m) {
    case MOE_WG256: return LM_WG_BIG;
    case MOE_WG128: return LM_WG_NARROW;
    case MOE_WG128X2: return LM_WG_PAIR;
    case MOE_MMA: return K_MMA;
    case MOE_TMA: return K_TMA;
    default:
        if (use == LM_MOE_USE_DW) return dw_cfg();
        return use == LM_MOE_USE_FWD || use == LM_MOE_USE_DINP_ZEROED ? (int)K_TMA : (int)LM_WG_PAIR;
    }
}

// columns per tile of the rows-as-m kernel `kern` (a wgmma configuration or K_TMA)
static int rows_tile_cols(int kern) { return kern == K_TMA ? lm_wt_tile_cols() : lm_wg_tile_cols(kern); }

// ---- the bf16-operand products, for this file's ops and moe_experts.cu (moe_gemm.cuh) ----
int lm_moe_bf16_kernel(int C, int OC, int aligned, int use) {
    const int kern = moe_kernel(C, OC, aligned, use);
    return kern == K_FP32 || kern == K_MMA ? 0 : kern;
}
void lm_moe_bf16_schedule(int *ts, const int *offsets, int E, int N, int kern) {
    tc_schedule(ts, offsets, E, N, 128, rows_tile_cols(kern));
}
// the cp.async kernels add input gradients: an overwritten Out starts from zeros
static void zero_rows(float *Out, int R, int N) {
    cudaCheck(cudaMemsetAsync(Out, 0, (size_t)R * N * sizeof(float), lm_cuda_stream()));
}
int lm_moe_bf16_out_ok(int kern) { return kern == K_TMA; }
void lm_moe_bf16_rows(int kern, void *Out, const __nv_bfloat16 *A, const __nv_bfloat16 *B, const int *offsets,
                      const int *ts, int E, int R, int N, int K, int dinp, int overwrite, int out_bf16) {
    LM_CHECK(!out_bf16 || (kern == K_TMA && (!dinp || overwrite)), "grouped GEMM: a bf16 output needs the TMA kernel, written");
    if (kern == K_TMA) {
        lm_wt_grouped_rows(Out, A, B, NULL, NULL, offsets, ts, E, R, N, K, 0, dinp, dinp && !overwrite, out_bf16);
        return;
    }
    if (dinp && overwrite) zero_rows((float *)Out, R, N);
    lm_wg_grouped_rows((float *)Out, A, B, offsets, ts, E, N, K, dinp, kern);   // dinp adds
}
void lm_moe_bf16_rows2(int kern, void *Out, const __nv_bfloat16 *A, const __nv_bfloat16 *B, const __nv_bfloat16 *A2,
                       const __nv_bfloat16 *B2, const int *offsets, const int *ts, int E, int R, int N, int K, int K2,
                       int overwrite, int out_bf16) {
    LM_CHECK(!out_bf16 || (kern == K_TMA && overwrite), "grouped GEMM: a bf16 output needs the TMA kernel, written");
    if (kern == K_TMA) {
        lm_wt_grouped_rows(Out, A, B, A2, B2, offsets, ts, E, R, N, K, K2, 1, !overwrite, out_bf16);
        return;
    }
    float *Of = (float *)Out;
    if (overwrite) zero_rows(Of, R, N);
    lm_wg_grouped_rows(Of, A, B, offsets, ts, E, N, K, 1, kern);
    lm_wg_grouped_rows(Of, A2, B2, offsets, ts, E, N, K2, 1, kern);
}
void lm_moe_bf16_dw(int kern, float *dW, const __nv_bfloat16 *dout, float *dW_b, const __nv_bfloat16 *dout_b,
                    const __nv_bfloat16 *inp, const int *offsets, int E, int R, int OC, int C, int assign) {
    if (!dW) dW = dW_b, dout = dout_b, dW_b = NULL;
    if (!dW) return;
    if (kern == K_TMA) {
        lm_wt_grouped_dw(dW, dW_b, dout, dW_b ? dout_b : NULL, inp, offsets, E, R, OC, C, assign);
        return;
    }
    lm_wg_grouped_dw(dW, dout, inp, offsets, E, OC, C, kern, assign);
    if (dW_b) lm_wg_grouped_dw(dW_b, dout_b, inp, offsets, E, OC, C, kern, assign);
}

// ---------------------------------------------------------------------------
// the ops

// The ops take one weight (grouped_matmul) or two sharing the input (grouped_matmul2:
// SwiGLU's gate and up projections), so that the bf16 path rounds the shared input once.
// Below, n products: out[i] / dout[i], W[i], dW[i] for i < n.

// out[i] [R, OC] = per expert segment of inp [R, C] · W[i][e]ᵀ, W[i] [E, OC, C]
static void grouped_fwd(int n, real *const *out, const real *inp, const real *const *W, const int *offsets, int E,
                        int C, int OC, int R) {
    if (E <= 0 || OC <= 0) return;
    LM_CHECK(E <= 65535, "cuda grouped_matmul: %d experts exceed the grid", E);
    int aligned = lm_aligned16({inp});
    for (int i = 0; i < n; i++) aligned &= lm_aligned16({out[i], W[i]});
    const int kern = C > 0 && R > 0 ? moe_kernel(C, OC, aligned, LM_MOE_USE_FWD) : K_FP32;
    if (kern != K_FP32 && kern != K_MMA) {   // A = inp, B_e = W[e] (n = oc, k = c): both K-major
        const size_t ab = lm_align256((size_t)R * C * 2);
        char *ws = (char *)lm_cuda_scratch(ab + (size_t)(E + 1) * sizeof(int));
        __nv_bfloat16 *xb = (__nv_bfloat16 *)ws;
        int *ts = (int *)(ws + ab);
        lm_cuda_to_bf16(xb, inp, (size_t)R * C);
        lm_moe_bf16_schedule(ts, offsets, E, OC, kern);
        for (int i = 0; i < n; i++)
            lm_moe_bf16_rows(kern, out[i], xb, lm_cuda_weight_bf16(W[i], (size_t)E * OC * C), offsets, ts, E, R, OC, C, 0,
                             0, 0);
        return;
    }
    int *ts = NULL;   // the mma kernel's tile list: the same for every product
    if (kern == K_MMA) {
        tc_setup();
        ts = (int *)lm_cuda_scratch((size_t)(E + 1) * sizeof(int));
        tc_schedule(ts, offsets, E, OC, TC_M, TC_N);
    }
    for (int i = 0; i < n; i++) {
        if (kern == K_MMA) {
            tc_rows_k<true, false><<<lm_cuda_num_sms(), TC_THREADS, TC_SMEM, lm_cuda_stream()>>>(
                out[i], inp, W[i], offsets, ts, E, OC, C, C, (long)OC * C);
        } else {
            dim3 grid((OC + GM_N - 1) / GM_N, GM_ROW_BLOCKS, E);
            gmm_k<true, false><<<grid, 256, 0, lm_cuda_stream()>>>(out[i], inp, W[i], offsets, 0, OC, C, C, 1, 1, C,
                                                                    OC, (long)OC * C);
        }
        cudaLaunchCheck();
    }
}

// dinp [R, C] += Σ_i dout[i] · W[i][e];  dW[i] [E, OC, C] += dout[i]ᵀ · inp per segment
static void grouped_bwd(int n, real *dinp, real *const *dW, const real *const *dout, const real *inp,
                        const real *const *W, const int *offsets, int E, int C, int OC, int R) {
    int any_dw = 0, aligned = lm_aligned16({dinp, inp});
    for (int i = 0; i < n; i++) {
        any_dw |= dW[i] != NULL;
        aligned &= lm_aligned16({dW[i], dout[i], W[i]});
    }
    if (E <= 0 || OC <= 0 || C <= 0 || (!dinp && !any_dw)) return;
    LM_CHECK(E <= 65535, "cuda grouped_matmul: %d experts exceed the grid", E);
    const int kern = R > 0 ? moe_kernel(C, OC, aligned, LM_MOE_USE_DINP) : K_FP32;
    const int kdw = R > 0 ? moe_kernel(C, OC, aligned, LM_MOE_USE_DW) : K_FP32;   // the same class as kern
    if (kern != K_FP32 && kern != K_MMA) {
        const size_t db = lm_align256((size_t)R * OC * 2), xb = any_dw ? lm_align256((size_t)R * C * 2) : 0;
        char *ws = (char *)lm_cuda_scratch(n * db + xb + (size_t)(E + 1) * sizeof(int));
        __nv_bfloat16 *inpb = (__nv_bfloat16 *)(ws + n * db);
        int *ts = (int *)(ws + n * db + xb);
        if (any_dw) lm_cuda_to_bf16(inpb, inp, (size_t)R * C);
        if (dinp) lm_moe_bf16_schedule(ts, offsets, E, C, kern);
        for (int i = 0; i < n; i++) {
            if (!dinp && !dW[i]) continue;   // nothing reads this product's gradient
            __nv_bfloat16 *doutb = (__nv_bfloat16 *)(ws + i * db);
            lm_cuda_to_bf16(doutb, dout[i], (size_t)R * OC);
            // rows × C, k = OC: A = dout, B_e = W[e] [OC, C] read MN-major
            if (dinp) {
                const __nv_bfloat16 *wb = lm_cuda_weight_bf16(W[i], (size_t)E * OC * C);
                lm_moe_bf16_rows(kern, dinp, doutb, wb, offsets, ts, E, R, C, OC, 1, 0, 0);
            }
            // OC × C, k = the expert's rows: A = dout, B = inp, both MN-major
            if (dW[i]) lm_moe_bf16_dw(kdw, dW[i], doutb, NULL, NULL, inpb, offsets, E, R, OC, C, 0);
        }
        return;
    }
    int *ts = NULL;   // the mma kernel's dinp tile list: the same for every product
    if (kern == K_MMA) {
        tc_setup();
        if (dinp) {
            ts = (int *)lm_cuda_scratch((size_t)(E + 1) * sizeof(int));
            tc_schedule(ts, offsets, E, C, TC_M, TC_N);
        }
    }
    for (int i = 0; i < n; i++) {
        if (kern == K_MMA) {
            if (dinp) {   // rows × C, k = OC: A = dout (K-major), B_e = W[e] with (n=c, k=oc) at oc·C + c
                tc_rows_k<false, true><<<lm_cuda_num_sms(), TC_THREADS, TC_SMEM, lm_cuda_stream()>>>(
                    dinp, dout[i], W[i], offsets, ts, E, C, OC, C, (long)OC * C);
                cudaLaunchCheck();
            }
            if (dW[i]) {  // OC × C, k = the expert's rows: A = dout (oc contiguous), B = inp (c contiguous)
                dim3 grid(((OC + TC_M - 1) / TC_M) * ((C + TC_N - 1) / TC_N), E);
                tc_dw_k<<<grid, TC_THREADS, TC_SMEM, lm_cuda_stream()>>>(dW[i], dout[i], inp, offsets, OC, C);
                cudaLaunchCheck();
            }
            continue;
        }
        if (dinp) {
            dim3 grid((C + GM_N - 1) / GM_N, GM_ROW_BLOCKS, E);
            gmm_k<true, true><<<grid, 256, 0, lm_cuda_stream()>>>(dinp, dout[i], W[i], offsets, 0, C, OC, OC, 1, C,
                                                                   1, C, (long)OC * C);
            cudaLaunchCheck();
        }
        if (dW[i]) {
            dim3 grid((C + GM_N - 1) / GM_N, (OC + GM_M - 1) / GM_M, E);
            gmm_k<false, true><<<grid, 256, 0, lm_cuda_stream()>>>(dW[i], dout[i], inp, offsets, OC, C, 0, 1, OC, C,
                                                                    1, C, (long)OC * C);
            cudaLaunchCheck();
        }
    }
}

void cuda_grouped_matmul_fwd(real *out, const real *inp, const real *W, const int *offsets, int E, int C, int OC,
                             int R) {
    grouped_fwd(1, &out, inp, &W, offsets, E, C, OC, R);
}
void cuda_grouped_matmul_bwd(real *dinp, real *dW, const real *dout, const real *inp, const real *W,
                             const int *offsets, int E, int C, int OC, int R) {
    grouped_bwd(1, dinp, &dW, &dout, inp, &W, offsets, E, C, OC, R);
}
void cuda_grouped_matmul2_fwd(real *out1, real *out2, const real *inp, const real *W1, const real *W2,
                              const int *offsets, int E, int C, int OC, int R) {
    real *out[2] = {out1, out2};
    const real *W[2] = {W1, W2};
    grouped_fwd(2, out, inp, W, offsets, E, C, OC, R);
}
void cuda_grouped_matmul2_bwd(real *dinp, real *dW1, real *dW2, const real *dout1, const real *dout2,
                              const real *inp, const real *W1, const real *W2, const int *offsets, int E, int C,
                              int OC, int R) {
    real *dW[2] = {dW1, dW2};
    const real *dout[2] = {dout1, dout2}, *W[2] = {W1, W2};
    grouped_bwd(2, dinp, dW, dout, inp, W, offsets, E, C, OC, R);
}
