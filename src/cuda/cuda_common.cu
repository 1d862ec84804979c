// cuda_common.cu — the backend's shared host state: stream, cuBLAS handle, workspace,
// error reporting; and the small shared kernels declared in cuda_common.cuh.
#include "cuda_common.cuh"
#include <string.h>
#include <cuda_bf16.h>
#include <cuda_profiler_api.h>

void lm_cuda_fail(const char *what, const char *expr, const char *file, int line) {
    lm_die("CUDA error: %s in %s at %s:%d", what, expr, file, line);
}

static cudaStream_t g_stream;
cudaStream_t lm_cuda_stream(void) {   // (see the header)
    if (!g_stream) cudaCheck(cudaStreamCreate(&g_stream));
    return g_stream;
}

static cublasHandle_t g_cublas;
static void *g_cublas_ws;
#define CUBLAS_WS_BYTES ((size_t)32 << 20)   // cuBLAS's own default on Hopper
static void *g_scratch;
static size_t g_scratch_cap;
static int g_gemm_mode = -1;   // lm_gemm_mode; -1: not yet read from LM_CUDA_GEMM

static const char *const GEMM_NAMES[] = {"fp32", "tf32", "bf16"};

int lm_cuda_gemm_mode(void) {
    if (g_gemm_mode < 0) {
        const char *s = getenv("LM_CUDA_GEMM");
        g_gemm_mode = LM_GEMM_BF16;
        if (s && *s) {
            int m = lm_cuda_gemm_from_name(s);
            if (m < 0) lm_die("LM_CUDA_GEMM='%s' is not one of fp32, tf32, bf16", s);
            g_gemm_mode = m;
        }
    }
    return g_gemm_mode;
}
void lm_cuda_set_gemm_mode(int mode) {
    LM_CHECK(mode >= LM_GEMM_FP32 && mode <= LM_GEMM_BF16, "bad GEMM mode %d", mode);
    g_gemm_mode = mode;
}
const char *lm_cuda_gemm_name(int mode) { return mode >= 0 && mode <= LM_GEMM_BF16 ? GEMM_NAMES[mode] : "?"; }
int lm_cuda_gemm_from_name(const char *s) {
    for (int m = 0; m <= LM_GEMM_BF16; m++)
        if (strcmp(s, GEMM_NAMES[m]) == 0) return m;
    return -1;
}

cublasHandle_t lm_cublas(void) {
    if (!g_cublas) {
        cublasCheck(cublasCreate(&g_cublas));
        cublasCheck(cublasSetStream(g_cublas, lm_cuda_stream()));
        // a workspace of our own: cuBLAS then never allocates inside a recorded step
        cudaCheck(cudaMalloc(&g_cublas_ws, CUBLAS_WS_BYTES));
        cublasCheck(cublasSetWorkspace(g_cublas, g_cublas_ws, CUBLAS_WS_BYTES));
    }
    // fp32: plain SGEMM (matches the CPU reference to ~1e-6); tf32 and bf16 let cuBLAS use
    // tensor cores (the bf16 GEMMs themselves are issued in bf16 by matmul.cu; this mode
    // covers the cuBLAS calls that stay fp32, e.g. Muon's Newton–Schulz)
    cublasCheck(cublasSetMathMode(g_cublas, lm_cuda_gemm_mode() == LM_GEMM_FP32 ? CUBLAS_DEFAULT_MATH
                                                                                : CUBLAS_TF32_TENSOR_OP_MATH));
    return g_cublas;
}

static cublasLtHandle_t g_cublaslt;
cublasLtHandle_t lm_cublaslt(void) {
    if (!g_cublaslt) cublasCheck(cublasLtCreate(&g_cublaslt));
    return g_cublaslt;
}
void *lm_cublas_workspace(size_t *bytes) {
    lm_cublas();   // allocates it
    *bytes = CUBLAS_WS_BYTES;
    return g_cublas_ws;
}

void *lm_cuda_scratch(size_t bytes) {
    if (bytes == 0) bytes = 256;
    if (bytes > g_scratch_cap) {
        if (lm_cuda_recording()) {   // the recorded ops hold the old block: spoiled, freed after
            lm_cuda_spoil_recording();
            lm_cuda_free_later(g_scratch);
        } else if (g_scratch) {
            cudaCheck(cudaFree(g_scratch));   // waits for queued work
        }
        size_t cap = bytes + bytes / 4;
        cudaCheck(cudaMalloc(&g_scratch, cap));
        g_scratch_cap = cap;
        lm_cuda_mem_changed();
    }
    return g_scratch;
}

