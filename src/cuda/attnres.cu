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
#include "wgmma.cuh"   // its cp.async helpers
#include <stdlib.h>

#define AR_REG_SOURCES 8
// The register kernels are templates over the sources they hold (NS ≥ n): 4, 6 or 8 — each
// source slot costs 4 registers per thread in the forward and ~10 in the backward, whose
// occupancy registers bound. AR_LAUNCH runs K<NS>, AR_KERNEL names it (for lm_cuda_fits).
static inline int ar_ns(int n) { return n <= 4 ? 4 : n <= 6 ? 6 : 8; }
#define AR_LAUNCH(n, K, grid, th, ...)                                                   \
    do {                                                                                 \
        switch (ar_ns(n)) {                                                              \
        case 4: K<4><<<(grid), (th), 0, lm_cuda_stream()>>>(__VA_ARGS__); break;         \
        case 6: K<6><<<(grid), (th), 0, lm_cuda_stream()>>>(__VA_ARGS__); break;         \
        default: K<8><<<(grid), (th), 0, lm_cuda_stream()>>>(__VA_ARGS__); break;        \
        }                                                                                \
    } while (0)
#define AR_KERNEL(n, K) \
    (ar_ns(n) == 4 ? (const void *)K<4> : ar_ns(n) == 6 ? (const void *)K<6> : (const void *)K<8>)
static inline int ar_reg_ok(int n, int C) { return n >= 2 && n <= AR_REG_SOURCES && C % 4 == 0 && C <= 4096; }
// Rows whose register-kernel blocks the register file cannot hold (lm_cuda_fits) take the
// general kernels: the backward's with more than 4 sources past C ≈ 2900. The fused mixer +
// norm (ar_norm_fused_ok, after its kernels) runs where its kernels fit — up to C ≈ 3500 —
// else the two ops in turn.

// u[j] = this thread's four channels of source j at element `row` (zeros past n or C)
template <int NS>
__device__ __forceinline__ void load_sources(float4 (&u)[NS], const lm_sources &src, size_t row, bool on) {
#pragma unroll
    for (int j = 0; j < NS; j++) u[j] = ld4(src.p[j < src.n ? j : 0] + row, on && j < src.n);
}

// α of one row from its sources' four channels per thread u (q = γ ⊙ w, this thread's): into
// tot[0..n) for every thread on return, and alpha_row[0..n). red: [32·2·NS], tot: [2·NS] shared.
template <int NS>
__device__ __forceinline__ void mix_alpha(const float4 (&u)[NS], float4 q, int n, int C, float eps, float *red,
                                          float *tot, float *alpha_row) {
    float part[2 * NS];
#pragma unroll
    for (int j = 0; j < NS; j++) {
        part[2 * j] = dot4(u[j], u[j]);
        part[2 * j + 1] = dot4(q, u[j]);
    }
    block_sums<2 * NS>(part, red, tot);
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
            if (j < n) { tot[j] = sc[j] / sum; alpha_row[j] = tot[j]; }
    }
    __syncthreads();
}

// y = Σ_j α_j u_j over this thread's four channels (α in tot, as mix_alpha leaves it)
template <int NS>
__device__ __forceinline__ float4 mix_sum(const float4 (&u)[NS], const float *a, int n) {
    float4 y = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int j = 0; j < NS; j++)
        if (j < n) axpy(y, a[j], u[j]);
    return y;
}

// The mix of row blockIdx.x over this thread's four channels (zeros past C), thread t owning
// channels 4t..4t+3: the sources loaded (every read done before this returns, so an output may
// alias a source), α written to alpha (as mix_alpha; red, tot likewise), y = Σ_j α_j u_j.
template <int NS>
__device__ __forceinline__ float4 mix_row(const lm_sources &src, const float *w, const float *gamma, float *alpha,
                                          int C, float eps, float *red, float *tot) {
    const int c = 4 * threadIdx.x;
    const bool on = c < C;
    const float4 q = mul4(ld4(w + c, on), ld4(gamma + c, on));
    float4 u[NS];
    load_sources<NS>(u, src, (size_t)blockIdx.x * C + c, on);
    mix_alpha<NS>(u, q, src.n, C, eps, red, tot, alpha + (size_t)blockIdx.x * src.n);
    return mix_sum<NS>(u, tot, src.n);
}

