// conv.cu — the short causal depthwise convolution (width W, no bias) + SiLU of the KDA
// layer, its backward, and the decode cache update (see src/cpu/conv.c for the layout).
//
// Two forms. The run kernels (C % 4 == 0, 16-byte aligned tensors, W ≤ CONV_WMAX): a thread
// owns four (backward: two) channels of a run of consecutive positions (conv_run_len) of one
// sequence and slides a window of the last W inputs along it, so each input is read once (plus a W−1 halo) and the
// index arithmetic is per run, not per element; the backward is one kernel (dz recomputed
// with a halo of W−1 positions for dinp, dw summed per run into partials that a second
// kernel adds in run order). The element kernels (one thread per element, 64-bit index
// divisions per element) take every other case. H200, `small` preset training step (ncu,
// 12 KDA layers × q, k, v of 4096 × 1024): the element kernels spent 7.8 ms of a 97 ms step.
// Both forms sum in the CPU's order over j (z, dinp); dw's sum over positions differs.
//
// The KDA op runs the conv of its q, k, v itself (lm_kda_args.conv_W; cuda_ops.cu): then the
// forward writes bf16 (the KDA kernels' inputs, without an fp32 tensor and a rounding pass)
// and the backward reads the KDA kernels' bf16 gradients — the kernels below are templated on
// that one type, with the same arithmetic, so the results equal the fp32 op's followed (or
// preceded) by a conversion, bit for bit.
#include "cuda_common.cuh"

#define CONV_WMAX 8

// input of sequence b at position p ∈ [-(W-1), T): p < 0 reads cache row W-1+p (zeros without a cache)
__device__ __forceinline__ float conv_x(const float *inp, const float *cache, int b, int p, int c, int T, int C, int W) {
    if (p >= 0) return inp[((size_t)b * T + p) * C + c];
    if (!cache) return 0.0f;
    return cache[((size_t)b * (W - 1) + (W - 1 + p)) * C + c];
}
// pre-activation z = Σ_j w[c][j] · x[t-(W-1)+j][c], j = 0..W-1 (the CPU's order)
__device__ __forceinline__ float conv_z(const float *inp, const float *w, const float *cache, int b, int t, int c,
                                        int T, int C, int W) {
    float s = 0.0f;
    for (int j = 0; j < W; j++) s += w[(size_t)c * W + j] * conv_x(inp, cache, b, t - (W - 1) + j, c, T, C, W);
    return s;
}

// one value to or from the conv's fp32 arithmetic (the element kernels)
__device__ __forceinline__ void conv_st(float *p, float x) { *p = x; }
__device__ __forceinline__ void conv_st(__nv_bfloat16 *p, float x) { *p = __float2bfloat16(x); }
__device__ __forceinline__ float conv_ld(const float *p) { return *p; }
__device__ __forceinline__ float conv_ld(const __nv_bfloat16 *p) { return __bfloat162float(*p); }

template <typename TO>
__global__ static void conv_fwd_k(TO *out, const float *inp, const float *w, const float *cache, int B, int T,
                                  int C, int W) {
    size_t n = (size_t)B * T * C;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        int c = (int)(e % C);
        size_t bt = e / C;
        int b = (int)(bt / T), t = (int)(bt % T);
        float z = conv_z(inp, w, cache, b, t, c, T, C, W);
        conv_st(out + e, z * dsigmoid(z));
    }
}

