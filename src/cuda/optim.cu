// optim.cu — AdamW and Muon. Muon runs the quintic Newton–Schulz iteration on all
// `count` stacked matrices at once with strided-batched cuBLAS SGEMMs.
#include "cuda_common.cuh"

__device__ __forceinline__ void adamw_one(float &p, float g, float &m, float &v, float lr, float b1, float b2,
                                          float eps, float wd, float bc1, float bc2, float gscale) {
    float gi = g * gscale;
    float mi = b1 * m + (1 - b1) * gi;
    float vi = b2 * v + (1 - b2) * gi * gi;
    m = mi;
    v = vi;
    float mh = mi / bc1, vh = vi / bc2;
    p -= lr * (mh / (sqrtf(vh) + eps) + wd * p);
}
// A launch updates up to ADAMW_SPANS tensors (lm_adamw_span), each cut into blocks of
// ADAMW_BLOCK elements; the spans travel as a kernel parameter. One tensor per launch (the
// `small` preset: 417 launches a step, most of them norm gains and biases of a few thousand
// elements, each paying a launch and a tail) became ~7 launches.
#define ADAMW_SPANS 64
#define ADAMW_THREADS 256
#define ADAMW_UNROLL 2                                       // float4s per thread
#define ADAMW_BLOCK (ADAMW_THREADS * ADAMW_UNROLL * 4)      // elements per block
struct AdamwSpan {
    size_t off, n;
    float wd;
    int vec;               // p, g, m, v + off 16-byte aligned (and pb 8-byte): float4 steps
    __nv_bfloat16 *pb;     // the weight's bf16 copy (weight_cache.cu), or NULL
};
struct AdamwBatch {
    AdamwSpan s[ADAMW_SPANS];
    unsigned first[ADAMW_SPANS];   // span j's first block
    int ns;
};

// The optimizer is bandwidth-bound (28 bytes per parameter, 30 with the bf16 copy): a thread
// loads its ADAMW_UNROLL float4s of all four arrays before updating any, so that 8 16-byte
// loads are in flight. pb, the weight's bf16 copy, is rewritten here from the new values — 2
// more bytes per parameter instead of a later pass of 6.
__global__ static void __launch_bounds__(ADAMW_THREADS) adamw_k(float *p, const float *g, float *m, float *v,
                                                                const __grid_constant__ AdamwBatch b, float lr,
                                                                float b1, float b2, float eps, float bc1, float bc2,
                                                                float gscale) {
    int j = 0;   // this block's span: the last whose first block is at most blockIdx.x
    for (int step = ADAMW_SPANS / 2; step > 0; step /= 2)
        if (j + step < b.ns && b.first[j + step] <= blockIdx.x) j += step;
    const AdamwSpan sp = b.s[j];
    const size_t e0 = (size_t)(blockIdx.x - b.first[j]) * ADAMW_BLOCK;
    float *pp = p + sp.off, *mp = m + sp.off, *vp = v + sp.off;
    const float *gp = g + sp.off;
    const float wd = sp.wd;
    if (sp.vec) {
        float4 P[ADAMW_UNROLL], G[ADAMW_UNROLL], M[ADAMW_UNROLL], V[ADAMW_UNROLL];
        size_t e[ADAMW_UNROLL];
#pragma unroll
        for (int u = 0; u < ADAMW_UNROLL; u++) {
            e[u] = e0 + 4 * ((size_t)u * ADAMW_THREADS + threadIdx.x);
            if (e[u] + 4 <= sp.n) {
                P[u] = *reinterpret_cast<const float4 *>(pp + e[u]);
                G[u] = *reinterpret_cast<const float4 *>(gp + e[u]);
                M[u] = *reinterpret_cast<const float4 *>(mp + e[u]);
                V[u] = *reinterpret_cast<const float4 *>(vp + e[u]);
            }
        }
#pragma unroll
        for (int u = 0; u < ADAMW_UNROLL; u++) {
            if (e[u] + 4 <= sp.n) {
                adamw_one(P[u].x, G[u].x, M[u].x, V[u].x, lr, b1, b2, eps, wd, bc1, bc2, gscale);
                adamw_one(P[u].y, G[u].y, M[u].y, V[u].y, lr, b1, b2, eps, wd, bc1, bc2, gscale);
                adamw_one(P[u].z, G[u].z, M[u].z, V[u].z, lr, b1, b2, eps, wd, bc1, bc2, gscale);
                adamw_one(P[u].w, G[u].w, M[u].w, V[u].w, lr, b1, b2, eps, wd, bc1, bc2, gscale);
                *reinterpret_cast<float4 *>(pp + e[u]) = P[u];
                *reinterpret_cast<float4 *>(mp + e[u]) = M[u];
                *reinterpret_cast<float4 *>(vp + e[u]) = V[u];
                if (sp.pb) {
                    __nv_bfloat162 *d = reinterpret_cast<__nv_bfloat162 *>(sp.pb + e[u]);
                    d[0] = __floats2bfloat162_rn(P[u].x, P[u].y);
                    d[1] = __floats2bfloat162_rn(P[u].z, P[u].w);
                }
            } else {   // the span's last, partial float4
                for (size_t i = e[u]; i < sp.n; i++) {
                    adamw_one(pp[i], gp[i], mp[i], vp[i], lr, b1, b2, eps, wd, bc1, bc2, gscale);
                    if (sp.pb) sp.pb[i] = __float2bfloat16(pp[i]);
                }
            }
        }
        return;
    }
    for (int u = 0; u < ADAMW_UNROLL * 4; u++) {
        const size_t i = e0 + (size_t)u * ADAMW_THREADS + threadIdx.x;
        if (i >= sp.n) break;
        adamw_one(pp[i], gp[i], mp[i], vp[i], lr, b1, b2, eps, wd, bc1, bc2, gscale);
        if (sp.pb) sp.pb[i] = __float2bfloat16(pp[i]);
    }
}

