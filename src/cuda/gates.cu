// gates.cu — sigmoid output gate (gated MLA) and the GLU activations of the FFNs.
#include "cuda_common.cuh"
#include "ops_math.h"

#define GRID_STRIDE(i, n) \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

__global__ static void sgate_fwd_k(float *out, const float *x, const float *z, size_t n) {
    GRID_STRIDE(i, n) out[i] = x[i] * dsigmoid(z[i]);
}
__global__ static void sgate_bwd_k(float *dx, float *dz, const float *dout, const float *x, const float *z, size_t n,
                                   int assign) {
    GRID_STRIDE(i, n) {
        const float s = dsigmoid(z[i]), gx = dout[i] * s, gz = dout[i] * x[i] * s * (1 - s);
        if (dx) dx[i] = assign ? gx : dx[i] + gx;
        if (dz) dz[i] = assign ? gz : dz[i] + gz;
    }
}

void cuda_sigmoid_gate_fwd(real *out, const real *x, const real *z, size_t n) {
    if (!n) return;
    sgate_fwd_k<<<lm_cuda_blocks(n, 256), 256, 0, lm_cuda_stream()>>>(out, x, z, n);
    cudaLaunchCheck();
}
void cuda_sigmoid_gate_bwd(real *dx, real *dz, const real *dout, const real *x, const real *z, size_t n, int assign) {
    if (!n || (!dx && !dz)) return;
    sgate_bwd_k<<<lm_cuda_blocks(n, 256), 256, 0, lm_cuda_stream()>>>(dx, dz, dout, x, z, n, assign);
    cudaLaunchCheck();
}

// GLU h = a(g)·b(u): the scalar parts are lm_glu_parts of ops_math.h (the CPU's code)
// lo (glu_fwd's, or NULL): h again in bf16
__global__ static void glu_fwd_k(float *h, const float *g, const float *u, size_t n, int act, __nv_bfloat16 *lo) {
    GRID_STRIDE(i, n) {
        float a, da, b, db;
        lm_glu_parts(g[i], u[i], act, &a, &da, &b, &db);
        h[i] = a * b;
        if (lo) lo[i] = __float2bfloat16(h[i]);
    }
}
__global__ static void glu_bwd_k(float *dg, float *du, const float *dh, const float *g, const float *u, size_t n,
                                 int act) {
    GRID_STRIDE(i, n) {
        float a, da, b, db;
        lm_glu_parts(g[i], u[i], act, &a, &da, &b, &db);
        if (dg) dg[i] += dh[i] * b * da;
        if (du) du[i] += dh[i] * a * db;
    }
}

void cuda_glu_fwd(real *h, const real *g, const real *u, size_t n, int act, void *lo) {
    if (!n) return;
    glu_fwd_k<<<lm_cuda_blocks(n, 256), 256, 0, lm_cuda_stream()>>>(h, g, u, n, act, (__nv_bfloat16 *)lo);
    cudaLaunchCheck();
}
void cuda_glu_bwd(real *dg, real *du, const real *dh, const real *g, const real *u, size_t n, int act) {
    if (!n || (!dg && !du)) return;
    glu_bwd_k<<<lm_cuda_blocks(n, 256), 256, 0, lm_cuda_stream()>>>(dg, du, dh, g, u, n, act);
    cudaLaunchCheck();
}