// ---- run kernels: grid (B · runs, ceil(C/CP / 64)), 64 threads; thread = CP channels × one run ----
// CP = 4 or 2 channels per thread (conv_cp_bwd; the forward takes 4): the backward's per-thread
// window state (inputs, output gradients and dw for W positions) is 4·W·CP floats, which bounds
// the registers and so the occupancy of a kernel that is latency-bound (RESULTS, session 15:
// 24% at CP = 4).
template <int CP> struct cvec { float v[CP]; };
template <int CP> __device__ __forceinline__ cvec<CP> cv_zero() {
    cvec<CP> r;
#pragma unroll
    for (int k = 0; k < CP; k++) r.v[k] = 0.f;
    return r;
}
// CP consecutive values (16-byte aligned for CP = 4 fp32; the vector's own size otherwise)
__device__ __forceinline__ void cv_ld(cvec<4> &r, const float *p) {
    const float4 f = *reinterpret_cast<const float4 *>(p);
    r.v[0] = f.x; r.v[1] = f.y; r.v[2] = f.z; r.v[3] = f.w;
}
__device__ __forceinline__ void cv_ld(cvec<2> &r, const float *p) {
    const float2 f = *reinterpret_cast<const float2 *>(p);
    r.v[0] = f.x; r.v[1] = f.y;
}
__device__ __forceinline__ void cv_ld(cvec<4> &r, const __nv_bfloat16 *p) {
    const float4 f = ld4_bf16(p);
    r.v[0] = f.x; r.v[1] = f.y; r.v[2] = f.z; r.v[3] = f.w;
}
__device__ __forceinline__ void cv_ld(cvec<2> &r, const __nv_bfloat16 *p) {
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(p));
    r.v[0] = f.x; r.v[1] = f.y;
}
__device__ __forceinline__ void cv_st(float *p, const cvec<4> &x) {
    *reinterpret_cast<float4 *>(p) = make_float4(x.v[0], x.v[1], x.v[2], x.v[3]);
}
__device__ __forceinline__ void cv_st(float *p, const cvec<2> &x) {
    *reinterpret_cast<float2 *>(p) = make_float2(x.v[0], x.v[1]);
}
__device__ __forceinline__ void cv_st(__nv_bfloat16 *p, const cvec<4> &x) {
    st4_bf16(p, make_float4(x.v[0], x.v[1], x.v[2], x.v[3]));
}
__device__ __forceinline__ void cv_st(__nv_bfloat16 *p, const cvec<2> &x) {
    *reinterpret_cast<__nv_bfloat162 *>(p) = __floats2bfloat162_rn(x.v[0], x.v[1]);
}
template <int CP> __device__ __forceinline__ void cv_fma(cvec<CP> &a, const cvec<CP> &w, const cvec<CP> &x) {
#pragma unroll
    for (int k = 0; k < CP; k++) a.v[k] += w.v[k] * x.v[k];
}
// the input at position p of sequence b, channels c0..c0+CP−1 (p < 0: the cache, or zeros)
template <int CP>
__device__ __forceinline__ cvec<CP> run_x(const float *inp, const float *cache, int b, int p, int c0, int T, int C,
                                          int W) {
    cvec<CP> r = cv_zero<CP>();
    if (p >= T) return r;
    if (p >= 0) cv_ld(r, inp + ((size_t)b * T + p) * C + c0);
    else if (cache) cv_ld(r, cache + ((size_t)b * (W - 1) + (W - 1 + p)) * C + c0);
    return r;
}
// w[c][j] for the thread's channels, j < W (w [C, W])
template <int W, int CP> __device__ __forceinline__ void run_w(cvec<CP> (&wj)[W], const float *w, int c0) {
#pragma unroll
    for (int j = 0; j < W; j++)
#pragma unroll
        for (int k = 0; k < CP; k++) wj[j].v[k] = w[(c0 + k) * W + j];
}
// z at the window's newest position: Σ_j w_j · x[j] (x[W-1] the newest), in j order
template <int W, int CP> __device__ __forceinline__ cvec<CP> run_z(const cvec<CP> (&wj)[W], const cvec<CP> (&x)[W]) {
    cvec<CP> z = cv_zero<CP>();
#pragma unroll
    for (int j = 0; j < W; j++) cv_fma(z, wj[j], x[j]);
    return z;
}
__device__ __forceinline__ float silu1(float z) { return z * dsigmoid(z); }
__device__ __forceinline__ float dsilu1(float z) { float s = dsigmoid(z); return s * (1 + z * (1 - s)); }