void cuda_adamw(real *p, const real *g, real *m, real *v, const lm_adamw_span *spans, int nspans, real lr, real b1,
                real b2, real eps, real bc1, real bc2, real gscale) {
    AdamwBatch b;
    memset(&b, 0, sizeof b);
    unsigned blocks = 0;
    auto flush = [&]() {
        if (!b.ns) return;
        adamw_k<<<blocks, ADAMW_THREADS, 0, lm_cuda_stream()>>>(p, g, m, v, b, lr, b1, b2, eps, bc1, bc2, gscale);
        cudaLaunchCheck();
        memset(&b, 0, sizeof b);
        blocks = 0;
    };
    for (int i = 0; i < nspans; i++) {
        const size_t off = spans[i].offset, n = spans[i].n;
        if (!n) continue;
        lm_cuda_weights_written(p + off, n * sizeof(real));
        __nv_bfloat16 *pb = lm_cuda_weight_bf16_claim(p + off, n);   // NULL unless p + off is a weight with a copy
        const size_t nb = (n + ADAMW_BLOCK - 1) / ADAMW_BLOCK;
        LM_CHECK(nb < (1u << 30), "adamw: a tensor of %zu elements", n);
        if (b.ns == ADAMW_SPANS || blocks + nb >= (1u << 31)) flush();
        AdamwSpan &s = b.s[b.ns];
        s.off = off;
        s.n = n;
        s.wd = spans[i].wd;
        s.pb = pb;
        s.vec = lm_aligned16({p + off, g + off, m + off, v + off}) && (uintptr_t)pb % 8 == 0;
        b.first[b.ns++] = blocks;
        blocks += (unsigned)nb;
    }
    flush();
}

