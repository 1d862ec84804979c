// gates.cu — sigmoid output gate (gated MLA) and the GLU activations of the FFNs.
#include "cuda_common.cuh"
#include "ops_math.h"

#define GRID_STRIDE(i, n) \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

// vec: the arrays 16-byte aligned (lo 8-byte), float4 steps up to 4·(n/4) (90 µs a `small` B4
// call as scalars); lo (or NULL): out again in bf16
__global__ static void sgate_fwd_k(float *out, const float *x, const float *z, size_t n, int vec, __nv_bfloat16 *lo) {
    const size_t done = vec ? 4 * (n / 4) : 0;
    GRID_STRIDE(i4, done / 4) {
        const float4 xv = ld4(x + 4 * i4), zv = ld4(z + 4 * i4);
        const float4 y = make_float4(xv.x * dsigmoid(zv.x), xv.y * dsigmoid(zv.y), xv.z * dsigmoid(zv.z),
                                     xv.w * dsigmoid(zv.w));
        *reinterpret_cast<float4 *>(out + 4 * i4) = y;
        if (lo) st4_bf16(lo + 4 * i4, y);
    }
    GRID_STRIDE(i, n - done) {
        const float y = x[done + i] * dsigmoid(z[done + i]);
        out[done + i] = y;
        if (lo) lo[done + i] = __float2bfloat16(y);
    }
}
// element i of the gate's backward: dx (+)= dout·σ(z), dz (+)= dout·x·σ(z)(1 − σ(z))
__device__ __forceinline__ void sgate_bwd_one(float &dx, float &dz, float d, float x, float z) {
    const float s = dsigmoid(z);
    dx = d * s;
    dz = d * x * s * (1 - s);
}
// vec as sgate_fwd_k (dx, dz 16-byte aligned too; 0.45 ms of a `small` B4 step as scalars)
__global__ static void sgate_bwd_k(float *dx, float *dz, const float *dout, const float *x, const float *z, size_t n,
                                   int assign, int vec) {
    const size_t done = vec ? 4 * (n / 4) : 0;
    GRID_STRIDE(i4, done / 4) {
        const size_t i = 4 * i4;
        const float4 dv = ld4(dout + i), xv = ld4(x + i), zv = ld4(z + i);
        float4 gx, gz;
        sgate_bwd_one(gx.x, gz.x, dv.x, xv.x, zv.x);
        sgate_bwd_one(gx.y, gz.y, dv.y, xv.y, zv.y);
        sgate_bwd_one(gx.z, gz.z, dv.z, xv.z, zv.z);
        sgate_bwd_one(gx.w, gz.w, dv.w, xv.w, zv.w);
        if (dx) {
            if (!assign) gx = add4(gx, ld4(dx + i));
            *reinterpret_cast<float4 *>(dx + i) = gx;
        }
        if (dz) {
            if (!assign) gz = add4(gz, ld4(dz + i));
            *reinterpret_cast<float4 *>(dz + i) = gz;
        }
    }
    GRID_STRIDE(j, n - done) {
        const size_t i = done + j;
        float gx, gz;
        sgate_bwd_one(gx, gz, dout[i], x[i], z[i]);
        if (dx) dx[i] = assign ? gx : dx[i] + gx;
        if (dz) dz[i] = assign ? gz : dz[i] + gz;
    }
}

void cuda_sigmoid_gate_fwd(real *out, const real *x, const real *z, size_t n, void *lo) {
    if (!n) return;
    const int vec = lm_aligned16({out, x, z}) && (uintptr_t)lo % 8 == 0;
    sgate_fwd_k<<<lm_cuda_blocks(vec ? n / 4 + 1 : n, 256), 256, 0, lm_cuda_stream()>>>(out, x, z, n, vec,
                                                                                       (__nv_bfloat16 *)lo);
    cudaLaunchCheck();
}
void cuda_sigmoid_gate_bwd(real *dx, real *dz, const real *dout, const real *x, const real *z, size_t n, int assign) {
    if (!n || (!dx && !dz)) return;
    const int vec = lm_aligned16({dx, dz, dout, x, z});
    sgate_bwd_k<<<lm_cuda_blocks(vec ? n / 4 + 1 : n, 256), 256, 0, lm_cuda_stream()>>>(dx, dz, dout, x, z, n, assign,
                                                                                       vec);
    cudaLaunchCheck();
}