template <int W, int CP, typename TO>
__global__ static void conv_fwd_run_k(TO *out, const float *inp, const float *w, const float *cache, int T, int C,
                                      int run, int runs) {
    const int c0 = CP * (blockIdx.y * blockDim.x + threadIdx.x);
    if (c0 >= C) return;
    const int b = blockIdx.x / runs, t0 = (blockIdx.x % runs) * run, t1 = min(T, t0 + run);
    cvec<CP> wj[W], x[W];
    run_w<W, CP>(wj, w, c0);
#pragma unroll
    for (int j = 0; j < W - 1; j++) x[j + 1] = run_x<CP>(inp, cache, b, t0 - (W - 1) + j, c0, T, C, W);
#pragma unroll 4
    for (int t = t0; t < t1; t++) {
#pragma unroll
        for (int j = 0; j < W - 1; j++) x[j] = x[j + 1];
        cv_ld(x[W - 1], inp + ((size_t)b * T + t) * C + c0);
        cvec<CP> y = run_z<W, CP>(wj, x);
#pragma unroll
        for (int k = 0; k < CP; k++) y.v[k] = silu1(y.v[k]);
        cv_st(out + ((size_t)b * T + t) * C + c0, y);
    }
}

// dinp[p] += Σ_j w_j · dz[p + (W-1) − j] for p in the run; part [groups, C, W]: Σ_t dz[t] ·
// x[t − (W-1) + j] over the block's runs r ∈ [blockIdx.x · rpb, +rpb) (runs numbered b · runs +
// i, so a group may cross sequences). dz is recomputed from the inputs for t in [t0, t1 + W − 1).
// assign: dinp written (its old values not read), else added into. lo (with assign): dinp is
// written in bf16 instead, as rows of ldl elements (a column block of a wider matrix), and
// dinp itself is not touched
// (the register caps of the measured W = 4 kernels: 64 at CP = 2, 128 at 4; wider windows uncapped,
// which would spill under them)
template <int W, int CP, typename TI>
__global__ static void __launch_bounds__(64, W > 4 ? 1 : CP == 2 ? 16 : 8)
    conv_bwd_run_k(float *dinp, __nv_bfloat16 *lo, long ldl, float *part, const TI *dout, const float *inp,
                   const float *w, const float *cache, int B, int T, int C, int run, int runs, int rpb, int assign) {
    const int c0 = CP * (blockIdx.y * blockDim.x + threadIdx.x);
    if (c0 >= C) return;
    cvec<CP> wj[W], x[W], dz[W], dw[W];
    run_w<W, CP>(wj, w, c0);
#pragma unroll
    for (int j = 0; j < W; j++) dw[j] = cv_zero<CP>();
    const int r1 = min(B * runs, (int)(blockIdx.x + 1) * rpb);
    for (int r = blockIdx.x * rpb; r < r1; r++) {
        const int b = r / runs, t0 = (r % runs) * run, t1 = min(T, t0 + run);
#pragma unroll
        for (int j = 0; j < W; j++) dz[j] = cv_zero<CP>();
#pragma unroll
        for (int j = 0; j < W - 1; j++) x[j + 1] = run_x<CP>(inp, cache, b, t0 - (W - 1) + j, c0, T, C, W);
        // position t: dz[W-1] = dz(t); dinp at p = t − (W−1) is complete once dz(t) is known
#pragma unroll 2
        for (int t = t0; t < t1 + W - 1; t++) {
#pragma unroll
            for (int j = 0; j < W - 1; j++) { x[j] = x[j + 1]; dz[j] = dz[j + 1]; }
            if (t < T) {
                cv_ld(x[W - 1], inp + ((size_t)b * T + t) * C + c0);
                const cvec<CP> z = run_z<W, CP>(wj, x);
                cvec<CP> g;
                cv_ld(g, dout + ((size_t)b * T + t) * C + c0);
#pragma unroll
                for (int k = 0; k < CP; k++) dz[W - 1].v[k] = g.v[k] * dsilu1(z.v[k]);
            } else {
                dz[W - 1] = cv_zero<CP>();
            }
            if (t < t1) {   // this run's own positions add to dw
#pragma unroll
                for (int j = 0; j < W; j++) cv_fma(dw[j], dz[W - 1], x[j]);
            }
            const int p = t - (W - 1);
            if ((dinp || lo) && p >= t0) {   // Σ_j w_j · dz[p + (W-1) − j] = Σ_j w_j · dz-window[W−1−j], j order
                cvec<CP> s = cv_zero<CP>();
#pragma unroll
                for (int j = 0; j < W; j++) cv_fma(s, wj[j], dz[W - 1 - j]);
                cvec<CP> o = cv_zero<CP>();
                if (lo) {   // (0 + s: the bits of the written fp32 value, rounded)
#pragma unroll
                    for (int k = 0; k < CP; k++) o.v[k] += s.v[k];
                    cv_st(lo + ((size_t)b * T + p) * ldl + c0, o);
                } else {
                    float *d = dinp + ((size_t)b * T + p) * C + c0;
                    if (!assign) cv_ld(o, d);
#pragma unroll
                    for (int k = 0; k < CP; k++) o.v[k] += s.v[k];
                    cv_st(d, o);
                }
            }
        }
    }
    if (part) {
        float *pr = part + (size_t)blockIdx.x * C * W;
#pragma unroll
        for (int j = 0; j < W; j++)
#pragma unroll
            for (int k = 0; k < CP; k++) pr[(c0 + k) * W + j] = dw[j].v[k];
    }
}
// channels per thread of the backward's run kernel: 2 unless LM_CONV_CP=4. H200, B4·T4096·C1024
// (test_cuda_ops --bench): 4 → 2 took the backward from 0.142 to 0.115 ms (written: 0.117 →
// 0.091; 95 → 61 registers, twice the warps per SM); the forward (60 registers at 4) got slower
// at 2 (0.067 → 0.073) and keeps 4.
static int conv_cp_bwd(void) {
    static int cp = 0;
    if (!cp) cp = getenv("LM_CONV_CP") && atoi(getenv("LM_CONV_CP")) == 4 ? 4 : 2;
    return cp;
}
#define CONV_CP_FWD 4
// positions per run: the longest (≤ 64) that still gives ~128 K threads (a thread's loads
// are serial along its run; the H200 needs many in flight; LM_CONV_THREADS overrides the 128 K)
static int conv_run_len(int B, int T, int C, int cp) {
    static double target = 0;
    if (!target) target = getenv("LM_CONV_THREADS") ? atof(getenv("LM_CONV_THREADS")) : 131072.0;
    int run = 64;
    while (run > 4 && (double)B * ((T + run - 1) / run) * (C / cp) < target) run /= 2;
    return run;
}
#define CONV_GROUPS_MAX 2048   // dw partials: at most this many [C, W] blocks

