// norm.cu — RMSNorm with gain, and the headwise gated RMSNorm of the KDA output.
// Row reductions by a fixed tree (deterministic); parameter gradients by deterministic
// column sums.
//
// Both are memory-bound, so rows whose width is a multiple of 4 keep four channels per
// thread in registers (float4): RMSNorm one block per row (C ≤ 4096), the gated norm one
// warp per head row (V ≤ 128). Each input is then read once, and the backward adds its
// rows' share of the gain gradient in the same pass (per-block partial sums, added in
// a fixed order by lm_cuda_colsum_final) instead of a separate column-sum pass over three tensors.
// Other widths take the general kernels: one block per row, column sums by colsum().
#include "cuda_common.cuh"

static inline int row_threads(int C) { return C >= 256 ? 256 : ((C + 31) / 32) * 32; }
static inline int rms_reg_ok(int C) { return C % 4 == 0 && C <= 4096; }
static inline int gated_reg_ok(int V) { return V % 4 == 0 && V <= 128; }
#define GATED_WARPS 8
static inline int gated_rows_per_block(int rows) {
    int r = rows / 512;
    return r < GATED_WARPS ? GATED_WARPS : r > 256 ? 256 : r;
}

// out, inp [N,C]; gain [C]; rstd [N]; lo (rmsnorm_fwd's, or NULL): out again in bf16. One row per
// block, thread t owns channels 4t..4t+3
__global__ static void rmsnorm_fwd_reg_k(float *out, float *rstd, const float *inp, const float *gain, int C,
                                         float eps, __nv_bfloat16 *lo) {
    __shared__ float red[32], tot[1];
    const int c = 4 * threadIdx.x;
    const bool on = c < C;
    const size_t e = (size_t)blockIdx.x * C + c;
    rms_row_out(ld4(inp + e, on), out, lo, rstd + blockIdx.x, gain, e, on, C, eps, red, tot);
}

// out (or NULL, lo given), inp [N,C]; gain [C]; rstd [N]
__global__ static void rmsnorm_fwd_k(float *out, float *rstd, const float *inp, const float *gain, int C, float eps,
                                     __nv_bfloat16 *lo) {
    __shared__ float sh[32];
    const float *x = inp + (size_t)blockIdx.x * C;
    float *y = out ? out + (size_t)blockIdx.x * C : NULL;
    float ss = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) ss += x[c] * x[c];
    ss = block_sum(ss, sh);
    float r = 1.0f / sqrtf(ss / C + eps);
    if (threadIdx.x == 0) rstd[blockIdx.x] = r;
    __nv_bfloat16 *yl = lo ? lo + (size_t)blockIdx.x * C : NULL;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        const float v = x[c] * r * gain[c];
        if (y) y[c] = v;
        if (yl) yl[c] = __float2bfloat16(v);
    }
}

void cuda_rmsnorm_fwd(real *out, real *rstd, const real *inp, const real *gain, int N, int C, real eps, void *lo) {
    if (N <= 0 || C <= 0) return;
    LM_CHECK(out || lo, "rmsnorm_fwd: no output");
    __nv_bfloat16 *lb = (__nv_bfloat16 *)lo;
    if (rms_reg_ok(C))
        rmsnorm_fwd_reg_k<<<N, lm_reg_row_threads(C), 0, lm_cuda_stream()>>>(out, rstd, inp, gain, C, eps, lb);
    else
        rmsnorm_fwd_k<<<N, row_threads(C), 0, lm_cuda_stream()>>>(out, rstd, inp, gain, C, eps, lb);
    cudaLaunchCheck();
}

// dx = r·g⊙dy − (r³/C)·x·Σ_c(dy·g·x)
__global__ static void rmsnorm_bwd_k(float *dinp, const float *dout, const float *inp, const float *gain,
                                     const float *rstd, int C, int assign) {
    __shared__ float sh[32];
    const size_t row = (size_t)blockIdx.x * C;
    const float *x = inp + row, *dy = dout + row;
    float *dx = dinp + row;
    float r = rstd[blockIdx.x], dot = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) dot += dy[c] * gain[c] * x[c];
    dot = block_sum(dot, sh);
    float k = r * r * r * dot / C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) dx[c] = (assign ? 0.f : dx[c]) + r * gain[c] * dy[c] - k * x[c];
}