void lm_cuda_read(void *host, const void *dev, size_t bytes) {
    if (!bytes) return;
    if (lm_cuda_recording()) {   // nothing has run: the recording is spoiled and its step re-run op by op
        lm_cuda_spoil_recording();
        memset(host, 0, bytes);
        return;
    }
    cudaCheck(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, lm_cuda_stream()));
    cudaCheck(cudaStreamSynchronize(lm_cuda_stream()));
}

void lm_cuda_sync(void) { cudaCheck(cudaDeviceSynchronize()); }
void lm_cuda_profiler(int on) { cudaCheck(on ? cudaProfilerStart() : cudaProfilerStop()); }
int lm_cuda_num_sms(void) {
    static int n = 0;
    if (!n) {
        int dev;
        cudaCheck(cudaGetDevice(&dev));
        cudaCheck(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    }
    return n;
}
size_t lm_cuda_free_bytes(void) {
    size_t fr = 0, tot = 0;
    cudaCheck(cudaMemGetInfo(&fr, &tot));
    return fr;
}
const char *lm_cuda_device_name(double *total_bytes) {
    static cudaDeviceProp prop;
    int dev = 0;
    cudaCheck(cudaGetDevice(&dev));
    cudaCheck(cudaGetDeviceProperties(&prop, dev));
    if (total_bytes) *total_bytes = (double)prop.totalGlobalMem;
    return prop.name;
}

void lm_cuda_backend_shutdown(void) {
    if (g_cublas) { cublasDestroy(g_cublas); g_cublas = NULL; }
    lm_cuda_lt_plans_free();
    if (g_cublaslt) { cublasLtDestroy(g_cublaslt); g_cublaslt = NULL; }
    if (g_cublas_ws) { cudaFree(g_cublas_ws); g_cublas_ws = NULL; }
    if (g_scratch) { cudaFree(g_scratch); g_scratch = NULL; g_scratch_cap = 0; }
    lm_cuda_weight_cache_free();
}

// Block: 8 columns × 32 row groups; group g adds parts g, g + 32, … in order, then thread row
// 0 adds the 32 group sums in order (a fixed tree). Many partial rows (a register kernel's
// blocks, ~1000) are read by 32 threads per column, 8 columns (one 32-byte sector) per block,
// so that C = 1024 gives 128 blocks (32-column blocks gave 32: a quarter of the SMs, 14 µs a
// call at 1024 partial rows — 117 calls per `small` B4 step).
#define COLSUM_COLS 8
__global__ void colsum_final_k(float *sums, const float *part, int nch, int C, int add) {
    __shared__ float sh[32][COLSUM_COLS + 1];
    const int tx = threadIdx.x % COLSUM_COLS, ty = threadIdx.x / COLSUM_COLS, c = blockIdx.x * COLSUM_COLS + tx;
    float s = 0.0f;
    if (c < C)
#pragma unroll 4
        for (int j = ty; j < nch; j += 32) s += part[(size_t)j * C + c];
    sh[ty][tx] = s;
    __syncthreads();
    if (ty == 0 && c < C) {
        float t = sh[0][tx];
        for (int r = 1; r < 32; r++) t += sh[r][tx];
        sums[c] = add ? sums[c] + t : t;
    }
}
void lm_cuda_colsum_final(float *sums, const float *part, int nch, int C, int add) {
    if (C <= 0) return;
    colsum_final_k<<<(C + COLSUM_COLS - 1) / COLSUM_COLS, 32 * COLSUM_COLS, 0, lm_cuda_stream()>>>(sums, part, nch, C, add);
    cudaLaunchCheck();
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

// y [n] = bf16(x [n]), 4 elements per step when x is 16-byte aligned
__global__ static void to_bf16_k(__nv_bfloat16 *y, const float *x, size_t n, int vec) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t done = 0;
    if (vec) {
        size_t n4 = n / 4;
        for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4; i += stride) {
            float4 v = reinterpret_cast<const float4 *>(x)[i];
            reinterpret_cast<__nv_bfloat162 *>(y)[2 * i] = __floats2bfloat162_rn(v.x, v.y);
            reinterpret_cast<__nv_bfloat162 *>(y)[2 * i + 1] = __floats2bfloat162_rn(v.z, v.w);
        }
        done = 4 * n4;
    }
    for (size_t i = done + blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += stride)
        y[i] = __float2bfloat16(x[i]);
}
// y [rows, ldy] columns 0..cols−1 = bf16(x [rows, cols]); 4 elements per step when the rows
// allow it (cols and ldy multiples of 4, x 16- and y 8-byte aligned)
__global__ static void to_bf16_rows_k(__nv_bfloat16 *y, long ldy, const float *x, long rows, long cols, int vec) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    if (vec) {
        const long c4 = cols / 4;
        for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)rows * c4; i += stride) {
            const long r = (long)(i / c4), c = 4 * (long)(i % c4);
            const float4 v = *reinterpret_cast<const float4 *>(x + r * cols + c);
            __nv_bfloat162 *d = reinterpret_cast<__nv_bfloat162 *>(y + r * ldy + c);
            d[0] = __floats2bfloat162_rn(v.x, v.y);
            d[1] = __floats2bfloat162_rn(v.z, v.w);
        }
        return;
    }
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (size_t)rows * cols; i += stride)
        y[(long)(i / cols) * ldy + (long)(i % cols)] = __float2bfloat16(x[i]);
}
void lm_cuda_to_bf16_rows(__nv_bfloat16 *y, long ldy, const float *x, long rows, long cols) {
    if (rows <= 0 || cols <= 0) return;
    if (ldy == cols) {
        lm_cuda_to_bf16(y, x, (size_t)rows * cols);
        return;
    }
    const int vec = cols % 4 == 0 && ldy % 4 == 0 && (uintptr_t)x % 16 == 0 && (uintptr_t)y % 8 == 0;
    unsigned g = lm_cuda_blocks(vec ? (size_t)rows * cols / 4 : (size_t)rows * cols, 256);
    if (g > 8192) g = 8192;
    to_bf16_rows_k<<<g, 256, 0, lm_cuda_stream()>>>(y, ldy, x, rows, cols, vec);
    cudaLaunchCheck();
}
// y: device buffer of n bf16 (4 elements per step when x is 16- and y 8-byte aligned)
void lm_cuda_to_bf16(__nv_bfloat16 *y, const float *x, size_t n) {
    if (!n) return;
    int vec = (uintptr_t)x % 16 == 0 && (uintptr_t)y % 8 == 0;
    unsigned g = lm_cuda_blocks(vec ? (n + 3) / 4 : n, 256);
    if (g > 8192) g = 8192;
    to_bf16_k<<<g, 256, 0, lm_cuda_stream()>>>(y, x, n, vec);
    cudaLaunchCheck();
}