static int conv_run_ok(int C, int W) { return C % 4 == 0 && W >= 1 && W <= CONV_WMAX; }
#define CONV_W_SWITCH(W, CALL)                                                                       \
    switch (W) {                                                                                  \
    case 1: { constexpr int WW = 1; CALL; } break;                                                \
    case 2: { constexpr int WW = 2; CALL; } break;                                                \
    case 3: { constexpr int WW = 3; CALL; } break;                                                \
    case 4: { constexpr int WW = 4; CALL; } break;                                                \
    case 5: { constexpr int WW = 5; CALL; } break;                                                \
    case 6: { constexpr int WW = 6; CALL; } break;                                                \
    case 7: { constexpr int WW = 7; CALL; } break;                                                \
    default: { constexpr int WW = 8; CALL; } break;                                               \
    }

template <typename TO>
static void conv_silu_fwd(TO *out, const float *inp, const float *w, const float *cache, int B, int T, int C, int W) {
    size_t n = (size_t)B * T * C;
    if (!n) return;
    if (conv_run_ok(C, W) && lm_aligned16({out, inp, cache})) {
        const int run = conv_run_len(B, T, C, CONV_CP_FWD), runs = (T + run - 1) / run;
        const dim3 grid(B * runs, (C / CONV_CP_FWD + 63) / 64);
        CONV_W_SWITCH(W, (conv_fwd_run_k<WW, CONV_CP_FWD, TO><<<grid, 64, 0, lm_cuda_stream()>>>(out, inp, w, cache, T, C,
                                                                                                  run, runs)));
    } else {
        conv_fwd_k<TO><<<lm_cuda_blocks(n, 256), 256, 0, lm_cuda_stream()>>>(out, inp, w, cache, B, T, C, W);
    }
    cudaLaunchCheck();
}
void cuda_conv_silu_fwd(real *out, const real *inp, const real *w, const real *cache, int B, int T, int C, int W) {
    conv_silu_fwd(out, inp, w, cache, B, T, C, W);
}
void lm_cuda_conv_silu_fwd_bf16(__nv_bfloat16 *out, const float *inp, const float *w, int B, int T, int C, int W) {
    conv_silu_fwd(out, inp, w, NULL, B, T, C, W);
}