// rows [rpb·b, rpb·b + rpb) of block b: dinp += (= with assign; as rmsnorm_bwd_k; NULL:
// skipped) and part [b, C] = Σ_rows dy·x·rstd (NULL: dgain not wanted)
__global__ static void rmsnorm_bwd_reg_k(float *dinp, float *part, const float *dout, const float *inp,
                                         const float *gain, const float *rstd, int N, int C, int rpb, int assign) {
    __shared__ float red[32], tot[1];
    const int c = 4 * threadIdx.x;
    const bool on = c < C;
    const float4 g = ld4(gain + c, on);
    float4 dg = make_float4(0.f, 0.f, 0.f, 0.f);
    const int i0 = blockIdx.x * rpb, i1 = min(N, i0 + rpb);
    for (int i = i0; i < i1; i++) {
        const size_t e = (size_t)i * C + c;
        const float4 x = ld4(inp + e, on), dy = ld4(dout + e, on);
        const float r = rstd[i];
        axpy(dg, r, mul4(dy, x));
        if (!dinp) continue;
        float v[1] = {dot4(mul4(dy, g), x)};
        block_sums<1>(v, red, tot);
        __syncthreads();
        const float k = r * r * r * tot[0] / C;
        if (on) axmby4(dinp + e, r, mul4(g, dy), k, x, assign);
    }
    if (part && on) *reinterpret_cast<float4 *>(part + (size_t)blockIdx.x * C + c) = dg;
}

struct rms_dgain_f {   // dout·x·rstd
    const float *dout, *inp, *rstd;
    int C;
    __device__ float operator()(int i, int c) const {
        size_t e = (size_t)i * C + c;
        return dout[e] * inp[e] * rstd[i];
    }
};

void cuda_rmsnorm_bwd(real *dinp, real *dgain, const real *dout, const real *inp, const real *gain,
                      const real *rstd, int N, int C, int assign) {
    if (N <= 0 || C <= 0 || (!dinp && !dgain)) return;
    if (rms_reg_ok(C)) {
        const int th = lm_reg_row_threads(C);
        const int rpb = lm_reg_rows_per_block_fit(N, (const void *)rmsnorm_bwd_reg_k, th, 0), nb = (N + rpb - 1) / rpb;
        float *part = dgain ? (float *)lm_cuda_scratch((size_t)nb * C * sizeof(float)) : NULL;
        rmsnorm_bwd_reg_k<<<nb, th, 0, lm_cuda_stream()>>>(dinp, part, dout, inp, gain, rstd, N, C, rpb, assign);
        cudaLaunchCheck();
        if (dgain) lm_cuda_colsum_final(dgain, part, nb, C, 1);
        return;
    }
    if (dinp) {
        rmsnorm_bwd_k<<<N, row_threads(C), 0, lm_cuda_stream()>>>(dinp, dout, inp, gain, rstd, C, assign);
        cudaLaunchCheck();
    }
    if (dgain) {
        float *ws = (float *)lm_cuda_scratch(colsum_ws_floats(N, C) * sizeof(float));
        float *sums = colsum(ws, N, C, rms_dgain_f{dout, inp, rstd, C});
        lm_cuda_acc_vec(dgain, sums, NULL, C);
    }
}

// x, z, out [N·H rows of V]; w [V]; rstd [N·H]
__global__ static void gated_fwd_k(float *out, float *rstd, const float *x, const float *z, const float *w, int V,
                                   float eps, __nv_bfloat16 *lo) {
    __shared__ float sh[32];
    const size_t row = (size_t)blockIdx.x * V;
    const float *xr = x + row, *zr = z + row;
    float *yr = out + row;
    float ss = 0;
    for (int c = threadIdx.x; c < V; c += blockDim.x) ss += xr[c] * xr[c];
    ss = block_sum(ss, sh);
    float rs = 1.0f / sqrtf(ss / V + eps);
    if (threadIdx.x == 0) rstd[blockIdx.x] = rs;
    for (int c = threadIdx.x; c < V; c += blockDim.x) {
        yr[c] = xr[c] * rs * w[c] * dsigmoid(zr[c]);
        if (lo) lo[row + c] = __float2bfloat16(yr[c]);
    }
}

// four of x's values: fp32, or bf16 widened (the gated norms' x_lo: the same fp32 values the
// widening pass that made x wrote)
__device__ __forceinline__ float4 ld4x(const float *p, bool ok) { return ld4(p, ok); }
__device__ __forceinline__ float4 ld4x(const __nv_bfloat16 *p, bool ok) {
    return ok ? ld4_bf16(p) : make_float4(0.f, 0.f, 0.f, 0.f);
}

// the same, one warp per row (V ≤ 128: lane l owns channels 4l..4l+3); TX: x's type
template <typename TX>
__global__ static void gated_fwd_warp_k(float *out, float *rstd, const TX *x, const float *z, const float *w,
                                        int rows, int V, float eps, __nv_bfloat16 *lo) {
    const int row = blockIdx.x * GATED_WARPS + (threadIdx.x >> 5), c = 4 * (threadIdx.x & 31);
    if (row >= rows) return;
    const bool on = c < V;
    const size_t e = (size_t)row * V + c;
    const float4 xv = ld4x(x + e, on);
    const float rs = 1.0f / sqrtf(warp_sum(dot4(xv, xv)) / V + eps);
    if (c == 0) rstd[row] = rs;
    if (!on) return;
    const float4 zv = ld4(z + e, true), wv = ld4(w + c, true);
    const float4 y = make_float4(xv.x * rs * wv.x * dsigmoid(zv.x), xv.y * rs * wv.y * dsigmoid(zv.y),
                                 xv.z * rs * wv.z * dsigmoid(zv.z), xv.w * rs * wv.w * dsigmoid(zv.w));
    *reinterpret_cast<float4 *>(out + e) = y;
    if (lo) st4_bf16(lo + e, y);
}