// m = μm + g;  X = (g + μm), stored transposed when rows > cols so that X is [r, c], r ≤ c
__global__ static void muon_prep_k(float *X, const float *g, float *m, int count, int rows, int cols, float mu) {
    const size_t mn = (size_t)rows * cols, n = mn * count;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t k = e / mn, s = e % mn;
        int i = (int)(s / cols), j = (int)(s % cols);
        float mi = mu * m[e] + g[e];
        m[e] = mi;
        size_t d = rows <= cols ? s : (size_t)j * rows + i;
        X[k * mn + d] = g[e] + mu * mi;
    }
}
// X_k ← X_k / (‖X_k‖_F + 1e-7), the norm summed in double by a fixed tree (one block per matrix)
__global__ static void muon_normalize_k(float *X, size_t mn) {
    __shared__ double sh[32];
    float *x = X + (size_t)blockIdx.x * mn;
    double s = 0;
    for (size_t i = threadIdx.x; i < mn; i += blockDim.x) s += (double)x[i] * x[i];
    s = block_sum_d(s, sh);
    float inv = (float)(1.0 / (sqrt(s) + 1e-7));
    for (size_t i = threadIdx.x; i < mn; i += blockDim.x) x[i] *= inv;
}
__global__ static void muon_poly_k(float *A2, const float *A, size_t n, float b, float c) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        A2[i] = b * A[i] + c * A2[i];
}
__global__ static void muon_update_k(float *p, const float *X, int count, int rows, int cols, float lr, float sc,
                                     float wd) {
    const size_t mn = (size_t)rows * cols, n = mn * count;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t k = e / mn, s = e % mn;
        int i = (int)(s / cols), j = (int)(s % cols);
        size_t d = rows <= cols ? s : (size_t)j * rows + i;
        p[e] -= lr * (sc * X[k * mn + d] + wd * p[e]);
    }
}

// p, g, m [count, rows, cols]; update scaled by 0.2·sqrt(max(rows, cols)), decoupled decay
void cuda_muon(real *p, const real *g, real *m, int count, int rows, int cols, real lr, real mu, real wd) {
    if (count <= 0 || rows <= 0 || cols <= 0) return;
    lm_cuda_weights_written(p, (size_t)count * rows * cols * sizeof(real));
    const int r = rows < cols ? rows : cols, c = rows < cols ? cols : rows;
    const size_t mn = (size_t)rows * cols, rr = (size_t)r * r;
    const size_t xb = lm_align256(mn * count * sizeof(float)), ab = lm_align256(rr * count * sizeof(float));
    char *ws = (char *)lm_cuda_scratch(2 * xb + 2 * ab);
    float *X = (float *)ws, *T = (float *)(ws + xb), *A = (float *)(ws + 2 * xb), *A2 = (float *)(ws + 2 * xb + ab);
    cudaStream_t st = lm_cuda_stream();
    const size_t n = mn * count;
    muon_prep_k<<<lm_cuda_blocks(n, 256), 256, 0, st>>>(X, g, m, count, rows, cols, mu);
    cudaLaunchCheck();
    muon_normalize_k<<<count, 1024, 0, st>>>(X, mn);
    cudaLaunchCheck();
    const float a = 3.4445f, b = -4.7750f, cc = 2.0315f, one = 1.0f, zero = 0.0f;
    cublasHandle_t h = lm_cublas();
    for (int it = 0; it < 5; it++) {
        // A = X Xᵀ  [r, r]
        cublasCheck(cublasSgemmStridedBatched(h, CUBLAS_OP_T, CUBLAS_OP_N, r, r, c, &one, X, c, (long long)mn, X, c,
                                              (long long)mn, &zero, A, r, (long long)rr, count));
        // A2 = A·A, then A2 = b·A + c·A2
        cublasCheck(cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, r, r, r, &one, A, r, (long long)rr, A, r,
                                              (long long)rr, &zero, A2, r, (long long)rr, count));
        muon_poly_k<<<lm_cuda_blocks(rr * count, 256), 256, 0, st>>>(A2, A, rr * count, b, cc);
        cudaLaunchCheck();
        // X = A2·X + a·X (through the copy T)
        cudaCheck(cudaMemcpyAsync(T, X, n * sizeof(float), cudaMemcpyDeviceToDevice, st));
        cublasCheck(cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, c, r, r, &one, T, c, (long long)mn, A2, r,
                                              (long long)rr, &a, X, c, (long long)mn, count));
    }
    const float sc = 0.2f * sqrtf((float)(rows > cols ? rows : cols));
    muon_update_k<<<lm_cuda_blocks(n, 256), 256, 0, st>>>(p, X, count, rows, cols, lr, sc, wd);
    cudaLaunchCheck();
}