// dz = dout · silu'(z), silu'(z) = σ(z)(1 + z(1 − σ(z)))
template <typename TI>
__global__ static void conv_dz_k(float *dz, const TI *dout, const float *inp, const float *w, const float *cache,
                                 int B, int T, int C, int W) {
    size_t n = (size_t)B * T * C;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        int c = (int)(e % C);
        size_t bt = e / C;
        int b = (int)(bt / T), t = (int)(bt % T);
        float z = conv_z(inp, w, cache, b, t, c, T, C, W), s = dsigmoid(z);
        dz[e] = conv_ld(dout + e) * s * (1 + z * (1 - s));
    }
}
// dinp[b,p,c] += Σ_j w[c][j] · dz[b, p+(W-1)-j, c]
__global__ static void conv_dinp_k(float *dinp, const float *dz, const float *w, int B, int T, int C, int W) {
    size_t n = (size_t)B * T * C;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        int c = (int)(e % C);
        size_t bp = e / C;
        int b = (int)(bp / T), p = (int)(bp % T);
        float s = 0.0f;
        for (int j = 0; j < W; j++) {
            int t = p + (W - 1) - j;
            if (t < T) s += w[(size_t)c * W + j] * dz[((size_t)b * T + t) * C + c];
        }
        dinp[e] += s;
    }
}
// dw[c][j] = Σ_{b,t} dz[b,t,c] · x[b, t-(W-1)+j, c]: column (c·W + j) of a [B·T, C·W] table
struct conv_dw_f {
    const float *dz, *inp, *cache;
    int T, C, W;
    __device__ float operator()(int bt, int cj) const {
        int c = cj / W, j = cj % W, b = bt / T, t = bt % T;
        return dz[(size_t)bt * C + c] * conv_x(inp, cache, b, t - (W - 1) + j, c, T, C, W);
    }
};

// the run kernels' backward blocks: each takes rpb runs of `run` positions
typedef struct { int run, runs, rpb, groups; } conv_bwd_grid;
static conv_bwd_grid conv_bwd_blocks(int B, int T, int C) {
    conv_bwd_grid g;
    g.run = conv_run_len(B, T, C, conv_cp_bwd());
    g.runs = (T + g.run - 1) / g.run;
    const int nr = B * g.runs;
    g.rpb = (nr + CONV_GROUPS_MAX - 1) / CONV_GROUPS_MAX;
    g.groups = (nr + g.rpb - 1) / g.rpb;
    return g;
}
size_t lm_cuda_conv_bwd_part_floats(int B, int T, int C, int W) {
    return B > 0 && T > 0 ? (size_t)conv_bwd_blocks(B, T, C).groups * C * W : 0;
}

