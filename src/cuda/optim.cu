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
// VEC: the four arrays are 16-byte aligned and n4 = n/4 float4s are updated (the
// optimizer is bandwidth-bound: 28 bytes per parameter; 16-byte accesses keep more
// of them in flight); the tail (and unaligned tensors) element by element.
// pb (may be NULL, 8-byte aligned): the weight's bf16 copy (weight_cache.cu), rewritten
// here from the new values — 2 more bytes per parameter instead of a later pass of 6
__global__ static void adamw_k(float *p, const float *g, float *m, float *v, __nv_bfloat16 *pb, size_t n, float lr,
                               float b1, float b2, float eps, float wd, float bc1, float bc2, float gscale, int vec) {
    const size_t stride = (size_t)gridDim.x * blockDim.x, i0 = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    size_t done = 0;
    if (vec) {
        const size_t n4 = n / 4;
        for (size_t i = i0; i < n4; i += stride) {
            float4 pp = reinterpret_cast<float4 *>(p)[i], mm = reinterpret_cast<float4 *>(m)[i];
            float4 vv = reinterpret_cast<float4 *>(v)[i], gg = reinterpret_cast<const float4 *>(g)[i];
            adamw_one(pp.x, gg.x, mm.x, vv.x, lr, b1, b2, eps, wd, bc1, bc2, gscale);
            adamw_one(pp.y, gg.y, mm.y, vv.y, lr, b1, b2, eps, wd, bc1, bc2, gscale);
            adamw_one(pp.z, gg.z, mm.z, vv.z, lr, b1, b2, eps, wd, bc1, bc2, gscale);
            adamw_one(pp.w, gg.w, mm.w, vv.w, lr, b1, b2, eps, wd, bc1, bc2, gscale);
            reinterpret_cast<float4 *>(p)[i] = pp;
            reinterpret_cast<float4 *>(m)[i] = mm;
            reinterpret_cast<float4 *>(v)[i] = vv;
            if (pb) {
                reinterpret_cast<__nv_bfloat162 *>(pb)[2 * i] = __floats2bfloat162_rn(pp.x, pp.y);
                reinterpret_cast<__nv_bfloat162 *>(pb)[2 * i + 1] = __floats2bfloat162_rn(pp.z, pp.w);
            }
        }
        done = 4 * n4;
    }
    for (size_t i = done + i0; i < n; i += stride) {
        adamw_one(p[i], g[i], m[i], v[i], lr, b1, b2, eps, wd, bc1, bc2, gscale);
        if (pb) pb[i] = __float2bfloat16(p[i]);
    }
}

void cuda_adamw(real *p, const real *g, real *m, real *v, size_t n, real lr, real b1, real b2, real eps, real wd,
                real bc1, real bc2, real gscale) {
    if (!n) return;
    lm_cuda_weights_written(p, n * sizeof(real));
    __nv_bfloat16 *pb = lm_cuda_weight_bf16_claim(p, n);   // NULL unless p is a weight with a copy
    const int vec = ((uintptr_t)p | (uintptr_t)g | (uintptr_t)m | (uintptr_t)v) % 16 == 0 && (uintptr_t)pb % 8 == 0;
    unsigned blocks = lm_cuda_blocks(vec ? (n + 3) / 4 : n, 256);
    adamw_k<<<blocks, 256, 0, lm_cuda_stream()>>>(p, g, m, v, pb, n, lr, b1, b2, eps, wd, bc1, bc2, gscale, vec);
    cudaLaunchCheck();
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
