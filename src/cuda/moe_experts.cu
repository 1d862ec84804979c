// moe_experts.cu — the routed experts as one op (ops.h moe_experts_fwd/bwd, lm_experts).
//
// The separate ops (gather, grouped_matmul2, glu, grouped_matmul, combine) pass fp32 tensors,
// and each grouped GEMM rounds its activations to bf16 in a pass of its own: at Kimi-Linear
// shapes (131072 rows, d 2304, FFN 1024) the forward reads and writes ~3.3 GB that only
// feed those roundings (bench_moe: 0.62 ms of a 4.0 ms expert FFN), the backward ~5 GB more.
// Under the bf16 GEMM mode this op keeps the tensors that only GEMMs read in bf16, written
// by the kernel that makes them:
//   forward:  the gather rounds x's rows as it copies them (xp holds bf16);
//             the GLU writes eh in bf16
//   backward: the combine's backward writes dyp in bf16;
//             the GLU backward writes dea, deb in bf16; xp and eh are the forward's bf16;
//             dx gathers each token's dxp rows by slot_row (the combine's pattern) where
//             the separate op scatters by row_token after a sort
// and where the products run on the TMA kernel (the default), the GEMMs' outputs too (`lo`
// below): ea, eb, yp, deh and dxp come out of the GEMM's epilogue rounded to bf16 (each was an
// fp32 tensor written once and read once or twice by an elementwise kernel: ~0.9 GB a layer of
// the `small` preset at B4). That rounds each product's value once more (2^-9 relative), as
// a bf16 PyTorch model's grouped GEMMs do; the GLU, its backward, the combine and the gate
// gradient compute in fp32 from them. Elsewhere (the cp.async kernels, LM_MOE_GEMM) they stay
// fp32, as the products add into them.
// The bf16 values go into the first half of the fp32 buffers the op is given (xp, ea, eb, eh,
// yp are the backend's by the op's contract; dyp, dea, deb, deh, dxp are work buffers). In the
// fp32 GEMM modes, or for shapes the wgmma kernels do not take, the op is the finer ops in turn
// (ops_experts.h).
#include "cuda_common.cuh"
#include "cuda_backend.h"
#include "moe_gemm.cuh"
#include "ops_experts.h"
#include "ops_math.h"

typedef __nv_bfloat16 bf16;

// eight fp32 → eight bf16 in one 16-byte store
__device__ __forceinline__ void store8_bf16(bf16 *dst, float4 a, float4 b) {
    uint4 v;
    __nv_bfloat162 h;
    h = __floats2bfloat162_rn(a.x, a.y); v.x = *reinterpret_cast<uint32_t *>(&h);
    h = __floats2bfloat162_rn(a.z, a.w); v.y = *reinterpret_cast<uint32_t *>(&h);
    h = __floats2bfloat162_rn(b.x, b.y); v.z = *reinterpret_cast<uint32_t *>(&h);
    h = __floats2bfloat162_rn(b.z, b.w); v.w = *reinterpret_cast<uint32_t *>(&h);
    *reinterpret_cast<uint4 *>(dst) = v;
}

// xpb [R, C] (bf16) = x [N, C] rows by row_token, zeros where row_token < 0; C % 8 == 0,
// vec: x 16-byte aligned
__global__ static void gather_bf16_k(bf16 *xpb, const float *x, const int *row_token, int R, int C, int vec) {
    const int c8 = C / 8;
    const size_t n = (size_t)R * c8;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / c8, c = (i % c8) * 8;
        const int t = row_token[r];
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f), b = a;
        if (t >= 0) a = ld4v(x + (size_t)t * C + c, vec), b = ld4v(x + (size_t)t * C + c + 4, vec);
        store8_bf16(xpb + r * C + c, a, b);
    }
}

// p[0..7] (16-byte aligned) into v: fp32, or bf16 widened
__device__ __forceinline__ void ld8v(const float *p, float (&v)[8]) {
    const float4 a = ld4(p), b = ld4(p + 4);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}