// part: the run kernels' dw partials (lm_cuda_conv_bwd_part_floats), NULL = the workspace;
// lo, ldl: dinp in bf16 instead (conv_bwd_run_k; the run kernels only)
template <typename TI>
static void conv_silu_bwd(float *dinp, __nv_bfloat16 *lo, long ldl, float *dw, float *part, const TI *dout,
                          const float *inp, const float *w, const float *cache, int B, int T, int C, int W, int assign) {
    size_t n = (size_t)B * T * C;
    if (lo) dinp = NULL;
    if (!n || (!dinp && !lo && !dw)) return;
    if (conv_run_ok(C, W) && lm_aligned16({dinp, dout, inp, cache})) {
        const conv_bwd_grid bg = conv_bwd_blocks(B, T, C);
        const int run = bg.run, runs = bg.runs, rpb = bg.rpb, groups = bg.groups;
        if (!dw) part = NULL;
        else if (!part) part = (float *)lm_cuda_scratch((size_t)groups * C * W * sizeof(float));
        const dim3 grid(groups, (C / conv_cp_bwd() + 63) / 64);
        if (conv_cp_bwd() == 4) {
            CONV_W_SWITCH(W, (conv_bwd_run_k<WW, 4, TI><<<grid, 64, 0, lm_cuda_stream()>>>(
                                 dinp, lo, ldl, part, dout, inp, w, cache, B, T, C, run, runs, rpb, assign)));
        } else {
            CONV_W_SWITCH(W, (conv_bwd_run_k<WW, 2, TI><<<grid, 64, 0, lm_cuda_stream()>>>(
                                 dinp, lo, ldl, part, dout, inp, w, cache, B, T, C, run, runs, rpb, assign)));
        }
        cudaLaunchCheck();
        if (dw) {
            lm_cuda_colsum_final(dw, part, groups, C * W, 1);
        }
        return;
    }
    size_t dzf = lm_align256(n * sizeof(float)) / sizeof(float);
    size_t wsf = dw ? colsum_ws_floats(B * T, C * W) : 0;
    float *ws = (float *)lm_cuda_scratch((dzf + wsf) * sizeof(float));
    float *dz = ws;
    conv_dz_k<TI><<<lm_cuda_blocks(n, 256), 256, 0, lm_cuda_stream()>>>(dz, dout, inp, w, cache, B, T, C, W);
    cudaLaunchCheck();
    if (dinp) {
        if (assign) cudaCheck(cudaMemsetAsync(dinp, 0, n * sizeof(float), lm_cuda_stream()));   // the element kernel adds
        conv_dinp_k<<<lm_cuda_blocks(n, 256), 256, 0, lm_cuda_stream()>>>(dinp, dz, w, B, T, C, W);
        cudaLaunchCheck();
    }
    if (dw) {
        float *sums = colsum(ws + dzf, B * T, C * W, conv_dw_f{dz, inp, cache, T, C, W});
        lm_cuda_acc_vec(dw, sums, NULL, C * W);
    }
}
void cuda_conv_silu_bwd(real *dinp, real *dw, const real *dout, const real *inp, const real *w,
                        const real *cache, int B, int T, int C, int W, int assign) {
    conv_silu_bwd(dinp, (__nv_bfloat16 *)NULL, 0, dw, (float *)NULL, dout, inp, w, cache, B, T, C, W, assign);
}
void lm_cuda_conv_silu_bwd_bf16(float *dinp, __nv_bfloat16 *lo, long ldl, float *dw, float *part,
                                const __nv_bfloat16 *dout, const float *inp, const float *w, int B, int T, int C,
                                int W, int assign) {
    // the element kernels' dz would go to the workspace, where the caller's buffers are
    LM_CHECK(conv_run_ok(C, W) && lm_aligned16({dinp, dout, inp}), "cuda conv_silu_bwd (bf16): needs C %% 4 == 0 "
             "(got %d), W <= %d (got %d) and 16-byte aligned tensors", C, CONV_WMAX, W);
    LM_CHECK(!dw || part, "cuda conv_silu_bwd (bf16): no buffer for the weight gradient's partial sums");
    LM_CHECK(!lo || (assign && ldl >= C && ldl % 4 == 0 && (uintptr_t)lo % 8 == 0),
             "cuda conv_silu_bwd (bf16): a bf16 input gradient is written (assign), in 8-byte aligned rows of a "
             "multiple of 4 elements ≥ C (got ld %ld for C %d)", ldl, C);
    conv_silu_bwd(dinp, lo, ldl, dw, part, dout, inp, w, NULL, B, T, C, W, assign);
}

