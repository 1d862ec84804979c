// attnres.cu — the Block Attention Residuals mixer (SPEC §1.4; src/cpu/attnres.c has the
// derivation). One block per token: the per-source reductions (‖u_j‖², q·u_j, g·u_j) by
// fixed block trees, the softmax over sources by one thread in source order, then every
// thread updates its own channels. ∂w, ∂γ through the deterministic column sums.
#include "cuda_common.cuh"

static inline int row_threads(int C) { return C >= 256 ? 256 : ((C + 31) / 32) * 32; }

__global__ static void attnres_fwd_k(float *out, float *alpha, lm_sources src, const float *w, const float *gamma,
                                     int C, float eps) {
    __shared__ float sh[32];
    __shared__ float a_sh[LM_MAX_SOURCES];
    const int n = src.n, i = blockIdx.x;
    const size_t row = (size_t)i * C;
    float *y = out + row;
    if (n == 1) {   // softmax over one score is exactly 1: out = u_0
        if (threadIdx.x == 0) alpha[i] = 1.0f;
        const float *x = src.p[0] + row;
        for (int c = threadIdx.x; c < C; c += blockDim.x) y[c] = x[c];
        return;
    }
    for (int j = 0; j < n; j++) {
        const float *x = src.p[j] + row;
        float ss = 0, dot = 0;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            ss += x[c] * x[c];
            dot += gamma[c] * w[c] * x[c];
        }
        ss = block_sum(ss, sh);
        dot = block_sum(dot, sh);
        if (threadIdx.x == 0) a_sh[j] = (1.0f / sqrtf(ss / C + eps)) * dot;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float m = a_sh[0], sum = 0;
        for (int j = 1; j < n; j++) m = a_sh[j] > m ? a_sh[j] : m;
        for (int j = 0; j < n; j++) { a_sh[j] = expf(a_sh[j] - m); sum += a_sh[j]; }
        for (int j = 0; j < n; j++) { a_sh[j] = a_sh[j] / sum; alpha[(size_t)i * n + j] = a_sh[j]; }
    }
    __syncthreads();   // every read of the sources above happens before out (maybe a source) is written
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = 0;
        for (int j = 0; j < n; j++) acc += a_sh[j] * src.p[j][row + c];
        y[c] = acc;
    }
}

void cuda_attnres_fwd(real *out, real *alpha, lm_sources src, const real *w, const real *gamma, int N, int C,
                      real eps) {
    LM_CHECK(src.n >= 1 && src.n <= LM_MAX_SOURCES, "attnres: %d sources", src.n);
    if (N <= 0 || C <= 0) return;
    attnres_fwd_k<<<N, row_threads(C), 0, lm_cuda_stream()>>>(out, alpha, src, w, gamma, C, eps);
    cudaLaunchCheck();
}

// per token: c_j = α_j (t_j − Σ_l α_l t_l), t_j = g·u_j;
//   ∂u_j += α_j g + c_j ρ_j q − (c_j s_j ρ_j² / C) u_j;   cq[i, j] = c_j ρ_j (for ∂q)
__global__ static void attnres_bwd_k(lm_source_grads dsrc, float *cq, const float *dout, lm_sources src,
                                     const float *alpha, const float *w, const float *gamma, int C, float eps,
                                     int any_dsrc) {
    __shared__ float sh[32];
    __shared__ float rho[LM_MAX_SOURCES], s[LM_MAX_SOURCES], t[LM_MAX_SOURCES];
    const int n = src.n, i = blockIdx.x;
    const size_t row = (size_t)i * C;
    const float *g = dout + row, *a = alpha + (size_t)i * n;
    for (int j = 0; j < n; j++) {
        const float *x = src.p[j] + row;
        float ss = 0, dot = 0, tg = 0;
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            ss += x[c] * x[c];
            dot += gamma[c] * w[c] * x[c];
            tg += g[c] * x[c];
        }
        ss = block_sum(ss, sh);
        dot = block_sum(dot, sh);
        tg = block_sum(tg, sh);
        if (threadIdx.x == 0) {
            rho[j] = 1.0f / sqrtf(ss / C + eps);
            s[j] = rho[j] * dot;
            t[j] = tg;
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float gout = 0;
        for (int j = 0; j < n; j++) gout += a[j] * t[j];
        for (int j = 0; j < n; j++) {
            float cj = a[j] * (t[j] - gout);
            float kq = cj * rho[j], ku = cj * s[j] * rho[j] * rho[j] / C;
            if (cq) cq[(size_t)i * n + j] = kq;
            rho[j] = kq;   // reuse: rho ← kq, s ← ku
            s[j] = ku;
        }
    }
    __syncthreads();   // all reads of g (which may be a dsrc buffer) are done
    if (!any_dsrc) return;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        const float gc = g[c], qc = gamma[c] * w[c];
        for (int j = 0; j < dsrc.n; j++)
            if (dsrc.p[j]) dsrc.p[j][row + c] += a[j] * gc + rho[j] * qc - s[j] * src.p[j][row + c];
    }
}

struct attnres_dq_f {   // Σ_j cq[i, j] · u_j[i, c]
    lm_sources src;
    const float *cq;
    int C;
    __device__ float operator()(int i, int c) const {
        float acc = 0;
        for (int j = 0; j < src.n; j++) acc += cq[(size_t)i * src.n + j] * src.p[j][(size_t)i * C + c];
        return acc;
    }
};

void cuda_attnres_bwd(lm_source_grads dsrc, real *dw, real *dgamma, const real *dout, lm_sources src,
                      const real *alpha, const real *w, const real *gamma, int N, int C, real eps) {
    const int n = src.n;
    LM_CHECK(n >= 1 && n <= LM_MAX_SOURCES && dsrc.n >= 0 && dsrc.n <= n, "attnres: %d sources, %d grads", n, dsrc.n);
    int any_dsrc = 0;
    for (int j = 0; j < dsrc.n; j++) any_dsrc |= dsrc.p[j] != NULL;
    const int want_dq = dw != NULL || dgamma != NULL;
    if (N <= 0 || C <= 0 || (!any_dsrc && !want_dq)) return;
    size_t cqf = want_dq ? lm_align256((size_t)N * n * sizeof(float)) / sizeof(float) : 0;
    size_t wsf = want_dq ? colsum_ws_floats(N, C) : 0;
    float *ws = (float *)lm_cuda_scratch((cqf + wsf) * sizeof(float));
    float *cq = want_dq ? ws : NULL;
    attnres_bwd_k<<<N, row_threads(C), 0, lm_cuda_stream()>>>(dsrc, cq, dout, src, alpha, w, gamma, C, eps, any_dsrc);
    cudaLaunchCheck();
    if (want_dq) {
        float *dq = colsum(ws + cqf, N, C, attnres_dq_f{src, cq, C});
        lm_cuda_acc_vec(dw, dq, gamma, C);
        lm_cuda_acc_vec(dgamma, dq, w, C);
    }
}