__device__ __forceinline__ void ld8v(const bf16 *p, float (&v)[8]) {
    const float4 a = ld4_bf16(p), b = ld4_bf16(p + 4);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}

// the same rows from x's bf16 copy xb (its producer's rounding, the same values): one 16-byte
// copy per 8 channels, a quarter of the bytes read
__global__ static void gather_lo_k(bf16 *xpb, const bf16 *xb, const int *row_token, int R, int C) {
    const int c8 = C / 8;
    const size_t n = (size_t)R * c8;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / c8, c = (i % c8) * 8;
        const int t = row_token[r];
        *reinterpret_cast<uint4 *>(xpb + r * C + c) =
            t >= 0 ? *reinterpret_cast<const uint4 *>(xb + (size_t)t * C + c) : make_uint4(0u, 0u, 0u, 0u);
    }
}

// hb [n] (bf16) = act(g) ⊙ u; n % 8 == 0; g, u fp32 or bf16 (TI)
template <typename TI>
__global__ static void glu_bf16_k(bf16 *hb, const TI *g, const TI *u, size_t n, int act) {
    for (size_t i = 8 * (blockIdx.x * (size_t)blockDim.x + threadIdx.x); i < n; i += 8 * (size_t)gridDim.x * blockDim.x) {
        float gv[8], uv[8], h[8];
        ld8v(g + i, gv);
        ld8v(u + i, uv);
        for (int j = 0; j < 8; j++) {
            float a, da, b, db;
            lm_glu_parts(gv[j], uv[j], act, &a, &da, &b, &db);
            h[j] = a * b;
        }
        store8_bf16(hb + i, make_float4(h[0], h[1], h[2], h[3]), make_float4(h[4], h[5], h[6], h[7]));
    }
}

// dgb, dub [n] (bf16) = the GLU's gradients, written (the op's work buffers: the finer
// ops zero them and add, this writes); n % 8 == 0; dh, g, u fp32 or bf16 (TI). Rows past
// *rows_used (the plan's offsets[E]: rows no assignment uses) are skipped: their dh was never written
template <typename TI>
__global__ static void glu_bwd_bf16_k(bf16 *dgb, bf16 *dub, const TI *dh, const TI *g, const TI *u, size_t n,
                                      const int *rows_used, int F, int act) {
    const size_t used = (size_t)*rows_used * F;
    n = used < n ? used : n;
    for (size_t i = 8 * (blockIdx.x * (size_t)blockDim.x + threadIdx.x); i < n; i += 8 * (size_t)gridDim.x * blockDim.x) {
        float gv[8], uv[8], hv[8], dg[8], du[8];
        ld8v(g + i, gv);
        ld8v(u + i, uv);
        ld8v(dh + i, hv);
        for (int j = 0; j < 8; j++) {
            float a, da, b, db;
            lm_glu_parts(gv[j], uv[j], act, &a, &da, &b, &db);
            dg[j] = hv[j] * b * da;
            du[j] = hv[j] * a * db;
        }
        store8_bf16(dgb + i, make_float4(dg[0], dg[1], dg[2], dg[3]), make_float4(dg[4], dg[5], dg[6], dg[7]));
        store8_bf16(dub + i, make_float4(du[0], du[1], du[2], du[3]), make_float4(du[4], du[5], du[6], du[7]));
    }
}

// dypb [R, C] (bf16): row slot_row[i·k + t] = gate[i, t] · dy[i] (each row serves one
// (token, slot); rows no slot names are left as they are); C % 8 == 0, vec: dy 16-byte aligned
__global__ static void combine_bwd_bf16_k(bf16 *dypb, const float *dy, const float *gate, const int *slot_row, int N,
                                          int k, int C, int vec) {
    const int c8 = C / 8;
    const size_t n = (size_t)N * k * c8;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t it = i / c8, c = (i % c8) * 8;
        const int r = slot_row[it];
        if (r < 0) continue;
        const float w = gate[it];
        const float *src = dy + (it / k) * C + c;
        float4 a = ld4v(src, vec), b = ld4v(src + 4, vec);
        a.x *= w; a.y *= w; a.z *= w; a.w *= w;
        b.x *= w; b.y *= w; b.z *= w; b.w *= w;
        store8_bf16(dypb + (size_t)r * C + c, a, b);
    }
}