// cache [B,W-1,C] ← the last W-1 rows of [cache ++ inp]; one thread per (b, c) column
// walks the rows in increasing order, so the in-place update never reads an overwritten row
__global__ static void conv_cache_k(float *cache, const float *inp, int B, int T, int C, int M) {
    int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= B * C) return;
    int b = e / C, c = e % C;
    float *cb = cache + (size_t)b * M * C;
    for (int i = 0; i < M; i++) {
        int src = T + i;
        float v = src < M ? cb[(size_t)src * C + c] : inp[((size_t)b * T + (src - M)) * C + c];
        cb[(size_t)i * C + c] = v;
    }
}

// ---- one token of up to three convs (decode) ----
// A thread per (sequence, channel) of the n tensors: conv_z's sum at T = 1 (the cached W−1
// inputs, then x; the same order), SiLU, then the cache rolled by one. One launch where
// conv_silu_fwd and conv_cache_update took two per tensor (6 per KDA layer and token).
struct ConvStep {
    float *out[3];
    const float *inp[3], *w[3];
    float *cache[3];
    int C[3], n;
};
__global__ static void conv_step_k(ConvStep a, int B, int W) {
    size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    int j = 0;
    while (j < a.n && e >= (size_t)B * a.C[j]) e -= (size_t)B * a.C[j++];
    if (j >= a.n) return;
    const int C = a.C[j], b = (int)(e / C), c = (int)(e % C), M = W - 1;
    float *cb = a.cache[j] + (size_t)b * M * C + c;
    const float *wc = a.w[j] + (size_t)c * W;
    const float x = a.inp[j][(size_t)b * C + c];
    float s = 0.0f;
    for (int i = 0; i < M; i++) s += wc[i] * cb[(size_t)i * C];
    s += wc[M] * x;
    a.out[j][(size_t)b * C + c] = s * dsigmoid(s);
    for (int i = 0; i + 1 < M; i++) cb[(size_t)i * C] = cb[(size_t)(i + 1) * C];
    cb[(size_t)(M - 1) * C] = x;
}

void cuda_conv_step(real *const *out, const real *const *inp, const real *const *w, real *const *cache, const int *C,
                    int n, int B, int W) {
    LM_CHECK(n >= 1 && n <= 3 && W >= 2, "cuda conv_step: %d convs of width %d (1 to 3, width ≥ 2)", n, W);
    ConvStep a;
    size_t total = 0;
    for (int j = 0; j < n; j++) {
        a.out[j] = out[j]; a.inp[j] = inp[j]; a.w[j] = w[j]; a.cache[j] = cache[j]; a.C[j] = C[j];
        total += (size_t)B * C[j];
    }
    a.n = n;
    if (!total) return;
    conv_step_k<<<(unsigned)((total + 255) / 256), 256, 0, lm_cuda_stream()>>>(a, B, W);
    cudaLaunchCheck();
}

void cuda_conv_cache_update(real *cache, const real *inp, int B, int T, int C, int W) {
    int M = W - 1;
    if (M <= 0 || T == 0 || B * C == 0) return;
    conv_cache_k<<<(B * C + 255) / 256, 256, 0, lm_cuda_stream()>>>(cache, inp, B, T, C, M);
    cudaLaunchCheck();
}
