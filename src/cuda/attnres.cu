// attnres.cu — the Block Attention Residuals mixer (SPEC §1.4; src/cpu/attnres.c has the
// derivation). One block per token: the per-source reductions (‖u_j‖², q·u_j, g·u_j) by
// fixed block trees, the softmax over sources by one thread in source order, then every
// thread updates its own channels. ∂w, ∂γ through the deterministic column sums.
//
// The mixer is pure memory traffic (a few flops per byte), so the common case — at most
// AR_REG_SOURCES sources, C a multiple of 4 and at most 4096 — keeps each thread's four
// channels of every source in registers: the forward reads each source once (the general
// kernel reads it twice), and the backward reads each source once and adds its share of ∂q
// (Σ_j c_j ρ_j u_j, summed over the block's rows) in the same pass, where the general path
// reads the sources twice more (once for the reductions' partner loop, once for ∂q's column
// sums). Both paths reduce in a fixed order, so results are deterministic.
#include "cuda_common.cuh"

#define AR_REG_SOURCES 8
static inline int ar_reg_ok(int n, int C) { return n >= 2 && n <= AR_REG_SOURCES && C % 4 == 0 && C <= 4096; }

// u[j] = this thread's four channels of source j at element `row` (zeros past n or C)
template <int NS>
__device__ __forceinline__ void load_sources(float4 (&u)[NS], const lm_sources &src, size_t row, bool on) {
#pragma unroll
    for (int j = 0; j < NS; j++) u[j] = ld4(src.p[j < src.n ? j : 0] + row, on && j < src.n);
}

// out [N, C] = Σ_j α_j u_j, one row per block, thread t owns channels 4t..4t+3.
template <int NS>
__global__ static void attnres_fwd_reg_k(float *out, float *alpha, lm_sources src, const float *w,
                                         const float *gamma, int C, float eps) {
    __shared__ float red[32 * 2 * NS], tot[2 * NS];
    const int n = src.n, c = 4 * threadIdx.x;
    const bool on = c < C;
    const size_t row = (size_t)blockIdx.x * C + c;
    const float4 wv = ld4(w + c, on), gv = ld4(gamma + c, on);
    const float4 q = mul4(wv, gv);
    float4 u[NS];
    load_sources<NS>(u, src, row, on);
    float part[2 * NS];
#pragma unroll
    for (int j = 0; j < NS; j++) {
        part[2 * j] = dot4(u[j], u[j]);
        part[2 * j + 1] = dot4(q, u[j]);
    }
    block_sums<2 * NS>(part, red, tot);   // every source read happens before out (maybe a source) is written
    if (threadIdx.x == 0) {
        float sc[NS], m = -INFINITY, sum = 0;
#pragma unroll
        for (int j = 0; j < NS; j++)
            if (j < n) { sc[j] = (1.0f / sqrtf(tot[2 * j] / C + eps)) * tot[2 * j + 1]; m = fmaxf(m, sc[j]); }
#pragma unroll
        for (int j = 0; j < NS; j++)
            if (j < n) { sc[j] = expf(sc[j] - m); sum += sc[j]; }
#pragma unroll
        for (int j = 0; j < NS; j++)
            if (j < n) { tot[j] = sc[j] / sum; alpha[(size_t)blockIdx.x * n + j] = tot[j]; }
    }
    __syncthreads();
    if (!on) return;
    float4 y = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int j = 0; j < NS; j++)
        if (j < n) axpy(y, tot[j], u[j]);
    *reinterpret_cast<float4 *>(out + row) = y;
}

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
    if (ar_reg_ok(src.n, C)) {
        const int th = lm_reg_row_threads(C);
        if (src.n <= 4) attnres_fwd_reg_k<4><<<N, th, 0, lm_cuda_stream()>>>(out, alpha, src, w, gamma, C, eps);
        else attnres_fwd_reg_k<8><<<N, th, 0, lm_cuda_stream()>>>(out, alpha, src, w, gamma, C, eps);
    } else {
        attnres_fwd_k<<<N, row_threads(C), 0, lm_cuda_stream()>>>(out, alpha, src, w, gamma, C, eps);
    }
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
            if (dsrc.p[j])
                dsrc.p[j][row + c] = (dsrc.assign >> j & 1 ? 0.f : dsrc.p[j][row + c]) + a[j] * gc + rho[j] * qc -
                                     s[j] * src.p[j][row + c];
    }
}