// ---- a few rows (decode steps) ----
// The GEMM kernels tile 128 rows; at a decode step's few rows each of their launches took
// ~17 µs for ~0.5 µs of weight reads (ncu at B1, session 22). Here a block takes one row r and
// 8 columns, a warp one column: the row's expert's weight row (the bf16 copy, K-major) against
// the row's bf16 input in shared memory, fp32 sums — the GEMM kernels' operands and
// accumulation, in another order. GLU: the same columns of W1 and W3, ea and eb rounded to
// bf16 as the GEMMs write them and eh formed from the rounded values (as glu_bf16_k).
// grid (⌈N/8⌉, R), 256 threads, K·2 bytes of dynamic shared memory; K % 8 == 0. Rows past
// offsets[E] (no assignment) are left alone, as by the GEMMs' schedule.
#define FEW_ROWS 16
__device__ __forceinline__ float dot8_bf16(uint4 a, uint4 b) {
    const __nv_bfloat162 *x = reinterpret_cast<const __nv_bfloat162 *>(&a), *y = reinterpret_cast<const __nv_bfloat162 *>(&b);
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const float2 u = __bfloat1622float2(x[j]), v = __bfloat1622float2(y[j]);
        s = fmaf(u.x, v.x, s);
        s = fmaf(u.y, v.y, s);
    }
    return s;
}
template <bool GLU>
__global__ static void __launch_bounds__(256) few_rows_k(bf16 *out, bf16 *ea, bf16 *eb, const bf16 *A, const bf16 *W,
                                                         const bf16 *W3, const int *offsets, int E, int N, int K, int act) {
    extern __shared__ __align__(16) unsigned char few_sm[];
    uint4 *arow = reinterpret_cast<uint4 *>(few_sm);
    const int r = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (r >= offsets[E]) return;
    int e = 0, hi = E;   // the row's expert: offsets[e] ≤ r < offsets[e + 1] (offsets[E] > r)
    while (hi - e > 1) {
        const int mid = (e + hi) >> 1;
        if (offsets[mid] <= r) e = mid;
        else hi = mid;
    }
    const int n = blockIdx.x * 8 + warp;
    const bool active = n < N;
    const uint4 *w = reinterpret_cast<const uint4 *>(W + ((size_t)e * N + (active ? n : 0)) * K);
    const uint4 *w3 = GLU ? reinterpret_cast<const uint4 *>(W3 + ((size_t)e * N + (active ? n : 0)) * K) : w;
    // U 16-byte loads in flight per lane before their products, the first U issued before the
    // block stages the row
    constexpr int U = 4;
    uint4 wv[U], wv3[U];
    auto load_batch = [&](int k0) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const bool in = k0 + 32 * u < K / 8;
            wv[u] = in ? __ldg(w + k0 + 32 * u) : make_uint4(0u, 0u, 0u, 0u);
            if (GLU) wv3[u] = in ? __ldg(w3 + k0 + 32 * u) : make_uint4(0u, 0u, 0u, 0u);
        }
    };
    if (active) load_batch(lane);
    for (int i = threadIdx.x; i < K / 8; i += blockDim.x) arow[i] = reinterpret_cast<const uint4 *>(A + (size_t)r * K)[i];
    __syncthreads();
    if (!active) return;
    float s = 0.f, s3 = 0.f;
    for (int k0 = lane; k0 < K / 8; k0 += 32 * U) {
        if (k0 != lane) load_batch(k0);
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (k0 + 32 * u >= K / 8) break;
            const uint4 av = arow[k0 + 32 * u];
            s += dot8_bf16(wv[u], av);
            if (GLU) s3 += dot8_bf16(wv3[u], av);
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        s += __shfl_xor_sync(0xffffffffu, s, o);
        if (GLU) s3 += __shfl_xor_sync(0xffffffffu, s3, o);
    }
    if (lane) return;
    const size_t at = (size_t)r * N + n;
    if (GLU) {
        const bf16 g = __float2bfloat16(s), u = __float2bfloat16(s3);
        ea[at] = g;
        eb[at] = u;
        float ga, dga, ub, dub;
        lm_glu_parts(__bfloat162float(g), __bfloat162float(u), act, &ga, &dga, &ub, &dub);
        out[at] = __float2bfloat16(ga * ub);
    } else {
        out[at] = __float2bfloat16(s);
    }
}