// x_lo (bf16, or NULL): x read there instead (the warp kernels' V only, as the bf16 outputs)
void cuda_gated_rmsnorm_fwd(real *out, real *rstd, const real *x, const real *z, const real *w,
                            int N, int H, int V, real eps, void *lo, const void *x_lo) {
    if (N <= 0 || H <= 0 || V <= 0) return;
    const int rows = N * H;
    LM_CHECK(!x_lo || gated_reg_ok(V), "cuda gated_rmsnorm_fwd: a bf16 x needs V %% 4 == 0, V <= 128 (V = %d)", V);
    __nv_bfloat16 *lb = (__nv_bfloat16 *)lo;
    const unsigned nb = (unsigned)((rows + GATED_WARPS - 1) / GATED_WARPS);
    if (gated_reg_ok(V) && x_lo) {
        gated_fwd_warp_k<<<nb, 32 * GATED_WARPS, 0, lm_cuda_stream()>>>(out, rstd, (const __nv_bfloat16 *)x_lo, z,
                                                                        w, rows, V, eps, lb);
    } else if (gated_reg_ok(V)) {
        gated_fwd_warp_k<<<nb, 32 * GATED_WARPS, 0, lm_cuda_stream()>>>(out, rstd, x, z, w, rows, V, eps, lb);
    } else {
        gated_fwd_k<<<rows, row_threads(V), 0, lm_cuda_stream()>>>(out, rstd, x, z, w, V, eps, lb);
    }
    cudaLaunchCheck();
}

__global__ static void gated_bwd_k(float *dx, float *dz, const float *dout, const float *x, const float *z,
                                   const float *w, const float *rstd, int V) {
    __shared__ float sh[32];
    const size_t row = (size_t)blockIdx.x * V;
    const float *xr = x + row, *zr = z + row, *dy = dout + row;
    float rs = rstd[blockIdx.x], dot = 0;
    for (int c = threadIdx.x; c < V; c += blockDim.x) {
        float sg = dsigmoid(zr[c]);
        dot += dy[c] * sg * w[c] * xr[c];
        if (dz) dz[row + c] += dy[c] * xr[c] * rs * w[c] * sg * (1 - sg);
    }
    if (!dx) return;
    dot = block_sum(dot, sh);
    float k = rs * rs * rs * dot / V;
    for (int c = threadIdx.x; c < V; c += blockDim.x) dx[row + c] += rs * w[c] * dy[c] * dsigmoid(zr[c]) - k * xr[c];
}

// rows [rpb·b, rpb·b + rpb) of block b, warp w taking rows w, w + GATED_WARPS, …: dx, dz +=
// as gated_bwd_k (NULL: skipped), part [b, V] = Σ_rows dy·σ(z)·x·rstd (NULL: dw not wanted)
// assign: dx, dz written (their old values not read), else added into
// dx_lo, dz_lo (with assign): the written dx / dz in bf16 there instead of in dx / dz
template <typename TX>
__global__ static void gated_bwd_warp_k(float *dx, float *dz, float *part, const float *dout, const TX *x,
                                        const float *z, const float *w, const float *rstd, int rows, int V, int rpb,
                                        int assign, __nv_bfloat16 *dx_lo, __nv_bfloat16 *dz_lo) {
    __shared__ float4 wpart[GATED_WARPS][32];
    const int wi = threadIdx.x >> 5, lane = threadIdx.x & 31, c = 4 * lane;
    const bool on = c < V;
    const float4 wv = ld4(w + c, on);
    float4 dw = make_float4(0.f, 0.f, 0.f, 0.f);
    const int r0 = blockIdx.x * rpb, r1 = min(rows, r0 + rpb);
    for (int row = r0 + wi; row < r1; row += GATED_WARPS) {
        const size_t e = (size_t)row * V + c;
        const float4 xv = ld4x(x + e, on), zv = ld4(z + e, on), dy = ld4(dout + e, on);
        const float4 sg = make_float4(dsigmoid(zv.x), dsigmoid(zv.y), dsigmoid(zv.z), dsigmoid(zv.w));
        const float rs = rstd[row];
        const float4 dys = mul4(dy, sg);   // dy·σ(z)
        axpy(dw, rs, mul4(dys, xv));
        if ((dz || dz_lo) && on) {   // dz += dy·x·rs·w·σ(1−σ)
            float4 *d = reinterpret_cast<float4 *>(dz + e), o = assign ? make_float4(0.f, 0.f, 0.f, 0.f) : *d;
            o.x += dys.x * xv.x * rs * wv.x * (1 - sg.x);
            o.y += dys.y * xv.y * rs * wv.y * (1 - sg.y);
            o.z += dys.z * xv.z * rs * wv.z * (1 - sg.z);
            o.w += dys.w * xv.w * rs * wv.w * (1 - sg.w);
            if (dz_lo) st4_bf16(dz_lo + e, o);
            else *d = o;
        }
        if (!dx && !dx_lo) continue;
        const float k = rs * rs * rs * warp_sum(dot4(mul4(dys, wv), xv)) / V;
        if (on && dx_lo) {   // axmby4's written value
            const float4 u = mul4(wv, dys);
            st4_bf16(dx_lo + e, make_float4(rs * u.x - k * xv.x, rs * u.y - k * xv.y, rs * u.z - k * xv.z, rs * u.w - k * xv.w));
        } else if (on) {
            axmby4(dx + e, rs, mul4(wv, dys), k, xv, assign);
        }
    }
    if (!part) return;
    wpart[wi][lane] = dw;
    __syncthreads();
    if (wi == 0 && on) {
        float4 s = wpart[0][lane];
        for (int k = 1; k < GATED_WARPS; k++) axpy(s, 1.0f, wpart[k][lane]);
        *reinterpret_cast<float4 *>(part + (size_t)blockIdx.x * V + c) = s;
    }
}