// The backward of rows [rpb·b, rpb·b + rpb) of block b, thread t owning channels 4t..4t+3:
// ∂u_j += α_j g + k_j q − m_j u_j with k_j = c_j ρ_j, m_j = c_j s_j ρ_j² / C (as attnres_bwd_k),
// and dq_part [b, C] = Σ_rows Σ_j k_j u_j (NULL: ∂q not wanted).
template <int NS>
__global__ static void attnres_bwd_reg_k(lm_source_grads dsrc, float *dq_part, const float *dout, lm_sources src,
                                         const float *alpha, const float *w, const float *gamma, int N, int C,
                                         float eps, int rpb) {
    __shared__ float red[32 * 3 * NS], tot[3 * NS];
    const int n = src.n, c = 4 * threadIdx.x;
    const bool on = c < C;
    const float4 wv = ld4(w + c, on), gv = ld4(gamma + c, on);
    const float4 q = mul4(wv, gv);
    float4 dq = make_float4(0.f, 0.f, 0.f, 0.f);
    const int i0 = blockIdx.x * rpb, i1 = min(N, i0 + rpb);
    for (int i = i0; i < i1; i++) {
        const size_t row = (size_t)i * C + c;
        const float4 g = ld4(dout + row, on);
        float4 u[NS];
        load_sources<NS>(u, src, row, on);
        float part[3 * NS];
#pragma unroll
        for (int j = 0; j < NS; j++) {
            part[3 * j] = dot4(u[j], u[j]);
            part[3 * j + 1] = dot4(q, u[j]);
            part[3 * j + 2] = dot4(g, u[j]);
        }
        block_sums<3 * NS>(part, red, tot);   // all reads of g (maybe a dsrc buffer) are done
        if (threadIdx.x == 0) {
            const float *a = alpha + (size_t)i * n;
            float gout = 0;
            for (int j = 0; j < n; j++) gout += a[j] * tot[3 * j + 2];
            for (int j = 0; j < n; j++) {
                const float rho = 1.0f / sqrtf(tot[3 * j] / C + eps), sj = rho * tot[3 * j + 1];
                const float cj = a[j] * (tot[3 * j + 2] - gout);
                tot[3 * j] = a[j];
                tot[3 * j + 1] = cj * rho;                  // k_j
                tot[3 * j + 2] = cj * sj * rho * rho / C;   // m_j
            }
        }
        __syncthreads();
        if (on) {
#pragma unroll
            for (int j = 0; j < NS; j++) {
                if (j >= n) continue;
                const float aj = tot[3 * j], kj = tot[3 * j + 1], mj = tot[3 * j + 2];
                axpy(dq, kj, u[j]);
                if (j >= dsrc.n || !dsrc.p[j]) continue;
                // one entry at a time: a buffer listed twice gets both updates
                float4 *d = reinterpret_cast<float4 *>(dsrc.p[j] + row);
                float4 v = dsrc.assign >> j & 1 ? make_float4(0.f, 0.f, 0.f, 0.f) : *d;
                v.x += aj * g.x + kj * q.x - mj * u[j].x;
                v.y += aj * g.y + kj * q.y - mj * u[j].y;
                v.z += aj * g.z + kj * q.z - mj * u[j].z;
                v.w += aj * g.w + kj * q.w - mj * u[j].w;
                *d = v;
            }
        }
    }
    if (dq_part && on) *reinterpret_cast<float4 *>(dq_part + (size_t)blockIdx.x * C + c) = dq;
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
    if (ar_reg_ok(n, C)) {
        const int rpb = lm_reg_rows_per_block(N), nb = (N + rpb - 1) / rpb, th = lm_reg_row_threads(C);
        float *part = want_dq ? (float *)lm_cuda_scratch(((size_t)nb + 1) * C * sizeof(float)) : NULL;
        if (n <= 4)
            attnres_bwd_reg_k<4><<<nb, th, 0, lm_cuda_stream()>>>(dsrc, part, dout, src, alpha, w, gamma, N, C, eps, rpb);
        else
            attnres_bwd_reg_k<8><<<nb, th, 0, lm_cuda_stream()>>>(dsrc, part, dout, src, alpha, w, gamma, N, C, eps, rpb);
        cudaLaunchCheck();
        if (want_dq) {
            float *dq = part + (size_t)nb * C;
            lm_cuda_colsum_final(dq, part, nb, C, 0);
            lm_cuda_acc_vec(dw, dq, gamma, C);
            lm_cuda_acc_vec(dgamma, dq, w, C);
        }
        return;
    }
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
