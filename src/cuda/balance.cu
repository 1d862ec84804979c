// balance.cu — router statistics and losses: the Quantile Balancing margin histogram,
// the Switch-style auxiliary loss and the router z-loss. The two losses return host
// doubles (the op waits for them); their per-token terms are summed in a fixed order.
#include "cuda_common.cuh"

// hist [E, nbins] += counts of r_ij = alpha_i − s_ij in bins of `width` from `lo`
// (below lo and NaN → bin 0; at or above the top edge → bin nbins−1). Integer atomics: exact.
__device__ __forceinline__ int qb_bin(float alpha, float s, float lo, float inv, int nbins) {
    const float t = (alpha - s - lo) * inv;
    return t >= (float)nbins ? nbins - 1 : (t >= 1 ? (int)t : 0);
}

// Where one expert's bins do not fit in shared memory: a global atomic per (token, expert)
__global__ static void qb_hist_k(int *hist, const float *s, const float *alpha, float lo, float inv, int N, int E,
                                 int nbins) {
    size_t n = (size_t)N * E;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t i = e / E;
        int j = (int)(e % E);
        atomicAdd(&hist[(size_t)j * nbins + qb_bin(alpha[i], s[e], lo, inv, nbins)], 1);
    }
}

// Block (x, y): the tokens [x·tpb, (x+1)·tpb) against experts [y·eb, y·eb + eb), counted in a
// shared [eb, nbins] histogram, then its non-zero bins added to hist. Why: the margins of one
// expert crowd into a few bins around its quantile, so the global kernel's atomics queue on
// the same addresses (ncu, session 42, small preset B4 step: 30 µs a launch for 16,384 × 80
// margins, no DRAM traffic to speak of).
#define QB_HIST_THREADS 512
#define QB_HIST_SMEM (96 * 1024)
__global__ static void __launch_bounds__(QB_HIST_THREADS) qb_hist_smem_k(int *hist, const float *s, const float *alpha,
                                                                         float lo, float inv, int N, int E, int nbins,
                                                                         int eb, int tpb) {
    extern __shared__ int qb_sh[];   // [ne][nbins]
    const int j0 = blockIdx.y * eb, ne = min(eb, E - j0), i0 = blockIdx.x * tpb, nt = min(tpb, N - i0);
    const int nb = ne * nbins;
    for (int x = threadIdx.x; x < nb; x += blockDim.x) qb_sh[x] = 0;
    __syncthreads();
    for (int e = threadIdx.x; e < nt * ne; e += blockDim.x) {
        const int i = i0 + e / ne, j = e % ne;
        atomicAdd(&qb_sh[j * nbins + qb_bin(alpha[i], s[(size_t)i * E + j0 + j], lo, inv, nbins)], 1);
    }
    __syncthreads();
    int *h = hist + (size_t)j0 * nbins;   // the block's experts' rows are contiguous
    for (int x = threadIdx.x; x < nb; x += blockDim.x)
        if (qb_sh[x]) atomicAdd(&h[x], qb_sh[x]);
}

void cuda_qb_hist_accum(int *hist, const real *s, const real *alpha, real lo, real width, int N, int E, int nbins) {
    size_t n = (size_t)N * E;
    if (!n || nbins <= 0) return;
    const real inv = 1 / width;
    const int ebmax = QB_HIST_SMEM / (int)sizeof(int) / nbins;
    if (ebmax < 1) {
        qb_hist_k<<<lm_cuda_blocks(n, 256), 256, 0, lm_cuda_stream()>>>(hist, s, alpha, lo, inv, N, E, nbins);
        cudaLaunchCheck();
        return;
    }
    static int attr_set = 0;
    if (!attr_set) {
        cudaCheck(cudaFuncSetAttribute(qb_hist_smem_k, cudaFuncAttributeMaxDynamicSharedMemorySize, QB_HIST_SMEM));
        attr_set = 1;
    }
    // expert groups of equal size; about a block per SM over all groups
    const int ny = (E + ebmax - 1) / ebmax, eb = (E + ny - 1) / ny;
    int nx = lm_cuda_num_sms() / ny;
    nx = nx < 1 ? 1 : nx > N ? N : nx;
    const int tpb = (N + nx - 1) / nx;
    nx = (N + tpb - 1) / tpb;
    const size_t smem = (size_t)eb * nbins * sizeof(int);
    qb_hist_smem_k<<<dim3((unsigned)nx, (unsigned)ny), QB_HIST_THREADS, smem, lm_cuda_stream()>>>(
        hist, s, alpha, lo, inv, N, E, nbins, eb, tpb);
    cudaLaunchCheck();
}