struct gated_dw_f {   // dout·σ(z)·x·rstd over rows r of V
    const float *dout, *z, *x, *rstd;
    int V;
    __device__ float operator()(int r, int c) const {
        size_t e = (size_t)r * V + c;
        return dout[e] * dsigmoid(z[e]) * x[e] * rstd[r];
    }
};

void cuda_gated_rmsnorm_bwd(real *dx, real *dz, real *dw, const real *dout, const real *x, const real *z,
                            const real *w, const real *rstd, int N, int H, int V, int assign, void *dx_lo,
                            void *dz_lo, const void *x_lo) {
    if (N <= 0 || H <= 0 || V <= 0 || (!dx && !dz && !dw && !dx_lo && !dz_lo)) return;
    const int rows = N * H;
    LM_CHECK(!(dx_lo || dz_lo) || (assign && gated_reg_ok(V)), "cuda gated_rmsnorm_bwd: bf16 outputs need assign "
             "and V %% 4 == 0, V <= 128 (V = %d)", V);
    LM_CHECK(!x_lo || gated_reg_ok(V), "cuda gated_rmsnorm_bwd: a bf16 x needs V %% 4 == 0, V <= 128 (V = %d)", V);
    if (gated_reg_ok(V)) {
        const int rpb = gated_rows_per_block(rows), nb = (rows + rpb - 1) / rpb;
        float *part = dw ? (float *)lm_cuda_scratch((size_t)nb * V * sizeof(float)) : NULL;
        __nv_bfloat16 *dxl = (__nv_bfloat16 *)dx_lo, *dzl = (__nv_bfloat16 *)dz_lo;
        if (x_lo)
            gated_bwd_warp_k<<<nb, 32 * GATED_WARPS, 0, lm_cuda_stream()>>>(
                dx, dz, part, dout, (const __nv_bfloat16 *)x_lo, z, w, rstd, rows, V, rpb, assign, dxl, dzl);
        else
            gated_bwd_warp_k<<<nb, 32 * GATED_WARPS, 0, lm_cuda_stream()>>>(dx, dz, part, dout, x, z, w, rstd, rows,
                                                                            V, rpb, assign, dxl, dzl);
        cudaLaunchCheck();
        if (dw) lm_cuda_colsum_final(dw, part, nb, V, 1);
        return;
    }
    if (dx || dz) {
        if (assign) {   // the general kernel adds: onto zeros
            if (dx) cudaCheck(cudaMemsetAsync(dx, 0, (size_t)rows * V * sizeof(float), lm_cuda_stream()));
            if (dz) cudaCheck(cudaMemsetAsync(dz, 0, (size_t)rows * V * sizeof(float), lm_cuda_stream()));
        }
        gated_bwd_k<<<N * H, row_threads(V), 0, lm_cuda_stream()>>>(dx, dz, dout, x, z, w, rstd, V);
        cudaLaunchCheck();
    }
    if (dw) {
        float *ws = (float *)lm_cuda_scratch(colsum_ws_floats(N * H, V) * sizeof(float));
        float *sums = colsum(ws, N * H, V, gated_dw_f{dout, z, x, rstd, V});
        lm_cuda_acc_vec(dw, sums, NULL, V);
    }
}
