// cuda_common.cu — the backend's shared host state: stream, cuBLAS handle, workspace,
// error reporting; and the small shared kernels declared in cuda_common.cuh.
#include "cuda_common.cuh"

void lm_cuda_fail(const char *what, const char *expr, const char *file, int line) {
    lm_die("CUDA error: %s in %s at %s:%d", what, expr, file, line);
}

cudaStream_t lm_cuda_stream(void) { return 0; }   // the legacy default stream (see the header)

static cublasHandle_t g_cublas;
static void *g_scratch;
static size_t g_scratch_cap;

cublasHandle_t lm_cublas(void) {
    if (!g_cublas) {
        cublasCheck(cublasCreate(&g_cublas));
        cublasCheck(cublasSetStream(g_cublas, lm_cuda_stream()));
        // plain fp32 by default (matches the CPU reference to ~1e-6); LM_CUDA_TF32=1 lets
        // cuBLAS use TF32 tensor cores (10-bit mantissa products, ~1e-3 relative error)
        const char *tf = getenv("LM_CUDA_TF32");
        cublasCheck(cublasSetMathMode(g_cublas, tf && tf[0] == '1' ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    }
    return g_cublas;
}

void *lm_cuda_scratch(size_t bytes) {
    if (bytes == 0) bytes = 256;
    if (bytes > g_scratch_cap) {
        if (g_scratch) cudaCheck(cudaFree(g_scratch));   // waits for queued work
        size_t cap = bytes + bytes / 4;
        cudaCheck(cudaMalloc(&g_scratch, cap));
        g_scratch_cap = cap;
    }
    return g_scratch;
}

void lm_cuda_read(void *host, const void *dev, size_t bytes) {
    if (!bytes) return;
    cudaCheck(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, lm_cuda_stream()));
    cudaCheck(cudaStreamSynchronize(lm_cuda_stream()));
}

void lm_cuda_backend_shutdown(void) {
    if (g_cublas) { cublasDestroy(g_cublas); g_cublas = NULL; }
    if (g_scratch) { cudaFree(g_scratch); g_scratch = NULL; g_scratch_cap = 0; }
}

__global__ void colsum_final_k(float *sums, const float *part, int nch, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float s = 0.0f;
    for (int j = 0; j < nch; j++) s += part[(size_t)j * C + c];
    sums[c] = s;
}

__global__ static void acc_vec_k(float *dst, const float *src, const float *mul, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] += mul ? src[i] * mul[i] : src[i];
}
void lm_cuda_acc_vec(float *dst, const float *src, const float *mul, int n) {
    if (!dst || n <= 0) return;
    acc_vec_k<<<lm_cuda_blocks(n, 256), 256, 0, lm_cuda_stream()>>>(dst, src, mul, n);
    cudaLaunchCheck();
}