// The kernels of the bf16 path (forward kf, input gradients into the zeroed work buffers
// ki, weight gradients kw), or 0: the fp32 path. Decided from the modes, the shapes and the
// tensors both directions share, so that a backward finds xp and eh in the form its forward
// wrote (the modes must not change in between).
static int experts_bf16(const lm_experts *ex, int *kf, int *ki, int *kw) {
    const int al = lm_aligned16({ex->W1, ex->W3, ex->W2, ex->xp, ex->ea, ex->eb, ex->eh, ex->yp});
    // the same for both products of each kind: C, F play the same part
    *kf = lm_moe_bf16_kernel(ex->C, ex->F, al, LM_MOE_USE_FWD);
    *ki = lm_moe_bf16_kernel(ex->C, ex->F, al, LM_MOE_USE_DINP_ZEROED);
    *kw = lm_moe_bf16_kernel(ex->C, ex->F, al, LM_MOE_USE_DW);
    return *kf && *ki && *kw && ex->E <= 65535;
}

static unsigned grid_for(size_t n) { return lm_cuda_blocks(n, 256); }

// the GEMMs write ea, eb, yp, deh, dxp in bf16 (the TMA kernel's bf16 epilogue)
static int experts_lo(int kf, int ki) { return lm_moe_bf16_out_ok(kf) && lm_moe_bf16_out_ok(ki); }
int lm_cuda_experts_keep_bf16(int C, int F) {
    int kf, ki, kw;
    lm_experts probe = {.E = 1, .C = C, .F = F};   // alignment: the model's and the tests' buffers are 256-aligned
    return experts_bf16(&probe, &kf, &ki, &kw) && experts_lo(kf, ki);
}

// two tile lists of E + 1 ints in the backend's scratch (for products of F and of C columns)
static int *tile_lists(int E, int **tsC) {
    const size_t one = lm_align256((E + 1) * sizeof(int));
    int *tsF = (int *)lm_cuda_scratch(2 * one);
    *tsC = tsF + one / sizeof(int);
    return tsF;
}

// The expert FFN on the gathered rows (xp, bf16): ea, eb = xp·W1ᵀ, xp·W3ᵀ per expert; eh =
// act(ea) ⊙ eb (bf16); yp = eh·W2ᵀ. ea, eb, yp bf16 where lo (the TMA kernel), else fp32.
static void experts_ffn(const lm_experts *ex, int kf, int lo) {
    const int E = ex->E, C = ex->C, F = ex->F, R = ex->R;
    int *tsC, *tsF = tile_lists(E, &tsC);
    const size_t nw = (size_t)E * F * C, n = (size_t)R * F;
    const bf16 *xpb = (const bf16 *)ex->xp;
    bf16 *ehb = (bf16 *)ex->eh;
    cudaStream_t st = lm_cuda_stream();
    lm_moe_bf16_schedule(tsF, ex->offsets, E, F, kf);
    lm_moe_bf16_schedule(tsC, ex->offsets, E, C, kf);
    lm_moe_bf16_rows(kf, ex->ea, xpb, lm_cuda_weight_bf16(ex->W1, nw), ex->offsets, tsF, E, R, F, C, 0, 0, lo);
    lm_moe_bf16_rows(kf, ex->eb, xpb, lm_cuda_weight_bf16(ex->W3, nw), ex->offsets, tsF, E, R, F, C, 0, 0, lo);
    if (lo) glu_bf16_k<<<grid_for(n / 8), 256, 0, st>>>(ehb, (const bf16 *)ex->ea, (const bf16 *)ex->eb, n, ex->act);
    else glu_bf16_k<<<grid_for(n / 8), 256, 0, st>>>(ehb, ex->ea, ex->eb, n, ex->act);
    cudaLaunchCheck();
    lm_moe_bf16_rows(kf, ex->yp, ehb, lm_cuda_weight_bf16(ex->W2, nw), ex->offsets, tsC, E, R, C, F, 0, 0, lo);
}

