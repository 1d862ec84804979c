// norm.cu — RMSNorm with gain, and the headwise gated RMSNorm of the KDA output.
// One block per row; row reductions by a fixed tree (deterministic); parameter
// gradients by the deterministic column sums of cuda_common.cuh.
#include "cuda_common.cuh"

static inline int row_threads(int C) { return C >= 256 ? 256 : ((C + 31) / 32) * 32; }

// out, inp [N,C]; gain [C]; rstd [N]
__global__ static void rmsnorm_fwd_k(float *out, float *rstd, const float *inp, const float *gain, int C, float eps) {
    __shared__ float sh[32];
    const float *x = inp + (size_t)blockIdx.x * C;
    float *y = out + (size_t)blockIdx.x * C;
    float ss = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) ss += x[c] * x[c];
    ss = block_sum(ss, sh);
    float r = 1.0f / sqrtf(ss / C + eps);
    if (threadIdx.x == 0) rstd[blockIdx.x] = r;
    for (int c = threadIdx.x; c < C; c += blockDim.x) y[c] = x[c] * r * gain[c];
}

void cuda_rmsnorm_fwd(real *out, real *rstd, const real *inp, const real *gain, int N, int C, real eps) {
    if (N <= 0 || C <= 0) return;
    rmsnorm_fwd_k<<<N, row_threads(C), 0, lm_cuda_stream()>>>(out, rstd, inp, gain, C, eps);
    cudaLaunchCheck();
}

// dx = r·g⊙dy − (r³/C)·x·Σ_c(dy·g·x)
__global__ static void rmsnorm_bwd_k(float *dinp, const float *dout, const float *inp, const float *gain,
                                     const float *rstd, int C) {
    __shared__ float sh[32];
    const size_t row = (size_t)blockIdx.x * C;
    const float *x = inp + row, *dy = dout + row;
    float *dx = dinp + row;
    float r = rstd[blockIdx.x], dot = 0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) dot += dy[c] * gain[c] * x[c];
    dot = block_sum(dot, sh);
    float k = r * r * r * dot / C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) dx[c] += r * gain[c] * dy[c] - k * x[c];
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
                      const real *rstd, int N, int C) {
    if (N <= 0 || C <= 0) return;
    if (dinp) {
        rmsnorm_bwd_k<<<N, row_threads(C), 0, lm_cuda_stream()>>>(dinp, dout, inp, gain, rstd, C);
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
                                   float eps) {
    __shared__ float sh[32];
    const size_t row = (size_t)blockIdx.x * V;
    const float *xr = x + row, *zr = z + row;
    float *yr = out + row;
    float ss = 0;
    for (int c = threadIdx.x; c < V; c += blockDim.x) ss += xr[c] * xr[c];
    ss = block_sum(ss, sh);
    float rs = 1.0f / sqrtf(ss / V + eps);
    if (threadIdx.x == 0) rstd[blockIdx.x] = rs;
    for (int c = threadIdx.x; c < V; c += blockDim.x) yr[c] = xr[c] * rs * w[c] * dsigmoid(zr[c]);
}

void cuda_gated_rmsnorm_fwd(real *out, real *rstd, const real *x, const real *z, const real *w,
                            int N, int H, int V, real eps) {
    if (N <= 0 || H <= 0 || V <= 0) return;
    gated_fwd_k<<<N * H, row_threads(V), 0, lm_cuda_stream()>>>(out, rstd, x, z, w, V, eps);
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

struct gated_dw_f {   // dout·σ(z)·x·rstd over rows r of V
    const float *dout, *z, *x, *rstd;
    int V;
    __device__ float operator()(int r, int c) const {
        size_t e = (size_t)r * V + c;
        return dout[e] * dsigmoid(z[e]) * x[e] * rstd[r];
    }
};

void cuda_gated_rmsnorm_bwd(real *dx, real *dz, real *dw, const real *dout, const real *x, const real *z,
                            const real *w, const real *rstd, int N, int H, int V) {
    if (N <= 0 || H <= 0 || V <= 0) return;
    if (dx || dz) {
        gated_bwd_k<<<N * H, row_threads(V), 0, lm_cuda_stream()>>>(dx, dz, dout, x, z, w, rstd, V);
        cudaLaunchCheck();
    }
    if (dw) {
        float *ws = (float *)lm_cuda_scratch(colsum_ws_floats(N * H, V) * sizeof(float));
        float *sums = colsum(ws, N * H, V, gated_dw_f{dout, z, x, rstd, V});
        lm_cuda_acc_vec(dw, sums, NULL, V);
    }
}