// sel [E, 3]: per expert (one block) the first bin where the row's cumulative count reaches
// target. Thread t sums bins [t·r, t·r + r); an exclusive scan of those sums (warp shuffles,
// then the warps' totals) gives each run's count before it; the one run containing the
// crossing walks its bins. All integer: the same answer as the host loop.
#define SEL_THREADS 256
__global__ static void qb_select_k(int *sel, const int *hist, int nbins, int target) {
    __shared__ int warp_tot[SEL_THREADS / 32];
    const int j = blockIdx.x, t = threadIdx.x, lane = t & 31, w = t >> 5;
    const int r = (nbins + SEL_THREADS - 1) / SEL_THREADS, h0 = min(nbins, t * r), h1 = min(nbins, h0 + r);
    const int *row = hist + (size_t)j * nbins;
    int s = 0;
    for (int h = h0; h < h1; h++) s += row[h];
    int incl = s;   // inclusive scan within the warp
    for (int o = 1; o < 32; o <<= 1) {
        int v = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += v;
    }
    if (lane == 31) warp_tot[w] = incl;
    __syncthreads();
    int before = incl - s, total = 0;
    for (int k = 0; k < SEL_THREADS / 32; k++) {
        if (k < w) before += warp_tot[k];
        total += warp_tot[k];
    }
    if (before < target && before + s >= target) {
        int h = h0;
        while (before + row[h] < target) before += row[h++];
        sel[3 * j] = h;
        sel[3 * j + 1] = before;
        sel[3 * j + 2] = row[h];
    } else if (t == 0 && total < target) {
        sel[3 * j] = nbins;
        sel[3 * j + 1] = total;
        sel[3 * j + 2] = 0;
    }
}

void cuda_qb_hist_select(int *sel, const int *hist, int E, int nbins, int target) {
    if (E <= 0) return;
    LM_CHECK(nbins > 0 && target >= 1, "qb_hist_select: nbins %d, target %d", nbins, target);
    qb_select_k<<<E, SEL_THREADS, 0, lm_cuda_stream()>>>(sel, hist, nbins, target);
    cudaLaunchCheck();
}

// Σ_i v[i] by one block (each thread a strided partial, then a fixed tree): deterministic
__global__ static void sum_d_k(double *out, const double *v, int n) {
    __shared__ double sh[32];
    double s = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += v[i];
    s = block_sum_d(s, sh);
    if (threadIdx.x == 0) *out = s;
}
static double sum_tokens(double *ws, int N) {
    sum_d_k<<<1, 1024, 0, lm_cuda_stream()>>>(ws + N, ws, N);
    cudaLaunchCheck();
    double r;
    lm_cuda_read(&r, ws + N, sizeof r);
    return r;
}

// per token: Σ_j counts_j · s_ij / S_i in double
__global__ static void aux_terms_k(double *term, const float *s, const int *counts, int N, int E) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    const float *si = s + (size_t)i * E;
    double S = 0, fs = 0;
    for (int j = 0; j < E; j++) {
        S += si[j];
        fs += (double)counts[j] * si[j];
    }
    term[i] = fs / S;
}

double cuda_moe_aux_fwd(const real *s, const int *counts, int N, int E, int k, real coef) {
    if (N <= 0) return 0;
    double *ws = (double *)lm_cuda_scratch(((size_t)N + 1) * sizeof(double));
    aux_terms_k<<<(N + 127) / 128, 128, 0, lm_cuda_stream()>>>(ws, s, counts, N, E);
    cudaLaunchCheck();
    double acc = sum_tokens(ws, N);
    return (double)coef * E * acc / ((double)N * N * k);
}

__global__ static void aux_bwd_k(float *dz, const float *s, const int *counts, int N, int E, float c, float fscale) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    const float *si = s + (size_t)i * E;
    float S = 0, F = 0;
    for (int j = 0; j < E; j++) {
        S += si[j];
        F += counts[j] * fscale * si[j];
    }
    for (int j = 0; j < E; j++) {
        float ds = c * (counts[j] * fscale - F / S) / S;
        dz[(size_t)i * E + j] += ds * si[j] * (1 - si[j]);
    }
}

void cuda_moe_aux_bwd(real *dz, const real *s, const int *counts, int N, int E, int k, real coef, real dloss) {
    if (!dz || N <= 0) return;
    const real c = dloss * coef * E / N;
    const real fscale = (real)1 / ((real)N * k);
    aux_bwd_k<<<(N + 127) / 128, 128, 0, lm_cuda_stream()>>>(dz, s, counts, N, E, c, fscale);
    cudaLaunchCheck();
}

__device__ __forceinline__ float row_lse(const float *z, int E) {
    float m = z[0];
    for (int j = 1; j < E; j++) m = z[j] > m ? z[j] : m;
    float sum = 0;
    for (int j = 0; j < E; j++) sum += expf(z[j] - m);
    return m + logf(sum);
}

__global__ static void zloss_terms_k(double *term, const float *z, int N, int E) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    double l = row_lse(z + (size_t)i * E, E);
    term[i] = l * l;
}

double cuda_moe_zloss_fwd(const real *z, int N, int E, real coef) {
    if (N <= 0) return 0;
    double *ws = (double *)lm_cuda_scratch(((size_t)N + 1) * sizeof(double));
    zloss_terms_k<<<(N + 127) / 128, 128, 0, lm_cuda_stream()>>>(ws, z, N, E);
    cudaLaunchCheck();
    return (double)coef * sum_tokens(ws, N) / N;
}

__global__ static void zloss_bwd_k(float *dz, const float *z, int N, int E, float coef, float dloss) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    const float *zi = z + (size_t)i * E;
    float l = row_lse(zi, E);
    float c = dloss * coef * 2 * l / N;
    for (int j = 0; j < E; j++) dz[(size_t)i * E + j] += c * expf(zi[j] - l);
}

void cuda_moe_zloss_bwd(real *dz, const real *z, int N, int E, real coef, real dloss) {
    if (!dz || N <= 0) return;
    zloss_bwd_k<<<(N + 127) / 128, 128, 0, lm_cuda_stream()>>>(dz, z, N, E, coef, dloss);
    cudaLaunchCheck();
}