void lm_cuda_moe_experts_ffn(const lm_experts *ex) {
    int kf, ki, kw;
    LM_CHECK(experts_bf16(ex, &kf, &ki, &kw) && ex->R > FEW_ROWS,
             "cuda moe_experts_ffn: needs the bf16 GEMM path and more than %d rows", FEW_ROWS);
    experts_ffn(ex, kf, experts_lo(kf, ki));
}

void cuda_moe_experts_fwd(const lm_experts *ex, real *y, const real *x) {
    int kf, ki, kw;
    if (!experts_bf16(ex, &kf, &ki, &kw)) {
        lm_experts_fwd_by_ops(&lm_cuda_ops, ex, y, x);
        return;
    }
    const int E = ex->E, C = ex->C, F = ex->F, R = ex->R;
    if (R <= 0) return;
    cudaStream_t st = lm_cuda_stream();
    bf16 *xpb = (bf16 *)ex->xp, *ehb = (bf16 *)ex->eh;
    if (ex->x_lo && lm_aligned16({ex->x_lo}))
        gather_lo_k<<<grid_for((size_t)R * C / 8), 256, 0, st>>>(xpb, (const bf16 *)ex->x_lo, ex->row_token, R, C);
    else
        gather_bf16_k<<<grid_for((size_t)R * C / 8), 256, 0, st>>>(xpb, x, ex->row_token, R, C, lm_aligned16({x}));
    cudaLaunchCheck();
    const size_t nw = (size_t)E * F * C;
    const int lo = experts_lo(kf, ki);
    if (lo && R <= FEW_ROWS && C % 8 == 0 && F % 8 == 0) {   // a decode step's few rows
        few_rows_k<true><<<dim3((F + 7) / 8, R), 256, (size_t)C * 2, st>>>(
            ehb, (bf16 *)ex->ea, (bf16 *)ex->eb, xpb, lm_cuda_weight_bf16(ex->W1, nw), lm_cuda_weight_bf16(ex->W3, nw),
            ex->offsets, E, F, C, ex->act);
        cudaLaunchCheck();
        few_rows_k<false><<<dim3((C + 7) / 8, R), 256, (size_t)F * 2, st>>>(
            (bf16 *)ex->yp, NULL, NULL, ehb, lm_cuda_weight_bf16(ex->W2, nw), NULL, ex->offsets, E, C, F, 0);
        cudaLaunchCheck();
        lm_cuda_moe_combine_bf16(y, (const bf16 *)ex->yp, ex->gate, ex->slot_row, ex->N, ex->k, C, 0);
        return;
    }
    experts_ffn(ex, kf, lo);
    if (lo) lm_cuda_moe_combine_bf16(y, (const bf16 *)ex->yp, ex->gate, ex->slot_row, ex->N, ex->k, C, 0);
    else cuda_moe_combine_fwd(y, ex->yp, ex->gate, ex->slot_row, ex->N, ex->k, C);
}