int lm_reg_rows_per_block_fit(int N, const void *kernel, int threads, size_t smem) {
    const int r0 = lm_reg_rows_per_block(N);
    static int fit = -1;
    if (fit < 0) fit = !(getenv("LM_ROWS_FIT") && strcmp(getenv("LM_ROWS_FIT"), "0") == 0);
    if (!fit) return r0;
    static struct { const void *k; int threads; size_t smem; int per_sm; } seen[32];
    static int n_seen;
    int per_sm = 0;
    for (int i = 0; i < n_seen && !per_sm; i++)
        if (seen[i].k == kernel && seen[i].threads == threads && seen[i].smem == smem) per_sm = seen[i].per_sm;
    if (!per_sm) {
        cudaCheck(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
        if (per_sm < 1) per_sm = 1;
        if (n_seen < 32) seen[n_seen++] = {kernel, threads, smem, per_sm};
    }
    const long slots = (long)per_sm * lm_cuda_num_sms();
    int best = r0;
    double best_fill = -1;
    for (int r = r0; r >= 1 && 2 * r >= r0; r--) {
        const long nb = (N + r - 1) / r, waves = (nb + slots - 1) / slots;
        const double fill = (double)nb / (double)(waves * slots);   // busy share of the waves' slots
        if (fill > best_fill + 1e-9) { best = r; best_fill = fill; }
    }
    return best;
}

int lm_cuda_fits(const void *kernel, int threads) {
    static struct { const void *k; int max; } seen[64];
    static int n_seen;
    for (int i = 0; i < n_seen; i++)
        if (seen[i].k == kernel) return threads <= seen[i].max;
    cudaFuncAttributes at;
    cudaCheck(cudaFuncGetAttributes(&at, kernel));
    if (n_seen < 64) seen[n_seen++] = {kernel, at.maxThreadsPerBlock};
    return threads <= at.maxThreadsPerBlock;
}
