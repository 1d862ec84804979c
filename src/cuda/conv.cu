// conv.cu — the short causal depthwise convolution (width W, no bias) + SiLU of the KDA
// layer, its backward, and the decode cache update (see src/cpu/conv.c for the layout).
#include "cuda_common.cuh"

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

__global__ static void conv_fwd_k(float *out, const float *inp, const float *w, const float *cache, int B, int T,
                                  int C, int W) {
    size_t n = (size_t)B * T * C;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        int c = (int)(e % C);
        size_t bt = e / C;
        int b = (int)(bt / T), t = (int)(bt % T);
        float z = conv_z(inp, w, cache, b, t, c, T, C, W);
        out[e] = z * dsigmoid(z);
    }
}

void cuda_conv_silu_fwd(real *out, const real *inp, const real *w, const real *cache, int B, int T, int C, int W) {
    size_t n = (size_t)B * T * C;
    if (!n) return;
    conv_fwd_k<<<lm_cuda_blocks(n, 256), 256, 0, lm_cuda_stream()>>>(out, inp, w, cache, B, T, C, W);
    cudaLaunchCheck();
}

// dz = dout · silu'(z), silu'(z) = σ(z)(1 + z(1 − σ(z)))
__global__ static void conv_dz_k(float *dz, const float *dout, const float *inp, const float *w, const float *cache,
                                 int B, int T, int C, int W) {
    size_t n = (size_t)B * T * C;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        int c = (int)(e % C);
        size_t bt = e / C;
        int b = (int)(bt / T), t = (int)(bt % T);
        float z = conv_z(inp, w, cache, b, t, c, T, C, W), s = dsigmoid(z);
        dz[e] = dout[e] * s * (1 + z * (1 - s));
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

void cuda_conv_silu_bwd(real *dinp, real *dw, const real *dout, const real *inp, const real *w,
                        const real *cache, int B, int T, int C, int W) {
    size_t n = (size_t)B * T * C;
    if (!n || (!dinp && !dw)) return;
    size_t dzf = lm_align256(n * sizeof(float)) / sizeof(float);
    size_t wsf = dw ? colsum_ws_floats(B * T, C * W) : 0;
    float *ws = (float *)lm_cuda_scratch((dzf + wsf) * sizeof(float));
    float *dz = ws;
    conv_dz_k<<<lm_cuda_blocks(n, 256), 256, 0, lm_cuda_stream()>>>(dz, dout, inp, w, cache, B, T, C, W);
    cudaLaunchCheck();
    if (dinp) {
        conv_dinp_k<<<lm_cuda_blocks(n, 256), 256, 0, lm_cuda_stream()>>>(dinp, dz, w, B, T, C, W);
        cudaLaunchCheck();
    }
    if (dw) {
        float *sums = colsum(ws + dzf, B * T, C * W, conv_dw_f{dz, inp, cache, T, C, W});
        lm_cuda_acc_vec(dw, sums, NULL, C * W);
    }
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

void cuda_conv_cache_update(real *cache, const real *inp, int B, int T, int C, int W) {
    int M = W - 1;
    if (M <= 0 || T == 0 || B * C == 0) return;
    conv_cache_k<<<(B * C + 255) / 256, 256, 0, lm_cuda_stream()>>>(cache, inp, B, T, C, M);
    cudaLaunchCheck();
}