void cuda_moe_experts_bwd(const lm_experts *ex, const lm_experts_grads *g, real *dx, const real *dy) {
    int kf, ki, kw;
    if (!experts_bf16(ex, &kf, &ki, &kw)) {
        lm_experts_bwd_by_ops(&lm_cuda_ops, ex, g, dx, dy);
        return;
    }
    LM_CHECK(lm_aligned16({g->dyp, g->deh, g->dea, g->deb, g->dxp}) && g->dyp && g->deh && g->dea && g->deb && g->dxp,
             "cuda moe_experts_bwd: the work buffers must be given and 16-byte aligned (bf16 GEMM mode)");
    const int E = ex->E, C = ex->C, F = ex->F, R = ex->R;
    if (R <= 0) return;
    cudaStream_t st = lm_cuda_stream();
    const bf16 *xpb = (const bf16 *)ex->xp, *ehb = (const bf16 *)ex->eh;
    bf16 *dypb = (bf16 *)g->dyp, *deab = (bf16 *)g->dea, *debb = (bf16 *)g->deb;
    int *tsC, *tsF = tile_lists(E, &tsC);
    const size_t nw = (size_t)E * F * C, n = (size_t)R * F;
    const int lo = experts_lo(kf, ki);
    // dyp = gate · dy by slot (bf16; the rows no slot names stay zero), dgate from yp
    combine_bwd_bf16_k<<<grid_for((size_t)ex->N * ex->k * C / 8), 256, 0, st>>>(dypb, dy, ex->gate, ex->slot_row,
                                                                                ex->N, ex->k, C, lm_aligned16({dy}));
    cudaLaunchCheck();
    if (g->dgate && lo) lm_cuda_moe_dgate_bf16(g->dgate, dy, (const bf16 *)ex->yp, ex->slot_row, ex->N, ex->k, C);
    else if (g->dgate) cuda_moe_combine_bwd(NULL, g->dgate, dy, ex->yp, ex->gate, ex->slot_row, ex->N, ex->k, C);
    // W2: dW2 [E, C, F] += dypᵀ · eh (= with dW_assign, as dW1 and dW3);  deh [R, F] = dyp · W2[e] (overwritten)
    if (g->dW2) lm_moe_bf16_dw(kw, g->dW2, dypb, NULL, NULL, ehb, ex->offsets, E, R, C, F, g->dW_assign);
    lm_moe_bf16_schedule(tsF, ex->offsets, E, F, ki);
    lm_moe_bf16_rows(ki, g->deh, dypb, lm_cuda_weight_bf16(ex->W2, nw), ex->offsets, tsF, E, R, F, C, 1, 1, lo);
    if (lo)
        glu_bwd_bf16_k<<<grid_for(n / 8), 256, 0, st>>>(deab, debb, (const bf16 *)g->deh, (const bf16 *)ex->ea,
                                                        (const bf16 *)ex->eb, n, ex->offsets + E, F, ex->act);
    else
        glu_bwd_bf16_k<<<grid_for(n / 8), 256, 0, st>>>(deab, debb, g->deh, ex->ea, ex->eb, n, ex->offsets + E, F,
                                                        ex->act);
    cudaLaunchCheck();
    // W1, W3: dxp [R, C] = dea · W1[e] + deb · W3[e] (one product where the kernel takes two
    // parts: dxp written once);  dW1, dW3 [E, F, C] += dea/debᵀ · xp
    if (dx) {
        lm_moe_bf16_schedule(tsC, ex->offsets, E, C, ki);
        lm_moe_bf16_rows2(ki, g->dxp, deab, lm_cuda_weight_bf16(ex->W1, nw), debb, lm_cuda_weight_bf16(ex->W3, nw),
                          ex->offsets, tsC, E, R, C, F, F, 1, lo);
    }
    lm_moe_bf16_dw(kw, g->dW1, deab, g->dW3, debb, xpb, ex->offsets, E, R, F, C, g->dW_assign);   // one launch (TMA)
    // dx [N, C] += Σ_slot dxp[slot_row] per token in slot order: a gather by the plan's
    // slot_row (deterministic, each dx row read and written once) instead of the scatter by
    // row_token, which needs a sort
    if (dx && lo) lm_cuda_moe_combine_bf16(dx, (const bf16 *)g->dxp, NULL, ex->slot_row, ex->N, ex->k, C, g->dx_assign);
    else if (dx) lm_cuda_moe_combine(dx, g->dxp, NULL, ex->slot_row, ex->N, ex->k, C, g->dx_assign);
}