// out [N, C] = Σ_j α_j u_j, one row per block.
template <int NS>
__global__ static void attnres_fwd_reg_k(float *out, float *alpha, lm_sources src, const float *w,
                                         const float *gamma, int C, float eps) {
    __shared__ float red[32 * 2 * NS], tot[2 * NS];
    const float4 y = mix_row<NS>(src, w, gamma, alpha, C, eps, red, tot);
    const int c = 4 * threadIdx.x;
    if (c < C) *reinterpret_cast<float4 *>(out + (size_t)blockIdx.x * C + c) = y;
}

// The mixer and the RMSNorm of its output in one pass (attnres_norm_fwd): as attnres_fwd_reg_k,
// then rmsnorm_fwd_reg_k on the mix y, which stays in registers (neither stored nor read back).
// xn [N, C] (or NULL, lo given), rstd [N], lo: xn in bf16 (or NULL).
template <int NS>
__global__ static void attnres_norm_fwd_reg_k(float *xn, float *rstd, __nv_bfloat16 *lo, float *alpha,
                                              lm_sources src, const float *w, const float *gamma, const float *gain,
                                              int C, float eps) {
    __shared__ float red[32 * 2 * NS], tot[2 * NS], ss[1];
    const float4 y = mix_row<NS>(src, w, gamma, alpha, C, eps, red, tot);
    const int c = 4 * threadIdx.x;
    rms_row_out(y, xn, lo, rstd + blockIdx.x, gain, (size_t)blockIdx.x * C + c, c < C, C, eps, red, ss);
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
    const int th = lm_reg_row_threads(C);
    if (ar_reg_ok(src.n, C) && lm_cuda_fits(AR_KERNEL(src.n, attnres_fwd_reg_k), th)) {
        AR_LAUNCH(src.n, attnres_fwd_reg_k, N, th, out, alpha, src, w, gamma, C, eps);
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

// One row's backward coefficients, by one thread: from the per-source sums in tot[S·j ..] —
// ‖u_j‖², q·u_j, t_j = g·u_j (g: the mix's output gradient) — and α (a), the coefficients of
// ∂u_j = α_j g + k_j q − m_j u_j replace them: α_j, k_j = c_j ρ_j, m_j = c_j s_j ρ_j² / C with
// c_j = α_j (t_j − Σ_l α_l t_l) (as attnres_bwd_k).
__device__ __forceinline__ void mix_bwd_coefs(float *tot, int S, const float *a, int n, int C, float eps) {
    float gout = 0;
    for (int j = 0; j < n; j++) gout += a[j] * tot[S * j + 2];
    for (int j = 0; j < n; j++) {
        const float rho = 1.0f / sqrtf(tot[S * j] / C + eps), sj = rho * tot[S * j + 1];
        const float cj = a[j] * (tot[S * j + 2] - gout);
        tot[S * j] = a[j];
        tot[S * j + 1] = cj * rho;                  // k_j
        tot[S * j + 2] = cj * sj * rho * rho / C;   // m_j
    }
}

// This thread's channels of one row: ∂u_j += α_j g + k_j q − m_j u_j (coefficients as
// mix_bwd_coefs leaves them, stride S), dq += Σ_j k_j u_j.
template <int NS>
__device__ __forceinline__ void mix_bwd_apply(const lm_source_grads &dsrc, size_t row, const float4 (&u)[NS], int n,
                                              float4 g, float4 q, const float *tot, int S, float4 &dq) {
#pragma unroll
    for (int j = 0; j < NS; j++) {
        if (j >= n) continue;
        const float aj = tot[S * j], kj = tot[S * j + 1], mj = tot[S * j + 2];
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
        if (dsrc.lo && j == dsrc.lo_j) st4_bf16((__nv_bfloat16 *)dsrc.lo + row, v);
    }
}

// The backward of rows [rpb·b, rpb·b + rpb) of block b, thread t owning channels 4t..4t+3:
// ∂u_j += α_j g + k_j q − m_j u_j (mix_bwd_coefs), and dq_part [b, C] = Σ_rows Σ_j k_j u_j
// (NULL: ∂q not wanted).
template <int NS>
__global__ static void attnres_bwd_reg_k(lm_source_grads dsrc, float *dq_part, const float *dout, lm_sources src,
                                         const float *alpha, const float *w, const float *gamma, int N, int C,
                                         float eps, int rpb) {
    __shared__ float red[32 * 3 * NS], tot[3 * NS];
    const int n = src.n, c = 4 * threadIdx.x;
    const bool on = c < C;
    const float4 q = mul4(ld4(w + c, on), ld4(gamma + c, on));
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
        if (threadIdx.x == 0) mix_bwd_coefs(tot, 3, alpha + (size_t)i * n, n, C, eps);
        __syncthreads();
        if (on) mix_bwd_apply<NS>(dsrc, row, u, n, g, q, tot, 3, dq);
    }
    if (dq_part && on) *reinterpret_cast<float4 *>(dq_part + (size_t)blockIdx.x * C + c) = dq;
}

// The backward of attnres_norm_fwd_reg_k over rows [rpb·b, rpb·b + rpb) of block b, from the
// norm's output gradient dxn: the mix y = Σ_j α_j u_j recomputed in registers, then the
// RMSNorm's backward g = r·(gain ⊙ dxn) − (r³/C)·y·Σ_c(gain ⊙ dxn ⊙ y) and the mixer's with that
// g — from one block reduction per row: t_j = g·u_j = r·(gain ⊙ dxn)·u_j − (r³/C)·Σ(…)·(y·u_j),
// and Σ_c(gain ⊙ dxn ⊙ y) = Σ_j α_j (gain ⊙ dxn)·u_j. (Reducing t_j in a second pass, once g is
// known, halves the rounding error at C = 2048 but costs 20% more time: the barriers per row
// double.) dq_part as attnres_bwd_reg_k's; dgain_part [b, C] = Σ_rows r·dxn ⊙ y (NULL: not wanted).
// (registers capped at 72, from 77, so that blocks of 256 threads run 3 to an SM)
// PF: a row's sources and dxn come through shared memory, the next row's copies (cp.async,
// this thread's own channels: no barrier) in flight while this row is reduced and applied —
// the loads' latency was on every row's critical path; and the block's α and rstd are loaded
// once. Dynamic shared memory: 2 × (NS + 1) float4 per thread (ar_norm_pf_bytes).
template <int NS, bool PF>
__global__ static void __maxnreg__(72) attnres_norm_bwd_reg_k(lm_source_grads dsrc, float *dq_part, float *dgain_part,
                                              const float *dxn, lm_sources src, const float *alpha, const float *rstd,
                                              const float *w, const float *gamma, const float *gain, int N, int C,
                                              float eps, int rpb) {
    __shared__ float red[32 * 4 * NS], tot[4 * NS + 1];
    __shared__ float arow[PF ? 16 * (NS + 1) : 1];   // PF: α [rpb][n], then rstd [rpb] (rpb ≤ 16)
    extern __shared__ float4 pf[];                    // PF: [2][NS + 1][blockDim.x]
    const int n = src.n, c = 4 * threadIdx.x, nt = blockDim.x;
    const bool on = c < C;
    const float4 q = mul4(ld4(w + c, on), ld4(gamma + c, on)), gn = ld4(gain + c, on);
    float4 dq = make_float4(0.f, 0.f, 0.f, 0.f), dg = dq;
    const int i0 = blockIdx.x * rpb, i1 = min(N, i0 + rpb);
    // PF: row i's n sources and dxn into slot (i − i0) & 1
    auto issue = [&](int i) {
        if (on) {
            float4 *slot = pf + ((i - i0) & 1) * (NS + 1) * nt + threadIdx.x;
            const size_t row = (size_t)i * C + c;
#pragma unroll
            for (int j = 0; j < NS; j++)
                if (j < n) wg_cp16((uint32_t)__cvta_generic_to_shared(slot + j * nt), src.p[j] + row, true);
            wg_cp16((uint32_t)__cvta_generic_to_shared(slot + NS * nt), dxn + row, true);
        }
        wg_cp_commit();
    };
    if constexpr (PF) {
        if (i0 < i1) issue(i0);
        for (int e = threadIdx.x; e < (i1 - i0) * n; e += nt) arow[e] = alpha[(size_t)i0 * n + e];
        for (int e = threadIdx.x; e < i1 - i0; e += nt) arow[16 * NS + e] = rstd[i0 + e];
        __syncthreads();
    }
    for (int i = i0; i < i1; i++) {
        const size_t row = (size_t)i * C + c;
        const float *a = PF ? arow + (i - i0) * n : alpha + (size_t)i * n;
        const float r = PF ? arow[16 * NS + i - i0] : rstd[i];
        float4 dx, u[NS];
        if constexpr (PF) {
            wg_cp_wait<0>();
            const float4 *slot = pf + ((i - i0) & 1) * (NS + 1) * nt + threadIdx.x;
            const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
            for (int j = 0; j < NS; j++) u[j] = on && j < n ? slot[j * nt] : z;
            dx = on ? slot[NS * nt] : z;
            if (i + 1 < i1) issue(i + 1);
        } else {
            dx = ld4(dxn + row, on);
            load_sources<NS>(u, src, row, on);
        }
        const float4 gd = mul4(gn, dx);
        const float4 y = mix_sum<NS>(u, a, n);
        axpy(dg, r, mul4(dx, y));
        float part[4 * NS];
#pragma unroll
        for (int j = 0; j < NS; j++) {
            part[4 * j] = dot4(u[j], u[j]);
            part[4 * j + 1] = dot4(q, u[j]);
            part[4 * j + 2] = dot4(gd, u[j]);
            part[4 * j + 3] = dot4(y, u[j]);
        }
        block_sums<4 * NS>(part, red, tot);
        if (threadIdx.x == 0) {
            float dot = 0;   // Σ_c gain ⊙ dxn ⊙ y
            for (int j = 0; j < n; j++) dot += a[j] * tot[4 * j + 2];
            const float kn = r * r * r * dot / C;
            for (int j = 0; j < n; j++) tot[4 * j + 2] = r * tot[4 * j + 2] - kn * tot[4 * j + 3];   // t_j
            mix_bwd_coefs(tot, 4, a, n, C, eps);
            tot[4 * NS] = kn;
        }
        __syncthreads();
        if (!on) continue;
        const float kn = tot[4 * NS];
        const float4 g = make_float4(r * gd.x - kn * y.x, r * gd.y - kn * y.y, r * gd.z - kn * y.z, r * gd.w - kn * y.w);
        mix_bwd_apply<NS>(dsrc, row, u, n, g, q, tot, 4, dq);
    }
    if (!on) return;
    if (dq_part) *reinterpret_cast<float4 *>(dq_part + (size_t)blockIdx.x * C + c) = dq;
    if (dgain_part) *reinterpret_cast<float4 *>(dgain_part + (size_t)blockIdx.x * C + c) = dg;
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

// dsrc.lo: the bf16 copy of dsrc.p[lo_j], stored with its fp32 rows by the register kernels
// (mix_bwd_apply), by a pass of its own after the general kernel
static void check_dsrc_lo(const lm_source_grads *dsrc) {
    LM_CHECK(!dsrc->lo || (dsrc->lo_j >= 0 && dsrc->lo_j < dsrc->n && dsrc->p[dsrc->lo_j] &&
                           (uintptr_t)dsrc->lo % 8 == 0),
             "attnres: a bf16 source gradient (lo, 8-byte aligned) for source %d of %d", dsrc->lo_j, dsrc->n);
}

void cuda_attnres_bwd(lm_source_grads dsrc, real *dw, real *dgamma, const real *dout, lm_sources src,
                      const real *alpha, const real *w, const real *gamma, int N, int C, real eps) {
    const int n = src.n;
    LM_CHECK(n >= 1 && n <= LM_MAX_SOURCES && dsrc.n >= 0 && dsrc.n <= n, "attnres: %d sources, %d grads", n, dsrc.n);
    check_dsrc_lo(&dsrc);
    int any_dsrc = 0;
    for (int j = 0; j < dsrc.n; j++) any_dsrc |= dsrc.p[j] != NULL;
    const int want_dq = dw != NULL || dgamma != NULL;
    if (N <= 0 || C <= 0 || (!any_dsrc && !want_dq)) return;
    const int th = lm_reg_row_threads(C);
    if (ar_reg_ok(n, C) && lm_cuda_fits(AR_KERNEL(n, attnres_bwd_reg_k), th)) {
        const int rpb = lm_reg_rows_per_block_fit(N, AR_KERNEL(n, attnres_bwd_reg_k), th, 0);
        const int nb = (N + rpb - 1) / rpb;
        float *part = want_dq ? (float *)lm_cuda_scratch(((size_t)nb + 1) * C * sizeof(float)) : NULL;
        AR_LAUNCH(n, attnres_bwd_reg_k, nb, th, dsrc, part, dout, src, alpha, w, gamma, N, C, eps, rpb);
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
    if (dsrc.lo)   // (this kernel leaves its rows' copies to a pass of their own)
        lm_cuda_to_bf16((__nv_bfloat16 *)dsrc.lo, dsrc.p[dsrc.lo_j], (size_t)N * C);
    if (want_dq) {
        float *dq = colsum(ws + cqf, N, C, attnres_dq_f{src, cq, C});
        lm_cuda_acc_vec(dw, dq, gamma, C);
        lm_cuda_acc_vec(dgamma, dq, w, C);
    }
}

// The fused kernels run 2 to 4 sources (AR_NORM_NS). With more, the fused backward is slower than
// the two ops in turn — at 6 sources, B4 shapes: 0.607 ms against 0.539 (H200, session 18), its
// extra registers and reduction values outweighing the 12 bytes per element it saves — so the
// forward keeps the mix in x and the backward runs rmsnorm_bwd, then attnres_bwd.
#define AR_NORM_NS 4
static inline int ar_norm_fused_ok(int n, int C) {
    const int th = lm_reg_row_threads(C);
    return ar_reg_ok(n, C) && n <= AR_NORM_NS && lm_cuda_fits((const void *)attnres_norm_fwd_reg_k<AR_NORM_NS>, th) &&
           lm_cuda_fits((const void *)attnres_norm_bwd_reg_k<AR_NORM_NS, false>, th);
}
// the backward's prefetch ring (attnres_norm_bwd_reg_k's PF), or 0 where it would not fit in
// the default 48 KB of dynamic shared memory (from C = 1156 on: blocks of 32·⌈C/128⌉ threads,
// 320 and more) or LM_MIX_PF=0 turns it off
static size_t ar_norm_pf_bytes(int th) {
    static int off = -1;
    if (off < 0) {
        const char *e = getenv("LM_MIX_PF");
        off = e && *e == '0';
    }
    const size_t b = 2 * (size_t)(AR_NORM_NS + 1) * th * sizeof(float4);
    return off || b > 48 * 1024 ? 0 : b;
}

void cuda_attnres_norm_fwd(real *xn, real *rstd, void *lo, real *alpha, real *x, lm_sources src, const real *w,
                           const real *gamma, const real *gain, int N, int C, real eps) {
    LM_CHECK(src.n >= 1 && src.n <= LM_MAX_SOURCES, "attnres: %d sources", src.n);
    LM_CHECK(xn || lo, "attnres_norm_fwd: no output");
    if (N <= 0 || C <= 0) return;
    if (!ar_norm_fused_ok(src.n, C)) {   // the two ops in turn, the mix kept in x for the backward
        cuda_attnres_fwd(x, alpha, src, w, gamma, N, C, eps);
        cuda_rmsnorm_fwd(xn, rstd, x, gain, N, C, eps, lo);
        return;
    }
    attnres_norm_fwd_reg_k<AR_NORM_NS><<<N, lm_reg_row_threads(C), 0, lm_cuda_stream()>>>(
        xn, rstd, (__nv_bfloat16 *)lo, alpha, src, w, gamma, gain, C, eps);
    cudaLaunchCheck();
}

void cuda_attnres_norm_bwd(lm_source_grads dsrc, real *dw, real *dgamma, real *dgain, real *dx, const real *dxn,
                           const real *x, lm_sources src, const real *alpha, const real *rstd, const real *w,
                           const real *gamma, const real *gain, int N, int C, real eps) {
    const int n = src.n;
    LM_CHECK(n >= 1 && n <= LM_MAX_SOURCES && dsrc.n >= 0 && dsrc.n <= n, "attnres: %d sources, %d grads", n, dsrc.n);
    check_dsrc_lo(&dsrc);
    if (N <= 0 || C <= 0) return;
    if (!ar_norm_fused_ok(n, C)) {   // the two backwards in turn, through dx
        cuda_rmsnorm_bwd(dx, dgain, dxn, x, gain, rstd, N, C, 1);
        cuda_attnres_bwd(dsrc, dw, dgamma, dx, src, alpha, w, gamma, N, C, eps);
        return;
    }
    int any_dsrc = 0;
    for (int j = 0; j < dsrc.n; j++) any_dsrc |= dsrc.p[j] != NULL;
    const int want_dq = dw != NULL || dgamma != NULL;
    if (!any_dsrc && !want_dq && !dgain) return;
    const int th = lm_reg_row_threads(C);
    const size_t pfb = ar_norm_pf_bytes(th);
    const void *kern = pfb ? (const void *)attnres_norm_bwd_reg_k<AR_NORM_NS, true>
                           : (const void *)attnres_norm_bwd_reg_k<AR_NORM_NS, false>;
    const int rpb = lm_reg_rows_per_block_fit(N, kern, th, pfb), nb = (N + rpb - 1) / rpb;
    // [nb, C] partials of ∂q and of the gain's gradient, then ∂q's sum [C]
    float *ws = (float *)lm_cuda_scratch((2 * (size_t)nb + 1) * C * sizeof(float));
    float *qpart = want_dq ? ws : NULL, *gpart = dgain ? ws + (size_t)nb * C : NULL, *dq = ws + 2 * (size_t)nb * C;
    if (pfb)
        attnres_norm_bwd_reg_k<AR_NORM_NS, true><<<nb, th, pfb, lm_cuda_stream()>>>(
            dsrc, qpart, gpart, dxn, src, alpha, rstd, w, gamma, gain, N, C, eps, rpb);
    else
        attnres_norm_bwd_reg_k<AR_NORM_NS, false><<<nb, th, 0, lm_cuda_stream()>>>(
            dsrc, qpart, gpart, dxn, src, alpha, rstd, w, gamma, gain, N, C, eps, rpb);
    cudaLaunchCheck();
    if (want_dq) {
        lm_cuda_colsum_final(dq, qpart, nb, C, 0);
        lm_cuda_acc_vec(dw, dq, gamma, C);
        lm_cuda_acc_vec(dgamma, dq, w, C);
    }
    if (dgain) lm_cuda_colsum_final(dgain, gpart, nb, C, 1);
}