// GLU h = a(g)·b(u): the scalar parts are lm_glu_parts of ops_math.h (the CPU's code)
// lo (glu_fwd's, or NULL): h again in bf16. Elements e0 + 4t .. (VEC: four a thread, the arrays
// 16-byte aligned, lo 8-byte; the tail past 4·(n/4) one at a time) — the same values either way.
__device__ __forceinline__ void glu_fwd_one(float *h, const float *g, const float *u, size_t i, int act,
                                            __nv_bfloat16 *lo) {
    float a, da, b, db;
    lm_glu_parts(g[i], u[i], act, &a, &da, &b, &db);
    h[i] = a * b;
    if (lo) lo[i] = __float2bfloat16(h[i]);
}
__global__ static void glu_fwd_k(float *h, const float *g, const float *u, size_t n, int act, __nv_bfloat16 *lo,
                                 int vec) {
    const size_t done = vec ? 4 * (n / 4) : 0;
    GRID_STRIDE(i4, done / 4) {
        const float4 gv = ld4(g + 4 * i4), uv = ld4(u + 4 * i4);
        const float gs[4] = {gv.x, gv.y, gv.z, gv.w}, us[4] = {uv.x, uv.y, uv.z, uv.w};
        float hs[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float a, da, b, db;
            lm_glu_parts(gs[j], us[j], act, &a, &da, &b, &db);
            hs[j] = a * b;
        }
        const float4 hv = make_float4(hs[0], hs[1], hs[2], hs[3]);
        *reinterpret_cast<float4 *>(h + 4 * i4) = hv;
        if (lo) st4_bf16(lo + 4 * i4, hv);
    }
    GRID_STRIDE(i, n - done) glu_fwd_one(h, g, u, done + i, act, lo);
}
__device__ __forceinline__ void glu_bwd_one(float *dg, float *du, const float *dh, const float *g, const float *u,
                                            size_t i, int act) {
    float a, da, b, db;
    lm_glu_parts(g[i], u[i], act, &a, &da, &b, &db);
    if (dg) dg[i] += dh[i] * b * da;
    if (du) du[i] += dh[i] * a * db;
}
__global__ static void glu_bwd_k(float *dg, float *du, const float *dh, const float *g, const float *u, size_t n,
                                 int act, int vec) {
    const size_t done = vec ? 4 * (n / 4) : 0;
    GRID_STRIDE(i4, done / 4) {
        const size_t e = 4 * i4;
        const float4 gv = ld4(g + e), uv = ld4(u + e), hv = ld4(dh + e);
        const float gs[4] = {gv.x, gv.y, gv.z, gv.w}, us[4] = {uv.x, uv.y, uv.z, uv.w}, hs[4] = {hv.x, hv.y, hv.z, hv.w};
        float dgs[4], dus[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float a, da, b, db;
            lm_glu_parts(gs[j], us[j], act, &a, &da, &b, &db);
            dgs[j] = hs[j] * b * da;
            dus[j] = hs[j] * a * db;
        }
        if (dg) *reinterpret_cast<float4 *>(dg + e) = add4(ld4(dg + e), make_float4(dgs[0], dgs[1], dgs[2], dgs[3]));
        if (du) *reinterpret_cast<float4 *>(du + e) = add4(ld4(du + e), make_float4(dus[0], dus[1], dus[2], dus[3]));
    }
    GRID_STRIDE(i, n - done) glu_bwd_one(dg, du, dh, g, u, done + i, act);
}

void cuda_glu_fwd(real *h, const real *g, const real *u, size_t n, int act, void *lo) {
    if (!n) return;
    const int vec = lm_aligned16({h, g, u}) && (uintptr_t)lo % 8 == 0;
    glu_fwd_k<<<lm_cuda_blocks(vec ? n / 4 + 1 : n, 256), 256, 0, lm_cuda_stream()>>>(h, g, u, n, act,
                                                                                    (__nv_bfloat16 *)lo, vec);
    cudaLaunchCheck();
}
void cuda_glu_bwd(real *dg, real *du, const real *dh, const real *g, const real *u, size_t n, int act) {
    if (!n || (!dg && !du)) return;
    const int vec = lm_aligned16({dg, du, dh, g, u});
    glu_bwd_k<<<lm_cuda_blocks(vec ? n / 4 + 1 : n, 256), 256, 0, lm_cuda_stream()>>>(dg, du, dh, g, u, n, act, vec);
    cudaLaunchCheck();
}
