// matmul.cu — the linear layer and the per-head products of MLA decode through cuBLAS.
// The linear layer follows lm_cuda_gemm_mode(): bf16 (default) multiplies bf16 operands on
// tensor cores with fp32 accumulation into the fp32 output (products of ≥ 64 rows; see
// use_bf16) — the activations rounded into the workspace per call, the weights from
// weight_cache.cu's bf16 copies (fp32 masters stay; a copy is remade after the weights
// change, i.e. once per optimizer step); fp32 / tf32 run SGEMM.
//
// Row-major X [m, n] is column-major Xᵀ with leading dimension n, so each row-major
// product below is issued as the column-major product of the transposes.
#include "cuda_common.cuh"
#include <cuda_bf16.h>
#include <string.h>

// Skinny products (decode: a few rows) stay on SGEMM (TF32 in the bf16 mode): they are
// bound by reading the weights, which SGEMM reads once in fp32, while the bf16 path would
// read them, write a bf16 copy and read that (2× the bytes, and two more launches).
#define BF16_MIN_ROWS 64
static int use_bf16(int N) { return lm_cuda_gemm_mode() == LM_GEMM_BF16 && N >= BF16_MIN_ROWS; }

// column-major C [m,n] (beta 0 or 1) = op(A) · op(B), bf16 operands, fp32 accumulate and C
static void gemm_bf16(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const __nv_bfloat16 *A,
                      int lda, const __nv_bfloat16 *B, int ldb, float beta, float *C, int ldc) {
    const float one = 1.0f;
    cublasCheck(cublasGemmEx(lm_cublas(), ta, tb, m, n, k, &one, A, CUDA_R_16BF, lda, B, CUDA_R_16BF, ldb, &beta, C,
                             CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// column-major D [m,n] = Aᵀ · B + R (A [k,m] ld k, B [k,n] ld k: bf16; R, D fp32, ld m; R ≠ D)
// through cuBLASLt, whose epilogue reads R (cublasGemmEx's C is also its output). The plan of
// a shape — descriptors and the chosen algorithm, for the pointers' alignment — is made once
// and kept among the LT_PLANS most recently used (prefill chunks and eval batches bring new
// row counts; the least recently used plan gives way). gemm_bf16_res returns 0 when cuBLASLt
// offers no algorithm (the caller adds R itself).
#define LT_PLANS 64
struct LtPlan {
    int m, n, k, align;
    unsigned long used;   // the plan clock at its last use (the least recent gives way)
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, cd;
    cublasLtMatmulAlgo_t algo;
    int ok;
};
static LtPlan g_lt[LT_PLANS];
static int g_nlt;
static unsigned long g_lt_clock;
static long g_lt_fused;   // residuals added in the epilogue (lm_cuda_linears_res_fused)
// the largest power of two up to 256 dividing every address (cuBLASLt's alignment preference)
static int lt_align(const void *const *p, int n) {
    uintptr_t bits = 256;
    for (int i = 0; i < n; i++) bits |= (uintptr_t)p[i];
    return (int)(bits & (~bits + 1));
}
static void lt_plan_free(LtPlan *P) {
    if (P->op) cublasLtMatmulDescDestroy(P->op);
    if (P->a) cublasLtMatrixLayoutDestroy(P->a);
    if (P->b) cublasLtMatrixLayoutDestroy(P->b);
    if (P->cd) cublasLtMatrixLayoutDestroy(P->cd);
    memset(P, 0, sizeof *P);
}
void lm_cuda_lt_plans_free(void) {
    for (int i = 0; i < g_nlt; i++) lt_plan_free(&g_lt[i]);
    g_nlt = 0;
}
static const LtPlan *lt_plan(int m, int n, int k, int align) {
    g_lt_clock++;
    for (int i = 0; i < g_nlt; i++)
        if (g_lt[i].m == m && g_lt[i].n == n && g_lt[i].k == k && g_lt[i].align == align) {
            g_lt[i].used = g_lt_clock;
            return &g_lt[i];
        }
    LtPlan *P = &g_lt[g_nlt < LT_PLANS ? g_nlt++ : 0];
    if (g_nlt == LT_PLANS && P->op) {   // full: the least recently used plan gives way
        for (int i = 1; i < LT_PLANS; i++)
            if (g_lt[i].used < P->used) P = &g_lt[i];
        lt_plan_free(P);
    }
    P->m = m, P->n = n, P->k = k, P->align = align, P->used = g_lt_clock;
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescCreate(&P->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasCheck(cublasLtMatmulDescSetAttribute(P->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    cublasCheck(cublasLtMatmulDescSetAttribute(P->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    cublasCheck(cublasLtMatrixLayoutCreate(&P->a, CUDA_R_16BF, k, m, k));
    cublasCheck(cublasLtMatrixLayoutCreate(&P->b, CUDA_R_16BF, k, n, k));
    cublasCheck(cublasLtMatrixLayoutCreate(&P->cd, CUDA_R_32F, m, n, m));
    cublasLtMatmulPreference_t pref;
    cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws_bytes;
    lm_cublas_workspace(&ws_bytes);
    const uint32_t al = (uint32_t)align;
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                     sizeof ws_bytes));
    const cublasLtMatmulPreferenceAttributes_t als[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++) cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, als[i], &al, sizeof al));
    cublasLtMatmulHeuristicResult_t r[8];
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lm_cublaslt(), P->op, P->a, P->b, P->cd, P->cd, pref, 8, r,
                                                       &found);
    cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
    if (st != CUBLAS_STATUS_NOT_SUPPORTED) cublasCheck(st);   // (a descriptor error is ours)
    P->ok = st == CUBLAS_STATUS_SUCCESS && found > 0;
    // the first 128 × 128-tile algorithm, else the first: the heuristic ranks 256 × 128 tiles
    // first, whose epilogue's read of R is not hidden (bench_linres, H200, N 16384 → 1024 from
    // C 1024 / 4096 / 256, the input's rounding included, µs: 256 × 128 128.0 / 320.9 / 80.6,
    // 128 × 128 88.2 / 304.5 / 50.1, the product alone 86.8 / 280.4 / 38.1, then + the add op
    // 136.3 / 335.0 / 88.5; with the input's bf16 copy given, as in training: 128 × 128
    // 65.5–65.9 / 222–231 / 41.8–41.9 against 109.6–110.3 / 262–263 / 79.5–79.8)
    if (P->ok) P->algo = r[0].algo;
    for (int i = 0; P->ok && i < found; i++) {
        int tile = 0;
        size_t w;
        cublasCheck(
            cublasLtMatmulAlgoConfigGetAttribute(&r[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w));
        if (tile == CUBLASLT_MATMUL_TILE_128x128) {
            P->algo = r[i].algo;
            break;
        }
    }
    return P;
}
static int gemm_bf16_res(int m, int n, int k, const __nv_bfloat16 *A, const __nv_bfloat16 *B, const float *R,
                         float *D) {
    const void *ptrs[4] = {A, B, R, D};
    const LtPlan *P = lt_plan(m, n, k, lt_align(ptrs, 4));
    if (!P->ok) return 0;
    size_t ws_bytes;
    void *ws = lm_cublas_workspace(&ws_bytes);
    const float one = 1.0f;
    cublasCheck(cublasLtMatmul(lm_cublaslt(), P->op, &one, A, P->a, B, P->b, &one, R, P->cd, D, P->cd, &P->algo, ws,
                               ws_bytes, lm_cuda_stream()));
    g_lt_fused++;
    return 1;
}
long lm_cuda_linears_res_fused(void) { return g_lt_fused; }

__global__ static void add_bias_k(float *out, const float *bias, int N, int OC) {
    size_t n = (size_t)N * OC;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x)
        out[e] += bias[e % OC];
}

// out [N,OC] = inp [N,C] · W [OC,C]ᵀ + bias [OC]
void cuda_matmul_fwd(real *out, const real *inp, const real *W, const real *bias, int N, int C, int OC) {
    if (N <= 0 || OC <= 0) return;
    lm_linears L = {.n = 1, .OC = {OC}, .W = {W}, .out = {out}};
    cuda_linears_fwd(&L, inp, N, C);
    if (bias) {
        add_bias_k<<<lm_cuda_blocks((size_t)N * OC, 256), 256, 0, lm_cuda_stream()>>>(out, bias, N, OC);
        cudaLaunchCheck();
    }
}

// ---- a few rows (decode steps): the whole list in one launch ----
// cuBLAS ran a one-token step's list (a KDA layer: 6 projections of xn, down to OC = 8) as
// 10 gemv / dot + reduce launches of 3–5 µs for ~3 µs of weight reads (ncu, session 22). Here
// a warp takes one output column of one linear: its fp32 weight row against the N ≤ FEW_N
// input rows held in shared memory, fp32 products, lane partials over k ≡ lane (mod 32) in
// float4 steps then a butterfly — an order of its own, as cuBLAS has its own.
#define FEW_N 8
#define FEW_WARPS 8
struct FewList {
    const float *W[LM_MAX_LINEARS];
    float *out[LM_MAX_LINEARS];
    int col0[LM_MAX_LINEARS + 1];   // the list's columns: linear i has [col0[i], col0[i+1])
    int n;
};
// grid ⌈col0[n] / FEW_WARPS⌉ blocks of 32·FEW_WARPS threads; N·C floats of dynamic shared memory
template <int NR>
__global__ static void __launch_bounds__(32 * FEW_WARPS) few_rows_linears_k(FewList L, const float *x, int C) {
    extern __shared__ __align__(16) float xs[];   // [NR][C]
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int j = blockIdx.x * FEW_WARPS + warp;
    const bool active = j < L.col0[L.n];
    int i = 0;
    while (active && j >= L.col0[i + 1]) i++;
    const int o = active ? j - L.col0[i] : 0, OC = L.col0[i + 1] - L.col0[i];
    const float *w = L.W[i] + (size_t)o * C;
    const bool wvec = active && C % 4 == 0 && (uintptr_t)w % 16 == 0;
    // FEW_U 16-byte loads in flight per lane before their products (one at a time left the
    // kernel latency-bound), the first FEW_U issued before the block stages the inputs
    constexpr int FEW_U = 8;
    float4 wv[FEW_U];
    auto load_batch = [&](int k0) {
#pragma unroll
        for (int u = 0; u < FEW_U; u++)
            wv[u] = k0 + 128 * u < C ? __ldg(reinterpret_cast<const float4 *>(w + k0 + 128 * u))
                                     : make_float4(0.f, 0.f, 0.f, 0.f);
    };
    if (wvec) load_batch(4 * lane);
    if (C % 4 == 0 && (uintptr_t)x % 16 == 0)
        for (int e = threadIdx.x; e < NR * C / 4; e += blockDim.x)
            reinterpret_cast<float4 *>(xs)[e] = __ldg(reinterpret_cast<const float4 *>(x) + e);
    else
        for (int e = threadIdx.x; e < NR * C; e += blockDim.x) xs[e] = x[e];
    __syncthreads();
    if (!active) return;
    float acc[NR];
#pragma unroll
    for (int r = 0; r < NR; r++) acc[r] = 0.f;
    if (wvec) {
        for (int k0 = 4 * lane; k0 < C; k0 += 128 * FEW_U) {
            if (k0 != 4 * lane) load_batch(k0);
#pragma unroll
            for (int u = 0; u < FEW_U; u++) {
                const int k = k0 + 128 * u;
                if (k >= C) break;
#pragma unroll
                for (int r = 0; r < NR; r++) {
                    const float4 xv = *reinterpret_cast<const float4 *>(xs + r * C + k);
                    acc[r] = fmaf(wv[u].x, xv.x, fmaf(wv[u].y, xv.y, fmaf(wv[u].z, xv.z, fmaf(wv[u].w, xv.w, acc[r]))));
                }
            }
        }
    } else {
        for (int k = lane; k < C; k += 32) {
            const float wk = __ldg(w + k);
#pragma unroll
            for (int r = 0; r < NR; r++) acc[r] = fmaf(wk, xs[r * C + k], acc[r]);
        }
    }
#pragma unroll
    for (int r = 0; r < NR; r++)
#pragma unroll
        for (int s = 16; s > 0; s >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], s);
    if (lane < NR) {   // lane r writes row r (every lane holds every sum after the butterfly)
#pragma unroll
        for (int r = 0; r < NR; r++)
            if (r == lane) L.out[i][(size_t)r * OC + o] = acc[r];
    }
}

// 1 if the list ran here: N ≤ FEW_N rows whose inputs fit in shared memory
static int few_rows_linears(const lm_linears *L, const real *inp, int N, int C) {
    if (N > FEW_N || C <= 0 || (size_t)N * C * sizeof(float) > 48 * 1024) return 0;
    FewList f;
    f.n = 0;
    f.col0[0] = 0;
    for (int i = 0; i < L->n; i++) {
        if (L->OC[i] <= 0) continue;
        f.W[f.n] = L->W[i];
        f.out[f.n] = L->out[i];
        f.col0[f.n + 1] = f.col0[f.n] + L->OC[i];
        f.n++;
    }
    if (!f.n) return 1;
    const unsigned blocks = (unsigned)((f.col0[f.n] + FEW_WARPS - 1) / FEW_WARPS);
    const size_t sm = (size_t)N * C * sizeof(float);
    cudaStream_t st = lm_cuda_stream();
    switch (N) {
#define FEW_CASE(n) case n: few_rows_linears_k<n><<<blocks, 32 * FEW_WARPS, sm, st>>>(f, inp, C); break;
        FEW_CASE(1) FEW_CASE(2) FEW_CASE(3) FEW_CASE(4) FEW_CASE(5) FEW_CASE(6) FEW_CASE(7) FEW_CASE(8)
#undef FEW_CASE
    }
    cudaLaunchCheck();
    return 1;
}

// out_i [N,OC_i] = (res_i +) inp [N,C] · W_i [OC_i,C]ᵀ; in the bf16 mode inp is rounded once
// for the list, and a res_i added in the GEMM's epilogue (else by an add pass after it)
void cuda_linears_fwd(const lm_linears *L, const real *inp, int N, int C) {
    if (N <= 0) return;
    for (int i = 0; i < L->n; i++)
        LM_CHECK(!L->res[i] || L->res[i] != L->out[i], "linears_fwd: res aliases its output");
    if (few_rows_linears(L, inp, N, C)) {
        for (int i = 0; i < L->n; i++)
            if (L->res[i] && L->OC[i] > 0) cuda_add(L->out[i], L->res[i], L->out[i], (size_t)N * L->OC[i]);
        return;
    }
    const float one = 1.0f, zero = 0.0f;
    const __nv_bfloat16 *xb = NULL;
    for (int i = 0; i < L->n; i++) {
        const int OC = L->OC[i];
        float *out = L->out[i];
        const float *res = L->res[i];
        if (OC <= 0) continue;
        int res_added = 0;
        if (C <= 0) {
            cudaCheck(cudaMemsetAsync(out, 0, (size_t)N * OC * sizeof(float), lm_cuda_stream()));
        } else if (use_bf16(N)) {   // column-major: outᵀ [OC,N] = W (Wᵀ stored [C,OC]) ᵀ · inpᵀ [C,N]
            const __nv_bfloat16 *wb = lm_cuda_weight_bf16(L->W[i], (size_t)OC * C);
            if (!xb && L->lo && L->lo_filled) {   // inp's producer wrote its bf16 copy
                xb = (const __nv_bfloat16 *)L->lo;
            } else if (!xb) {   // into the list's lo when it has one: the backward's weight gradients read it there
                __nv_bfloat16 *x = L->lo ? (__nv_bfloat16 *)L->lo : (__nv_bfloat16 *)lm_cuda_scratch((size_t)N * C * 2);
                lm_cuda_to_bf16(x, inp, (size_t)N * C);
                xb = x;
            }
            if (res) res_added = gemm_bf16_res(OC, N, C, wb, xb, res, out);
            if (!res_added) gemm_bf16(CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, wb, C, xb, C, 0.0f, out, OC);
        } else {
            cublasCheck(cublasSgemm(lm_cublas(), CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, &one, L->W[i], C, inp, C, &zero,
                                    out, OC));
        }
        if (res && !res_added) cuda_add(out, res, out, (size_t)N * OC);
    }
}

struct col_of_rows {   // f(i, o) = dout[i, o]
    const float *x;
    int ld;
    __device__ float operator()(int i, int o) const { return x[(size_t)i * ld + o]; }
};

// dinp [N,C] += dout · W ; dW [OC,C] += doutᵀ · inp ; dbias [OC] += Σ_rows dout
void cuda_matmul_bwd(real *dinp, real *dW, real *dbias, const real *dout, const real *inp, const real *W,
                     int N, int C, int OC) {
    if (N <= 0) return;
    lm_linears L = {.n = 1, .OC = {OC}, .W = {W}, .dout = {dout}, .dW = {dW}};
    cuda_linears_bwd(&L, dinp, inp, N, C);
    if (dbias && OC > 0) {
        float *ws = (float *)lm_cuda_scratch(colsum_ws_floats(N, OC) * sizeof(float));
        float *sums = colsum(ws, N, OC, col_of_rows{dout, OC});
        lm_cuda_acc_vec(dbias, sums, NULL, OC);
    }
}

// dinp [N,C] += Σ_i dout_i · W_i (= with L->dinp_assign) ; dW_i [OC_i,C] += dout_iᵀ · inp. In the bf16 mode inp is
// rounded once for the list (only if some dW_i is wanted), and the dout_i into the column
// blocks of one [N, ΣOC_i] matrix, so dinp takes one product against the list's weights
// stacked [ΣOC_i, C] (their bf16 copies, copied per call: ΣOC_i·C·2 bytes): dinp is read and
// written once, not once per linear (a KDA layer's list has six, down to OC = 8 for β).
void cuda_linears_bwd(const lm_linears *L, real *dinp, const real *inp, int N, int C) {
    if (N <= 0 || C <= 0) return;
    const float one = 1.0f, zero = 0.0f;
    int dinp_products = 0;
    for (int i = 0; i < L->n; i++) dinp_products += L->OC[i] > 0;
    if (dinp && L->dinp_assign && !dinp_products)   // nothing to write it with: zeros
        cudaCheck(cudaMemsetAsync(dinp, 0, (size_t)N * C * sizeof(float), lm_cuda_stream()));
    if (use_bf16(N)) {
        int soc = 0, any_dw = 0;
        for (int i = 0; i < L->n; i++) {
            if (L->OC[i] <= 0 || (!dinp && !L->dW[i])) continue;
            soc += L->OC[i];
            any_dw |= L->dW[i] != NULL;
        }
        if (!soc) return;   // (dinp: no products, zeroed above if written)
        const size_t nx = (size_t)N * C, bx = lm_align256(nx * 2), bd = lm_align256((size_t)N * soc * 2);
        char *ws = (char *)lm_cuda_scratch(bx + bd + (dinp ? (size_t)soc * C * 2 : 0));
        const __nv_bfloat16 *xb = (const __nv_bfloat16 *)ws;
        __nv_bfloat16 *db = (__nv_bfloat16 *)(ws + bx), *wcat = (__nv_bfloat16 *)(ws + bx + bd);
        if (any_dw && L->lo) xb = (const __nv_bfloat16 *)L->lo;   // the forward's copy of this inp
        else if (any_dw) lm_cuda_to_bf16((__nv_bfloat16 *)ws, inp, nx);
        // dout_lo: the producers' bf16 rows (a list of one: all of them; else the blocks flagged
        // in dout_lo_filled), whose column blocks assume every linear with OC > 0 takes part
        LM_CHECK(!L->dout_lo || L->n == 1 || dinp, "cuda linears_bwd: dout_lo with a list of %d and no dinp", L->n);
        if (L->dout_lo) db = (__nv_bfloat16 *)L->dout_lo;
        for (int i = 0, off = 0; i < L->n; i++) {
            const int OC = L->OC[i];
            if (OC <= 0 || (!dinp && !L->dW[i])) continue;
            const int filled = L->dout_lo && (L->n == 1 || (L->dout_lo_filled >> i & 1u));
            if (!filled) lm_cuda_to_bf16_rows(db + off, soc, L->dout[i], N, OC);
            if (dinp)
                cudaCheck(cudaMemcpyAsync(wcat + (size_t)off * C, lm_cuda_weight_bf16(L->W[i], (size_t)OC * C),
                                          (size_t)OC * C * 2, cudaMemcpyDeviceToDevice, lm_cuda_stream()));
            // dW_iᵀ [C,OC] += inpᵀ [C,N] · dout_i [N,OC] (its column block of db, leading dimension ΣOC)
            if (L->dW[i]) gemm_bf16(CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, xb, C, db + off, soc, 1.0f, L->dW[i], C);
            off += OC;
        }
        // dinpᵀ [C,N] += W_catᵀ [C,ΣOC] · doutᵀ [ΣOC,N]
        if (dinp) gemm_bf16(CUBLAS_OP_N, CUBLAS_OP_N, C, N, soc, wcat, C, db, soc, L->dinp_assign ? 0.0f : 1.0f, dinp, C);
        return;
    }
    // (a GEMM mode changed between the forward and this backward: dout_lo holds bf16 bits)
    LM_CHECK(!L->dout_lo, "cuda linears_bwd: output gradient in bf16 (dout_lo) outside the bf16 GEMM mode");
    for (int i = 0, first = 1; i < L->n; i++) {
        const int OC = L->OC[i];
        if (OC <= 0) continue;
        if (dinp)
            cublasCheck(cublasSgemm(lm_cublas(), CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, &one, L->W[i], C, L->dout[i], OC,
                                    first && L->dinp_assign ? &zero : &one, dinp, C));
        first = 0;
        if (L->dW[i])
            cublasCheck(cublasSgemm(lm_cublas(), CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, &one, inp, C, L->dout[i], OC,
                                    &one, L->dW[i], C));
    }
}

size_t cuda_linears_lo_bytes(int N, int C) { return use_bf16(N) && C > 0 ? (size_t)N * C * 2 : 0; }

// out [N,H,OC] = per head h: inp[:,h,:] [N,C] times W_h = W + h·w_head_stride
//   transpose = 0: W_h [OC,C], out = inp·W_hᵀ;  transpose = 1: W_h [C,OC], out = inp·W_h
// One strided-batched SGEMM over the heads.
void cuda_head_matmul(real *out, const real *inp, const real *W, int N, int H, int C, int OC,
                      long w_head_stride, int transpose) {
    if (N <= 0 || H <= 0 || OC <= 0) return;
    if (C <= 0) {
        cudaCheck(cudaMemsetAsync(out, 0, (size_t)N * H * OC * sizeof(float), lm_cuda_stream()));
        return;
    }
    const float one = 1.0f, zero = 0.0f;
    if (transpose)   // outᵀ [OC,N] = W_hᵀ-as-stored [OC,C] · inpᵀ [C,N]
        cublasCheck(cublasSgemmStridedBatched(lm_cublas(), CUBLAS_OP_N, CUBLAS_OP_N, OC, N, C, &one, W, OC,
                                              (long long)w_head_stride, inp, H * C, C, &zero, out, H * OC, OC, H));
    else             // outᵀ [OC,N] = (W_h stored [C,OC])ᵀ · inpᵀ [C,N]
        cublasCheck(cublasSgemmStridedBatched(lm_cublas(), CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, &one, W, C,
                                              (long long)w_head_stride, inp, H * C, C, &zero, out, H * OC, OC, H));
}
