// mla.cu — the MLA attention core: per-head keys/values from the up-projected latent
// (mla_split), causal softmax attention without positions (attn_fwd/bwd), and the
// absorbed-form decode over the latent cache (mla_decode).
//
// attn: one warp per query row (forward and dq) or per key row (dk, dv), keys/queries
// visited in tiles of 32 with one tile element per lane; lanes own the feature channels
// d = lane + 32·i of the accumulators. The forward keeps an online softmax (running max
// and sum, rescaled per tile); the backward recomputes the probabilities from the saved
// lse, as the CPU does, and never stores a T×T matrix. Each output element is written
// by exactly one warp, so results are deterministic without atomics.
// These fp32 kernels are the fallback: the head dims of attn_flash.cu (Dqk ∈ {64,128,192},
// Dv ∈ {64,128}) go to its tensor-core kernels (bf16 operands, fp32 accumulation).
#include "cuda_common.cuh"
#include "kda_common.cuh"   // the m16n8k16 product, ldmatrix fragments, cp.async, bf16 packing
#include <stdlib.h>

#define ATT_ND 8                    // channels per lane: head dims up to 32·ATT_ND = 256
#define ATT_MAXD (32 * ATT_ND)
#define ATT_WARPS 4                 // warps per block

// kv [N,H,Dn+Dv], kpe [N,De] → k [N,H,Dn+De], v [N,H,Dv]. T = float, or float4 (the dims
// counted in float4s; every tensor 16-byte aligned): the same copies, four channels a thread —
// scalar, the `small` preset's splits ran at ~1.1 TB/s (265 µs a B4 call).
// kb, vb (or NULL): k and v again in bf16 (an attention lo's parts; T's width of them a store)
__device__ __forceinline__ void split_st_bf16(__nv_bfloat16 *p, size_t i, float x) { p[i] = __float2bfloat16(x); }
__device__ __forceinline__ void split_st_bf16(__nv_bfloat16 *p, size_t i, float4 x) { st4_bf16(p + 4 * i, x); }
template <typename T>
__global__ static void split_fwd_k(T *k, T *v, const T *kv, const T *kpe, int N, int H, int Dn, int De, int Dv,
                                   __nv_bfloat16 *kb, __nv_bfloat16 *vb) {
    const int Dkv = Dn + Dv, Dk = Dn + De, row = Dk + Dv;
    size_t n = (size_t)N * H * row;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t nh = e / row;
        int d = (int)(e % row);
        size_t nn = nh / H;
        const T *src = kv + nh * Dkv;
        const T x = d < Dn ? src[d] : d < Dk ? kpe[nn * De + (d - Dn)] : src[Dn + (d - Dk)];
        if (d < Dk) {
            k[nh * Dk + d] = x;
            if (kb) split_st_bf16(kb, nh * Dk + d, x);
        } else {
            v[nh * Dv + (d - Dk)] = x;
            if (vb) split_st_bf16(vb, nh * Dv + (d - Dk), x);
        }
    }
}

static int split_vec4(int Dn, int De, int Dv, std::initializer_list<const void *> ptrs) {
    return Dn % 4 == 0 && De % 4 == 0 && Dv % 4 == 0 && lm_aligned16(ptrs);
}

static void split_fwd(real *k, real *v, const real *kv, const real *kpe, int N, int H, int Dn, int De, int Dv,
                      __nv_bfloat16 *kb, __nv_bfloat16 *vb) {
    size_t n = (size_t)N * H * (Dn + De + Dv);
    if (!n) return;
    if (split_vec4(Dn, De, Dv, {k, v, kv, kpe}) && (uintptr_t)kb % 8 == 0 && (uintptr_t)vb % 8 == 0)
        split_fwd_k<float4><<<lm_cuda_blocks(n / 4, 256), 256, 0, lm_cuda_stream()>>>(
            (float4 *)k, (float4 *)v, (const float4 *)kv, (const float4 *)kpe, N, H, Dn / 4, De / 4, Dv / 4, kb, vb);
    else
        split_fwd_k<float><<<lm_cuda_blocks(n, 256), 256, 0, lm_cuda_stream()>>>(k, v, kv, kpe, N, H, Dn, De, Dv, kb,
                                                                                vb);
    cudaLaunchCheck();
}
void cuda_mla_split_fwd(real *k, real *v, const real *kv, const real *kpe, int N, int H, int Dn, int De, int Dv) {
    split_fwd(k, v, kv, kpe, N, H, Dn, De, Dv, NULL, NULL);
}
// k and v also into an attention lo's parts (attn_flash.cu: the bf16 the forward would round)
void cuda_mla_split_fwd_lo(real *k, real *v, void *lo, const real *kv, const real *kpe, int B, int T, int H, int Dn,
                           int De, int Dv) {
    void *qb, *kb, *vb;
    lm_cuda_attn_lo_parts(lo, B, T, H, Dn + De, Dv, &qb, &kb, &vb);
    split_fwd(k, v, kv, kpe, B * T, H, Dn, De, Dv, (__nv_bfloat16 *)kb, (__nv_bfloat16 *)vb);
}

// dkv += (assign: =) [dk[..., :Dn] | dv], a missing source adding zeros; T as split_fwd_k's.
// lo (with assign): dkv written in bf16 there instead
__device__ __forceinline__ float split_add(float a, float b) { return a + b; }
__device__ __forceinline__ float4 split_add(float4 a, float4 b) { return add4(a, b); }
template <typename T>
__global__ static void split_bwd_kv_k(T *dkv, const T *dk, const T *dv, int N, int H, int Dn, int De, int Dv,
                                      int assign, __nv_bfloat16 *lo) {
    const int Dkv = Dn + Dv, Dk = Dn + De;
    size_t n = (size_t)N * H * Dkv;
    const T zero{};
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t nh = e / Dkv;
        int d = (int)(e % Dkv);
        const T g = d < Dn ? (dk ? dk[nh * Dk + d] : zero) : (dv ? dv[nh * Dv + (d - Dn)] : zero);
        if (lo) split_st_bf16(lo, e, g);
        else dkv[e] = assign ? g : split_add(dkv[e], g);
    }
}
// dkpe[n,d] += (assign: =) Σ_h dk[n,h,Dn+d], heads in order 0..H-1
__global__ static void split_bwd_kpe_k(float *dkpe, const float *dk, int N, int H, int Dn, int De, int assign) {
    const int Dk = Dn + De;
    size_t n = (size_t)N * De;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t nn = e / De;
        int d = (int)(e % De);
        float g = assign ? 0.f : dkpe[e];
        for (int h = 0; h < H; h++) g += dk[(nn * H + h) * Dk + Dn + d];
        dkpe[e] = g;
    }
}

static void split_bwd(real *dkv, __nv_bfloat16 *lo, real *dkpe, const real *dk, const real *dv, int N, int H, int Dn,
                      int De, int Dv, int assign) {
    if (N <= 0 || H <= 0) return;
    size_t n = (size_t)N * H * (Dn + Dv);
    if ((dkv || lo) && n && (dk || dv || assign)) {
        if (split_vec4(Dn, De, Dv, {dkv, dk, dv}) && (uintptr_t)lo % 8 == 0)
            split_bwd_kv_k<float4><<<lm_cuda_blocks(n / 4, 256), 256, 0, lm_cuda_stream()>>>(
                (float4 *)dkv, (const float4 *)dk, (const float4 *)dv, N, H, Dn / 4, De / 4, Dv / 4, assign, lo);
        else
            split_bwd_kv_k<float><<<lm_cuda_blocks(n, 256), 256, 0, lm_cuda_stream()>>>(dkv, dk, dv, N, H, Dn, De, Dv,
                                                                                       assign, lo);
        cudaLaunchCheck();
    }
    if (dkpe && De > 0 && !dk && assign) {
        cudaCheck(cudaMemsetAsync(dkpe, 0, (size_t)N * De * sizeof(float), lm_cuda_stream()));
    } else if (dkpe && dk && De > 0) {
        split_bwd_kpe_k<<<lm_cuda_blocks((size_t)N * De, 256), 256, 0, lm_cuda_stream()>>>(dkpe, dk, N, H, Dn, De,
                                                                                            assign);
        cudaLaunchCheck();
    }
}
void cuda_mla_split_bwd(real *dkv, real *dkpe, const real *dk, const real *dv, int N, int H, int Dn, int De, int Dv,
                        int assign) {
    split_bwd(dkv, NULL, dkpe, dk, dv, N, H, Dn, De, Dv, assign);
}
void cuda_mla_split_bwd_lo(void *dkv_lo, real *dkpe, const real *dk, const real *dv, int N, int H, int Dn, int De,
                           int Dv) {
    split_bwd(NULL, (__nv_bfloat16 *)dkv_lo, dkpe, dk, dv, N, H, Dn, De, Dv, 1);
}

// the attention over an attention lo (training; attn_flash.cu): its tensor-core kernels only
void cuda_attn_fwd_lo(real *o, real *lse, const real *q, void *lo, int B, int T, int H, int Dqk, int Dv, real scale) {
    if (B <= 0 || T <= 0 || H <= 0) return;
    LM_CHECK(cuda_attn_flash_fwd_lo(o, lse, q, lo, B, T, H, Dqk, Dv, scale), "cuda attn_fwd_lo: no bf16 kernels for "
             "head dims %d/%d or tensors not 16-byte aligned", Dqk, Dv);
}
void cuda_attn_bwd_lo(real *dq, real *dk, real *dv, const real *d_o, const void *lo, const real *o, const real *lse,
                      int B, int T, int H, int Dqk, int Dv, real scale, int assign) {
    if (B <= 0 || T <= 0 || H <= 0 || (!dq && !dk && !dv)) return;
    LM_CHECK(cuda_attn_flash_bwd_lo(dq, dk, dv, d_o, lo, o, lse, B, T, H, Dqk, Dv, scale, assign), "cuda attn_bwd_lo: "
             "no bf16 kernels for head dims %d/%d or tensors not 16-byte aligned", Dqk, Dv);
}

__device__ __forceinline__ float dot_sh(const float *a_sh, const float *b, int D) {
    float s = 0.0f;
    for (int d = 0; d < D; d++) s += a_sh[d] * b[d];
    return s;
}

// o [B,T,H,Dv], lse [B,H,T] (may be NULL); q [B,T,H,Dqk]; k [B,P+T,H,Dqk], v [B,P+T,H,Dv]:
// query t is position P + t and sees keys 0..P+t (P = 0: plain causal)
__global__ static void __launch_bounds__(32 * ATT_WARPS) attn_fwd_k(float *o, float *lse, const float *q,
                                                                     const float *k, const float *v, int B, int T,
                                                                     int P, int H, int Dqk, int Dv, float scale) {
    __shared__ float qs[ATT_WARPS][ATT_MAXD];
    const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
    const long gw = (long)blockIdx.x * ATT_WARPS + wi;
    if (gw >= (long)B * H * T) return;
    const int t = (int)(gw % T), h = (int)(gw / T % H), b = (int)(gw / T / H);
    const size_t ldq = (size_t)H * Dqk, ldv = (size_t)H * Dv;
    const int Tk = P + T, last = P + t;   // keys per sequence; this query's last key
    const float *qh = q + (size_t)b * T * ldq + (size_t)h * Dqk;
    const float *kh = k + (size_t)b * Tk * ldq + (size_t)h * Dqk;
    const float *vh = v + (size_t)b * Tk * ldv + (size_t)h * Dv;
    for (int d = lane; d < Dqk; d += 32) qs[wi][d] = qh[(size_t)t * ldq + d];
    __syncwarp();
    float acc[ATT_ND];
#pragma unroll
    for (int i = 0; i < ATT_ND; i++) acc[i] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int s0 = 0; s0 <= last; s0 += 32) {
        const int s = s0 + lane;
        float sc = s <= last ? scale * dot_sh(qs[wi], kh + (size_t)s * ldq, Dqk) : -INFINITY;
        float mn = fmaxf(m, warp_max(sc));   // finite: lane 0's key s0 ≤ last is always valid
        float alpha = expf(m - mn);
        float p = expf(sc - mn);
        l = l * alpha + warp_sum(p);
        m = mn;
        const int nk = min(32, last - s0 + 1);
#pragma unroll
        for (int i = 0; i < ATT_ND; i++) acc[i] *= alpha;
        for (int j = 0; j < nk; j++) {
            float pj = __shfl_sync(0xffffffffu, p, j);
            const float *vr = vh + (size_t)(s0 + j) * ldv;
#pragma unroll
            for (int i = 0; i < ATT_ND; i++) {
                int d = lane + 32 * i;
                if (d < Dv) acc[i] += pj * vr[d];
            }
        }
    }
    float inv = 1.0f / l;
    float *orow = o + ((size_t)b * T + t) * ldv + (size_t)h * Dv;
#pragma unroll
    for (int i = 0; i < ATT_ND; i++) {
        int d = lane + 32 * i;
        if (d < Dv) orow[d] = acc[i] * inv;
    }
    if (lse && lane == 0) lse[((size_t)b * H + h) * T + t] = m + logf(l);
}

static void attn_check_dims(int Dqk, int Dv) {
    LM_CHECK(Dqk <= ATT_MAXD && Dv <= ATT_MAXD, "cuda attn: head dims %d/%d exceed %d", Dqk, Dv, ATT_MAXD);
}

// the flash kernel where it applies (head dims, alignment), else one warp per query row
static void attn_fwd_any(real *o, real *lse, const real *q, const real *k, const real *v, int B, int T, int P, int H,
                         int Dqk, int Dv, real scale) {
    if (B <= 0 || T <= 0 || H <= 0) return;
    if (cuda_attn_flash_fwd(o, lse, q, k, v, B, T, P, H, Dqk, Dv, scale)) return;
    attn_check_dims(Dqk, Dv);
    long rows = (long)B * H * T;
    attn_fwd_k<<<(unsigned)((rows + ATT_WARPS - 1) / ATT_WARPS), 32 * ATT_WARPS, 0, lm_cuda_stream()>>>(
        o, lse, q, k, v, B, T, P, H, Dqk, Dv, scale);
    cudaLaunchCheck();
}
void cuda_attn_fwd(real *o, real *lse, const real *q, const real *k, const real *v,
                   int B, int T, int H, int Dqk, int Dv, real scale) {
    attn_fwd_any(o, lse, q, k, v, B, T, 0, H, Dqk, Dv, scale);
}
void cuda_attn_prefix_fwd(real *o, const real *q, const real *k, const real *v, int B, int T, int P, int H, int Dqk,
                          int Dv, real scale) {
    attn_fwd_any(o, NULL, q, k, v, B, T, P, H, Dqk, Dv, scale);
}

// D [B,H,T] = do_t · o_t per head
__global__ static void attn_D_k(float *D, const float *d_o, const float *o, int B, int T, int H, int Dv) {
    const int lane = threadIdx.x & 31;
    const long gw = (long)blockIdx.x * ATT_WARPS + (threadIdx.x >> 5);
    if (gw >= (long)B * H * T) return;
    const int t = (int)(gw % T), h = (int)(gw / T % H), b = (int)(gw / T / H);
    const size_t off = ((size_t)b * T + t) * H * Dv + (size_t)h * Dv;
    float s = 0.0f;
    for (int d = lane; d < Dv; d += 32) s += d_o[off + d] * o[off + d];
    s = warp_sum(s);
    if (lane == 0) D[gw / T * T + t] = s;   // ((b·H + h)·T + t)
}

void cuda_attn_D(real *D, const real *d_o, const real *o, int B, int T, int H, int Dv) {
    long rows = (long)B * H * T;
    attn_D_k<<<(unsigned)((rows + ATT_WARPS - 1) / ATT_WARPS), 32 * ATT_WARPS, 0, lm_cuda_stream()>>>(D, d_o, o, B, T, H, Dv);
    cudaLaunchCheck();
}

// dq_t += Σ_{s≤t} dS_ts k_s, one warp per query row t
__global__ static void __launch_bounds__(32 * ATT_WARPS) attn_dq_k(float *dq, const float *d_o, const float *q,
                                                                    const float *k, const float *v, const float *lse,
                                                                    const float *D, int B, int T, int H, int Dqk,
                                                                    int Dv, float scale) {
    __shared__ float qs[ATT_WARPS][ATT_MAXD], dos[ATT_WARPS][ATT_MAXD];
    const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
    const long gw = (long)blockIdx.x * ATT_WARPS + wi;
    if (gw >= (long)B * H * T) return;
    const int t = (int)(gw % T), h = (int)(gw / T % H), b = (int)(gw / T / H);
    const size_t ldq = (size_t)H * Dqk, ldv = (size_t)H * Dv;
    const size_t qoff = (size_t)b * T * ldq + (size_t)h * Dqk, voff = (size_t)b * T * ldv + (size_t)h * Dv;
    for (int d = lane; d < Dqk; d += 32) qs[wi][d] = q[qoff + (size_t)t * ldq + d];
    for (int d = lane; d < Dv; d += 32) dos[wi][d] = d_o[voff + (size_t)t * ldv + d];
    __syncwarp();
    const float lt = lse[gw], Dt = D[gw];   // gw = (b·H + h)·T + t
    float acc[ATT_ND];
#pragma unroll
    for (int i = 0; i < ATT_ND; i++) acc[i] = 0.0f;
    for (int s0 = 0; s0 <= t; s0 += 32) {
        const int s = s0 + lane;
        float ds = 0.0f;
        if (s <= t) {
            float p = expf(scale * dot_sh(qs[wi], k + qoff + (size_t)s * ldq, Dqk) - lt);
            float dp = dot_sh(dos[wi], v + voff + (size_t)s * ldv, Dv);
            ds = scale * p * (dp - Dt);
        }
        const int nk = min(32, t - s0 + 1);
        for (int j = 0; j < nk; j++) {
            float g = __shfl_sync(0xffffffffu, ds, j);
            const float *kr = k + qoff + (size_t)(s0 + j) * ldq;
#pragma unroll
            for (int i = 0; i < ATT_ND; i++) {
                int d = lane + 32 * i;
                if (d < Dqk) acc[i] += g * kr[d];
            }
        }
    }
    float *g = dq + qoff + (size_t)t * ldq;
#pragma unroll
    for (int i = 0; i < ATT_ND; i++) {
        int d = lane + 32 * i;
        if (d < Dqk) g[d] += acc[i];
    }
}

// dk_s += Σ_{t≥s} dS_ts q_t, dv_s += Σ_{t≥s} P_ts do_t, one warp per key row s
__global__ static void __launch_bounds__(32 * ATT_WARPS) attn_dkdv_k(float *dk, float *dv, const float *d_o,
                                                                      const float *q, const float *k, const float *v,
                                                                      const float *lse, const float *D, int B, int T,
                                                                      int H, int Dqk, int Dv, float scale) {
    __shared__ float ks[ATT_WARPS][ATT_MAXD], vs[ATT_WARPS][ATT_MAXD];
    const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
    const long gw = (long)blockIdx.x * ATT_WARPS + wi;
    if (gw >= (long)B * H * T) return;
    const int s = (int)(gw % T), h = (int)(gw / T % H), b = (int)(gw / T / H);
    const size_t ldq = (size_t)H * Dqk, ldv = (size_t)H * Dv;
    const size_t qoff = (size_t)b * T * ldq + (size_t)h * Dqk, voff = (size_t)b * T * ldv + (size_t)h * Dv;
    const float *lh = lse + (gw - s), *Dh = D + (gw - s);
    for (int d = lane; d < Dqk; d += 32) ks[wi][d] = k[qoff + (size_t)s * ldq + d];
    for (int d = lane; d < Dv; d += 32) vs[wi][d] = v[voff + (size_t)s * ldv + d];
    __syncwarp();
    float ak[ATT_ND], av[ATT_ND];
#pragma unroll
    for (int i = 0; i < ATT_ND; i++) ak[i] = av[i] = 0.0f;
    for (int t0 = s; t0 < T; t0 += 32) {
        const int t = t0 + lane;
        float p = 0.0f, ds = 0.0f;
        if (t < T) {
            p = expf(scale * dot_sh(ks[wi], q + qoff + (size_t)t * ldq, Dqk) - lh[t]);
            float dp = dot_sh(vs[wi], d_o + voff + (size_t)t * ldv, Dv);
            ds = scale * p * (dp - Dh[t]);
        }
        const int nq = min(32, T - t0);
        for (int j = 0; j < nq; j++) {
            float pj = __shfl_sync(0xffffffffu, p, j), gj = __shfl_sync(0xffffffffu, ds, j);
            const float *dor = d_o + voff + (size_t)(t0 + j) * ldv, *qr = q + qoff + (size_t)(t0 + j) * ldq;
#pragma unroll
            for (int i = 0; i < ATT_ND; i++) {
                int d = lane + 32 * i;
                if (d < Dv) av[i] += pj * dor[d];
                if (d < Dqk) ak[i] += gj * qr[d];
            }
        }
    }
#pragma unroll
    for (int i = 0; i < ATT_ND; i++) {
        int d = lane + 32 * i;
        if (dv && d < Dv) dv[voff + (size_t)s * ldv + d] += av[i];
        if (dk && d < Dqk) dk[qoff + (size_t)s * ldq + d] += ak[i];
    }
}

// the attention gradients that are not NULL set to zero (backward kernels that only add, when
// the caller asked for them written)
void lm_cuda_zero_attn_grads(float *dq, float *dk, float *dv, size_t nqk, size_t nv) {
    if (dq) cudaCheck(cudaMemsetAsync(dq, 0, nqk * sizeof(float), lm_cuda_stream()));
    if (dk) cudaCheck(cudaMemsetAsync(dk, 0, nqk * sizeof(float), lm_cuda_stream()));
    if (dv) cudaCheck(cudaMemsetAsync(dv, 0, nv * sizeof(float), lm_cuda_stream()));
}

void cuda_attn_bwd(real *dq, real *dk, real *dv, const real *d_o, const real *q, const real *k,
                   const real *v, const real *o, const real *lse, int B, int T, int H, int Dqk, int Dv, real scale,
                   int assign) {
    if (B <= 0 || T <= 0 || H <= 0 || (!dq && !dk && !dv)) return;
    if (cuda_attn_flash_bwd(dq, dk, dv, d_o, q, k, v, o, lse, B, T, H, Dqk, Dv, scale, assign)) return;
    attn_check_dims(Dqk, Dv);
    if (assign) lm_cuda_zero_attn_grads(dq, dk, dv, (size_t)B * T * H * Dqk, (size_t)B * T * H * Dv);
    long rows = (long)B * H * T;
    unsigned grid = (unsigned)((rows + ATT_WARPS - 1) / ATT_WARPS);
    float *D = (float *)lm_cuda_scratch((size_t)rows * sizeof(float));
    cuda_attn_D(D, d_o, o, B, T, H, Dv);
    if (dq) {
        attn_dq_k<<<grid, 32 * ATT_WARPS, 0, lm_cuda_stream()>>>(dq, d_o, q, k, v, lse, D, B, T, H, Dqk, Dv, scale);
        cudaLaunchCheck();
    }
    if (dk || dv) {
        attn_dkdv_k<<<grid, 32 * ATT_WARPS, 0, lm_cuda_stream()>>>(dk, dv, d_o, q, k, v, lse, D, B, T, H, Dqk, Dv,
                                                                   scale);
        cudaLaunchCheck();
    }
}

// ---- decode: split-KV ("flash-decoding") over the latent cache ----
//
// In the absorbed form every head of a sequence scores the same cache row (c_t [R] and
// kpe_t [De]), so a warp reads each row once for all heads instead of once per head.
// Work split: one warp per (sequence b, split s); the lens[b] rows are cut into NS
// contiguous splits (NS fixed by the host from B and Tmax so that the GPU is full even
// at B = 1; the split length is derived on the device from lens[b], which the host does
// not know). Each warp writes an unnormalised partial (running max m, sum l, o [H,R]);
// mla_decode_combine_k merges the splits of a (b, h) in split order 0..NS−1. Boundaries
// and orders depend only on (lens[b], NS), so results are deterministic.
//
// Inside a warp, rows are taken DEC_RT at a time; lane L holds channels 4L..4L+3 of each
// 128-channel group of c (DEC_KR groups: R ≤ 256) and of kpe (one group: De ≤ 128) in
// registers. The NH·DEC_RT = 32 partial dot products of a lane are reduced across the
// warp by a butterfly reduce-scatter (31 shuffles for 32 scores; lane L ends with the
// full score of head L / DEC_RT, row L % DEC_RT), then an online softmax per head and
// the weighted sum of the rows into acc [NH][DEC_KR] float4 (lane-owned channels).
#define DEC_NH 8                    // heads per warp (H ≤ 8; missing heads have q = 0)
#define DEC_RT 4                    // rows per step: DEC_NH·DEC_RT must be 32
#define DEC_KR 2                    // float4 groups of 128 channels of c per lane: R ≤ 256
#define DEC_WARPS 4                 // warps (= splits) per block, all of one sequence
// shortest split: its partial (H·R floats) stays ≤ 1/10 of its rows. Unless splits that long
// leave SMs idle (a short cache, few sequences: B1 × 4K made 16 blocks whose warps took 16
// dependent row steps each, ~37 µs a layer): then down to DEC_MINROWS_SHORT (28 µs there;
// at B1 × 64K, where 64-row splits fill the GPU, 16-row ones took 130 µs against 80: their
// partials and the combine; bench_generate --op-only, session 22)
#define DEC_MINROWS 64
#define DEC_MINROWS_SHORT 16
static_assert(DEC_NH * DEC_RT == 32, "one score per lane after the reduce-scatter");


// One step of the butterfly reduce-scatter of 32 values over the warp: a lane keeps the
// half of the indices whose bit HALF matches its lane's and adds its partner's copy of
// them. The choice is made with bit masks: written as `upper ? v[i] : v[i + HALF]` the
// compiler turns it into an indexed load and puts v in local memory.
template <int HALF>
__device__ __forceinline__ void rs_step(float (&v)[32], int lane) {
    const int up = (lane & HALF) ? -1 : 0;
#pragma unroll
    for (int i = 0; i < HALF; i++) {
        const int a = __float_as_int(v[i]), c = __float_as_int(v[i + HALF]);
        const float send = __int_as_float((a & up) | (c & ~up));
        const float keep = __int_as_float((c & up) | (a & ~up));
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, HALF);
    }
}

// rows [t0, t1) of one sequence → part_o [H,R] (unnormalised), part_ml [H,2] (max, sum)
// qs [DEC_NH][DEC_KR·128], qes [DEC_NH][128]: zero-padded queries in shared memory
__device__ static void dec_split(float *part_o, float *part_ml, const float *qs, const float *qes, const float *cb,
                                 const float *pb, int t0, int t1, int H, int R, int De, float scale) {
    const int lane = threadIdx.x & 31;
    const int my_h = lane / DEC_RT, my_j = lane % DEC_RT;
    float4 acc[DEC_NH][DEC_KR];
#pragma unroll
    for (int h = 0; h < DEC_NH; h++)
#pragma unroll
        for (int k = 0; k < DEC_KR; k++) acc[h][k] = make_float4(0.f, 0.f, 0.f, 0.f);
    float m = -INFINITY, l = 0.0f;   // of head my_h (same in the DEC_RT lanes of a head)
    for (int t = t0; t < t1; t += DEC_RT) {
        float4 cr[DEC_RT][DEC_KR], ce[DEC_RT];
#pragma unroll
        for (int j = 0; j < DEC_RT; j++) {
            const bool ok = t + j < t1;
            const float *ct = cb + (size_t)(t + j) * R, *pt = pb + (size_t)(t + j) * De;
#pragma unroll
            for (int k = 0; k < DEC_KR; k++) {
                const int r = 4 * lane + 128 * k;
                cr[j][k] = ok && r < R ? ld4(ct + r) : make_float4(0.f, 0.f, 0.f, 0.f);
            }
            ce[j] = ok && 4 * lane < De ? ld4(pt + 4 * lane) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
        // v[h·DEC_RT + j]: this lane's share of q_h · row_j
        float v[32];
#pragma unroll
        for (int h = 0; h < DEC_NH; h++) {
            float4 qk[DEC_KR], qe = ld4(qes + h * 128 + 4 * lane);
#pragma unroll
            for (int k = 0; k < DEC_KR; k++) qk[k] = ld4(qs + h * (128 * DEC_KR) + 4 * lane + 128 * k);
#pragma unroll
            for (int j = 0; j < DEC_RT; j++) {
                float s = dot4(qe, ce[j]);
#pragma unroll
                for (int k = 0; k < DEC_KR; k++) s += dot4(qk[k], cr[j][k]);
                v[h * DEC_RT + j] = s;
            }
        }
        // reduce-scatter: lane L ends with Σ_lanes v[L]
        rs_step<16>(v, lane); rs_step<8>(v, lane); rs_step<4>(v, lane); rs_step<2>(v, lane); rs_step<1>(v, lane);
        const float sc = t + my_j < t1 ? v[0] * scale : -INFINITY;
        float mx = sc;
#pragma unroll
        for (int o = 1; o < DEC_RT; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        const float mn = fmaxf(m, mx);   // finite: row t < t1 is valid
        const float alpha = expf(m - mn), p = expf(sc - mn);
        float ps = p;
#pragma unroll
        for (int o = 1; o < DEC_RT; o <<= 1) ps += __shfl_xor_sync(0xffffffffu, ps, o);
        l = l * alpha + ps;
        m = mn;
#pragma unroll
        for (int h = 0; h < DEC_NH; h++) {
            const float a = __shfl_sync(0xffffffffu, alpha, h * DEC_RT);
#pragma unroll
            for (int k = 0; k < DEC_KR; k++) {
                acc[h][k].x *= a; acc[h][k].y *= a; acc[h][k].z *= a; acc[h][k].w *= a;
            }
#pragma unroll
            for (int j = 0; j < DEC_RT; j++) {
                const float pj = __shfl_sync(0xffffffffu, p, h * DEC_RT + j);
#pragma unroll
                for (int k = 0; k < DEC_KR; k++) {
                    acc[h][k].x += pj * cr[j][k].x; acc[h][k].y += pj * cr[j][k].y;
                    acc[h][k].z += pj * cr[j][k].z; acc[h][k].w += pj * cr[j][k].w;
                }
            }
        }
    }
    if (my_j == 0 && my_h < H) { part_ml[2 * my_h] = m; part_ml[2 * my_h + 1] = l; }
#pragma unroll
    for (int h = 0; h < DEC_NH; h++) {
        if (h >= H) break;
#pragma unroll
        for (int k = 0; k < DEC_KR; k++) {
            const int r = 4 * lane + 128 * k;
            if (r < R) *reinterpret_cast<float4 *>(part_o + (size_t)h * R + r) = acc[h][k];
        }
    }
}

// grid (NS / DEC_WARPS, B), DEC_WARPS warps; part_o [B,NS,H,R], part_ml [B,NS,H,2]
__global__ static void __launch_bounds__(32 * DEC_WARPS) mla_decode_split_k(
    float *part_o, float *part_ml, const float *q_lat, const float *q_pe, const float *c_cache,
    const float *kpe_cache, const int *lens, int B, int H, int R, int De, int Tmax, int NS, int minrows, float scale) {
    __shared__ __align__(16) float qs[DEC_NH * 128 * DEC_KR];
    __shared__ __align__(16) float qes[DEC_NH * 128];
    const int b = blockIdx.y, w = threadIdx.x >> 5, s = blockIdx.x * DEC_WARPS + w;
    int len = lens[b];
    len = len < 0 ? 0 : (len > Tmax ? Tmax : len);
    // split length: len / NS rounded up to whole row steps, at least minrows
    int rps = (len + NS - 1) / NS;
    rps = max(minrows, (rps + DEC_RT - 1) / DEC_RT * DEC_RT);
    const int t0 = min(len, s * rps), t1 = min(len, t0 + rps);
    if ((long)blockIdx.x * DEC_WARPS * rps >= len) {   // the whole block is past the end
        if ((threadIdx.x & 31) < H) part_ml[(((size_t)b * NS + s) * H + (threadIdx.x & 31)) * 2 + 1] = 0.0f;
        return;
    }
    for (int i = threadIdx.x; i < DEC_NH * 128 * DEC_KR; i += blockDim.x) {
        const int h = i / (128 * DEC_KR), r = i % (128 * DEC_KR);
        qs[i] = h < H && r < R ? q_lat[((size_t)b * H + h) * R + r] : 0.0f;
    }
    for (int i = threadIdx.x; i < DEC_NH * 128; i += blockDim.x) {
        const int h = i / 128, d = i % 128;
        qes[i] = h < H && d < De ? q_pe[((size_t)b * H + h) * De + d] : 0.0f;
    }
    __syncthreads();
    float *po = part_o + ((size_t)b * NS + s) * H * R, *pml = part_ml + ((size_t)b * NS + s) * H * 2;
    if (t0 >= t1) {   // empty split: l = 0 tells the combine to skip it
        if ((threadIdx.x & 31) < H) pml[2 * (threadIdx.x & 31) + 1] = 0.0f;
        return;
    }
    dec_split(po, pml, qs, qes, c_cache + (size_t)b * Tmax * R, kpe_cache + (size_t)b * Tmax * De, t0, t1, H, R,
              De, scale);
}

// grid (H, B, ⌈R/32⌉), DEC_COMB_WARPS warps: o_lat[b,h,r0..r0+31] =
//   Σ_s e^{m_s−M} o_s / Σ_s e^{m_s−M} l_s over the non-empty splits.
// Warp w sums the splits [w·NS/W, (w+1)·NS/W) in order (lane = channel), then warp 0 adds
// the W warp sums in order: fixed order, and NS/W loads in flight per lane instead of NS.
// dynamic shared memory: NS split weights
#define DEC_COMB_WARPS 8
__global__ static void __launch_bounds__(32 * DEC_COMB_WARPS) mla_decode_combine_k(
    float *o_lat, const float *part_o, const float *part_ml, int H, int R, int NS) {
    extern __shared__ float wsh[];
    __shared__ float red[32], osum[DEC_COMB_WARPS][32];
    const int h = blockIdx.x, b = blockIdx.y, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int r = blockIdx.z * 32 + lane;
    const float *ml = part_ml + (size_t)b * NS * H * 2 + 2 * h;
    float M = -INFINITY;
    for (int s = threadIdx.x; s < NS; s += blockDim.x)
        if (ml[(size_t)s * H * 2 + 1] > 0.0f) M = fmaxf(M, ml[(size_t)s * H * 2]);
    M = block_max(M, red);
    float L = 0.0f;
    for (int s = threadIdx.x; s < NS; s += blockDim.x) {
        const float l = ml[(size_t)s * H * 2 + 1];
        const float wgt = l > 0.0f ? expf(ml[(size_t)s * H * 2] - M) : 0.0f;
        wsh[s] = wgt;
        L += wgt * l;
    }
    L = block_sum(L, red);   // its __syncthreads also publishes wsh
    const int s0 = (int)((long)w * NS / DEC_COMB_WARPS), s1 = (int)((long)(w + 1) * NS / DEC_COMB_WARPS);
    float o = 0.0f;
    if (r < R) {
        const float *po = part_o + ((size_t)b * NS * H + h) * R + r;   // + s·H·R
#pragma unroll 4
        for (int s = s0; s < s1; s++)
            if (wsh[s] != 0.0f) o += wsh[s] * po[(size_t)s * H * R];
    }
    osum[w][lane] = o;
    __syncthreads();
    if (w == 0 && r < R) {
        float t = 0.0f;
#pragma unroll
        for (int k = 0; k < DEC_COMB_WARPS; k++) t += osum[k][lane];
        o_lat[((size_t)b * H + h) * R + r] = L > 0.0f ? t / L : 0.0f;   // lens[b] = 0: o_lat = 0
    }
}

// The previous kernel, kept for shapes the split kernel does not take (H > 8, R > 256,
// De > 128, dims not multiples of 4): one warp per (b, h) over the whole cache.
// dynamic shared memory: q_lat [R], q_pe [De], o accumulator [R]
__global__ static void mla_decode_k(float *o_lat, const float *q_lat, const float *q_pe, const float *c_cache,
                                    const float *kpe_cache, const int *lens, float *sc_ws, int B, int H, int R,
                                    int De, int Tmax, float scale) {
    extern __shared__ float sm[];
    float *qs = sm, *ps = sm + R, *os = sm + R + De;
    const int lane = threadIdx.x;
    const int bh = blockIdx.x, b = bh / H;
    int len = lens[b];
    len = len < 0 ? 0 : (len > Tmax ? Tmax : len);
    const float *ql = q_lat + (size_t)bh * R, *qp = q_pe + (size_t)bh * De;
    const float *cb = c_cache + (size_t)b * Tmax * R, *pb = kpe_cache + (size_t)b * Tmax * De;
    float *sc = sc_ws + (size_t)bh * Tmax;
    float *ob = o_lat + (size_t)bh * R;
    for (int r = lane; r < R; r += 32) { qs[r] = ql[r]; os[r] = 0.0f; }
    for (int d = lane; d < De; d += 32) ps[d] = qp[d];
    __syncwarp();
    if (len == 0) {
        for (int r = lane; r < R; r += 32) ob[r] = 0.0f;
        return;
    }
    float mx = -INFINITY;
    for (int t = lane; t < len; t += 32) {
        float s = dot_sh(qs, cb + (size_t)t * R, R) + (De > 0 ? dot_sh(ps, pb + (size_t)t * De, De) : 0.0f);
        s *= scale;
        sc[t] = s;
        mx = fmaxf(mx, s);
    }
    mx = warp_max(mx);
    __syncwarp();
    float l = 0.0f;
    for (int t = 0; t < len; t++) {
        float p = expf(sc[t] - mx);
        l += p;
        const float *ct = cb + (size_t)t * R;
        for (int r = lane; r < R; r += 32) os[r] += p * ct[r];
    }
    float inv = 1.0f / l;
    for (int r = lane; r < R; r += 32) ob[r] = os[r] * inv;
}

// ---- decode on tensor cores over a bf16 cache: the same splits and partials, 16 rows a warp step ----
//
// The fp32 split kernel above reads an fp32 cache at ~2.7 TB/s at best (64 sequences × 64K
// rows; 2.2 TB/s at one sequence × 1M): its 8 heads × 4 rows of dot products, the
// reduce-scatter and the weighted sums are CUDA-core work on every byte. Where the backend keeps
// the cache in bf16 (mla_cache_bf16: the shapes below), a warp copies 16 rows of c and kpe a step
// (cp.async, a ring of TC_STAGES tiles, three steps ahead) straight into the ldmatrix tile, and
// scores and sums are m16n8k16 products with the ≤ 8 heads as the n dimension:
//   Sᵀ [16 rows × 8 heads] = tile [16 × (R+De)] · Qᵀ    (Q as hi + lo bf16: ~16-bit exact)
//   Oᵀ [R × 8 heads]      += tileᵀ [R × 16] · Pᵀ       (P bf16, as the flash kernels' P·V)
// Sᵀ comes out in the accumulator layout (rows by lane / 4); movmatrix.trans turns P into
// the B fragment (rows by lane % 4), and each lane owns the running max / sum of the two
// heads its Oᵀ columns hold, so the rescale needs no shuffles. The cached values are bf16 (as
// the flash kernels' k and v): held to 1e-2 against an f64 reference on the fp32 values, where
// the fp32 kernel on an fp32 cache is held to 1e-5 (tests/cuda/test_cuda_ops.c).
// LM_MLA_DECODE=fp32 keeps new caches in fp32 and their decode on the fp32 kernel.
// R and De are template arguments (the instances below): a first version on an fp32 cache
// with them at run time divided by K / 4 per 16-byte piece in its copy and conversion loops,
// which did not unroll (64 × 64K: 3.5 ms against the fp32 kernel's 2.0); compiled for the shape
// it read the fp32 cache at 4.4 TB/s (1.21 ms; bench/RESULTS.md, session 24).
#define TC_WARPS 4
#define TC_ROWS 16
#define TC_STAGES 4
static_assert(TC_WARPS == DEC_WARPS, "the splits of a block: the host sizes the grid by DEC_WARPS");

__device__ __forceinline__ uint32_t movmatrix_t(uint32_t x) {
    uint32_t y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
    return y;
}

// shared memory of one warp: TC_STAGES bf16 tiles [16][K + 8] (the padding puts the eight rows
// of an ldmatrix tile in different bank groups)
__host__ __device__ static size_t tc_warp_smem(int K) { return (size_t)TC_STAGES * TC_ROWS * (K + 8) * 2; }

// grid (NS / TC_WARPS, B), TC_WARPS warps, TC_WARPS · tc_warp_smem(R + De) bytes of dynamic
// shared memory; c_cache [B,Tmax,R], kpe_cache [B,Tmax,De] bf16; part_o [B,NS,H,R],
// part_ml [B,NS,H,2] as mla_decode_split_k's
template <int R, int De>
__global__ static void __launch_bounds__(32 * TC_WARPS) mla_decode_tc_k(
    float *part_o, float *part_ml, const float *q_lat, const float *q_pe, const bf16 *c_cache,
    const bf16 *kpe_cache, const int *lens, int H, int Tmax, int NS, int minrows, float scale) {
    static_assert(R % 16 == 0 && De % 16 == 0, "whole k16 steps; 16-byte pieces of each row");
    extern __shared__ __align__(16) unsigned char tc_raw[];
    constexpr int K = R + De, KT = K / 16, RT = R / 16, K8 = K / 8, ldt = K + 8;
    const int b = blockIdx.y, w = threadIdx.x >> 5, lane = threadIdx.x & 31, s = blockIdx.x * TC_WARPS + w;
    const int g = lane >> 2, j = lane & 3;
    int len = lens[b];
    len = len < 0 ? 0 : (len > Tmax ? Tmax : len);
    int rps = (len + NS - 1) / NS;   // the fp32 kernel's split lengths
    rps = max(minrows, (rps + DEC_RT - 1) / DEC_RT * DEC_RT);
    const int t0 = min(len, s * rps), t1 = min(len, t0 + rps);
    float *po = part_o + ((size_t)b * NS + s) * H * R, *pml = part_ml + ((size_t)b * NS + s) * H * 2;
    if (t0 >= t1) {   // empty split: l = 0 tells the combine to skip it
        if (lane < H) pml[2 * lane + 1] = 0.0f;
        return;
    }
    bf16 *ring = reinterpret_cast<bf16 *>(tc_raw + w * tc_warp_smem(K));
    const bf16 *cb = c_cache + (size_t)b * Tmax * R, *pb = kpe_cache + (size_t)b * Tmax * De;
    // rows t .. t + 15 into tile st (rows past t1 zero-filled; t ≥ t1: nothing); a lane takes
    // 16-byte pieces lane, lane + 32, … of each row; one commit group per call, empty or not,
    // so that the waits below count steps
    auto issue = [&](int t, int st) {
        if (t < t1) {
            bf16 *dst = ring + st * TC_ROWS * ldt;
#pragma unroll
            for (int row = 0; row < TC_ROWS; row++) {
                const bool ok = t + row < t1;
                const size_t r = (size_t)(ok ? t + row : t0);
#pragma unroll
                for (int q = lane; q < K8; q += 32) {
                    const int col = 8 * q;
                    const bf16 *src = col < R ? cb + r * R + col : pb + r * De + (col - R);
                    cp_async16(dst + row * ldt + col, src, ok ? 16 : 0);
                }
            }
        }
        cp_async_commit();
    };
#pragma unroll
    for (int i = 0; i < TC_STAGES - 1; i++) issue(t0 + i * TC_ROWS, i);
    // Qᵀ as B fragments (k = channel, n = head g), hi and lo parts; heads ≥ H are zero
    uint32_t qh[KT][2], ql[KT][2];
    {
        const int hq = g < H ? g : 0;
        const float *qa = q_lat + ((size_t)b * H + hq) * R, *qe = q_pe + ((size_t)b * H + hq) * De;
#pragma unroll
        for (int kk = 0; kk < KT; kk++) {
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const int ch = 16 * kk + 2 * j + 8 * half;
                float x0 = 0.f, x1 = 0.f;
                if (g < H) {
                    x0 = ch < R ? qa[ch] : qe[ch - R];
                    x1 = ch + 1 < R ? qa[ch + 1] : qe[ch + 1 - R];
                }
                split_bf16(x0, x1, qh[kk][half], ql[kk][half]);
            }
        }
    }
    float o[RT][4];
#pragma unroll
    for (int mt = 0; mt < RT; mt++) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;   // heads 2j, 2j + 1
    int st = 0;
    for (int t = t0; t < t1; t += TC_ROWS) {
        // the step TC_STAGES − 1 ahead into the tile the previous step read (its reads are done:
        // the __syncwarp closing that step), then wait for this step's rows
        issue(t + (TC_STAGES - 1) * TC_ROWS, (st + TC_STAGES - 1) % TC_STAGES);
        cp_async_wait<TC_STAGES - 1>();
        __syncwarp();
        const bf16 *tile = ring + st * TC_ROWS * ldt;
        // Sᵀ: rows g, g + 8 × heads 2j, 2j + 1; four independent sums (hi / lo × even / odd
        // k steps): one accumulator made a chain of 2·KT dependent products
        float sp[4][4] = {};
#pragma unroll
        for (int kk = 0; kk < KT; kk++) {
            uint32_t a[4];
            lda_row_sm(a, tile, ldt, 16 * kk, lane);
            mma16816(sp[kk & 1], a, qh[kk]);
            mma16816(sp[2 + (kk & 1)], a, ql[kk]);
        }
        float sc[4];
#pragma unroll
        for (int e = 0; e < 4; e++) sc[e] = (sp[0][e] + sp[1][e]) + (sp[2][e] + sp[3][e]);
        const bool ok0 = t + g < t1, ok1 = t + g + 8 < t1;
        sc[0] = ok0 ? sc[0] * scale : -INFINITY;
        sc[1] = ok0 ? sc[1] * scale : -INFINITY;
        sc[2] = ok1 ? sc[2] * scale : -INFINITY;
        sc[3] = ok1 ? sc[3] * scale : -INFINITY;
        float x0 = fmaxf(sc[0], sc[2]), x1 = fmaxf(sc[1], sc[3]);
#pragma unroll
        for (int off = 4; off < 32; off <<= 1) {
            x0 = fmaxf(x0, __shfl_xor_sync(0xffffffffu, x0, off));
            x1 = fmaxf(x1, __shfl_xor_sync(0xffffffffu, x1, off));
        }
        const float n0 = fmaxf(m0, x0), n1 = fmaxf(m1, x1);   // finite: row t < t1 is valid
        const float a0 = expf(m0 - n0), a1 = expf(m1 - n1);
        const float p0 = expf(sc[0] - n0), p1 = expf(sc[1] - n1), p2 = expf(sc[2] - n0), p3 = expf(sc[3] - n1);
        float s0 = p0 + p2, s1 = p1 + p3;
#pragma unroll
        for (int off = 4; off < 32; off <<= 1) {
            s0 += __shfl_xor_sync(0xffffffffu, s0, off);
            s1 += __shfl_xor_sync(0xffffffffu, s1, off);
        }
        l0 = l0 * a0 + s0;
        l1 = l1 * a1 + s1;
        m0 = n0;
        m1 = n1;
        // Pᵀ as the B fragment: rows 2j, 2j + 1 (+ 8) of head g
        const uint32_t pb2[2] = {movmatrix_t(pack_bf16(p0, p1)), movmatrix_t(pack_bf16(p2, p3))};
#pragma unroll
        for (int mt = 0; mt < RT; mt++) {
            o[mt][0] *= a0; o[mt][1] *= a1; o[mt][2] *= a0; o[mt][3] *= a1;
            uint32_t a[4];
            lda_trans_sm(a, tile, ldt, 16 * mt, 0, lane);
            mma16816(o[mt], a, pb2);
        }
        __syncwarp();   // every lane's tile reads done before the tile is refilled
        st = (st + 1) % TC_STAGES;
    }
    cp_async_wait<0>();   // (only empty groups can be left)
    if (g == 0) {
        if (2 * j < H) { pml[4 * j] = m0; pml[4 * j + 1] = l0; }
        if (2 * j + 1 < H) { pml[4 * j + 2] = m1; pml[4 * j + 3] = l1; }
    }
#pragma unroll
    for (int mt = 0; mt < RT; mt++) {
        const int ch = 16 * mt + g;
        if (2 * j < H) { po[(size_t)(2 * j) * R + ch] = o[mt][0]; po[(size_t)(2 * j) * R + ch + 8] = o[mt][2]; }
        if (2 * j + 1 < H) { po[(size_t)(2 * j + 1) * R + ch] = o[mt][1]; po[(size_t)(2 * j + 1) * R + ch + 8] = o[mt][3]; }
    }
}

// LM_MLA_DECODE=fp32: new caches in fp32 (decoded by the fp32 kernels) even where the
// tensor-core kernel has an instance; a cache's decode follows the format it was made in
static int g_mla_tc = -1;
int lm_cuda_mla_decode_tc(void) {
    if (g_mla_tc < 0) {
        const char *e = getenv("LM_MLA_DECODE");
        if (e && *e && strcmp(e, "tc") && strcmp(e, "fp32")) lm_die("LM_MLA_DECODE='%s' is not tc or fp32", e);
        g_mla_tc = !(e && !strcmp(e, "fp32"));
    }
    return g_mla_tc;
}
void lm_cuda_set_mla_decode_tc(int on) { g_mla_tc = on != 0; }
// the (R, De) instances: the `small` preset's, and two test shapes
typedef void (*tc_kernel)(float *, float *, const float *, const float *, const bf16 *, const bf16 *, const int *,
                          int, int, int, int, float);
static tc_kernel tc_kernel_for(int R, int De) {
    if (R == 256 && De == 64) return mla_decode_tc_k<256, 64>;
    if (R == 128 && De == 0) return mla_decode_tc_k<128, 0>;
    if (R == 64 && De == 16) return mla_decode_tc_k<64, 16>;
    return NULL;
}
static_assert(TC_WARPS * TC_STAGES * TC_ROWS * (256 + 64 + 8) * 2 <= 227 * 1024,
              "the largest instance's ring fits an SM's shared memory");
// dims a bf16 cache can have: ≤ 8 heads (one n-tile) and an instance for (R, De)
static int tc_shape(int H, int R, int De) { return H >= 1 && H <= 8 && tc_kernel_for(R, De); }
int lm_cuda_mla_decode_tc_takes(int H, int R, int De) { return lm_cuda_mla_decode_tc() && tc_shape(H, R, De); }

// blocks of the split kernel resident on the whole GPU at once (one wave)
static int split_slots(int tc, int R, int De) {
    static int n[2] = {0, 0}, key = -1;
    if (tc && key != R * 4096 + De) n[1] = 0, key = R * 4096 + De;
    if (!n[tc]) {
        int dev, sms, per_sm;
        cudaCheck(cudaGetDevice(&dev));
        cudaCheck(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        if (tc) {
            const size_t smem = TC_WARPS * tc_warp_smem(R + De);
            cudaCheck(cudaFuncSetAttribute(tc_kernel_for(R, De), cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            cudaCheck(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, tc_kernel_for(R, De), 32 * TC_WARPS, smem));
        } else {
            cudaCheck(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, mla_decode_split_k, 32 * DEC_WARPS, 0));
        }
        n[tc] = sms * (per_sm > 0 ? per_sm : 1);
    }
    return n[tc];
}

// the host's split count and minimum split length for B sequences of a Tmax-row cache (both
// kernels: tc selects whose occupancy sizes the waves)
static int decode_splits(int tc, int B, int R, int De, int Tmax, int *minrows) {
    // blocks per sequence: two full waves over all sequences (rounded down, so the last wave
    // is nearly full), no more than the minrows-row splits of a full cache
    long nb = 2L * split_slots(tc, R, De) / B;
    *minrows = DEC_MINROWS;
    if ((long)B * (((long)Tmax + DEC_MINROWS * DEC_WARPS - 1) / (DEC_MINROWS * DEC_WARPS)) < lm_cuda_num_sms())
        *minrows = DEC_MINROWS_SHORT;
    const long nb_max = ((long)Tmax + *minrows * DEC_WARPS - 1) / (*minrows * DEC_WARPS);
    if (nb > nb_max) nb = nb_max;
    if (nb > 4096 / DEC_WARPS) nb = 4096 / DEC_WARPS;   // the combine keeps NS weights in shared memory
    if (nb < 1) nb = 1;
    return (int)nb * DEC_WARPS;
}

void cuda_mla_decode(real *o_lat, const real *q_lat, const real *q_pe, const real *c_cache, const real *kpe_cache,
                     const int *lens, int B, int H, int R, int De, int Tmax, real scale, int cache_bf16) {
    if (B <= 0 || H <= 0 || R <= 0) return;
    // a bf16 cache is one lm_cuda_mla_decode_tc_takes accepted when it was made
    LM_CHECK(!cache_bf16 || (tc_shape(H, R, De) && Tmax > 0 && lm_aligned16({c_cache}) &&
                             (De == 0 || lm_aligned16({kpe_cache}))),
             "cuda mla_decode: no bf16-cache kernel for H %d, R %d, De %d", H, R, De);
    const bool split = cache_bf16 || (H <= DEC_NH && R <= 128 * DEC_KR && De <= 128 && R % 4 == 0 && De % 4 == 0 &&
                                lm_aligned16({c_cache}) && (De == 0 || lm_aligned16({kpe_cache})) && Tmax > 0);
    if (split) {
        int minrows;
        const int NS = decode_splits(cache_bf16, B, R, De, Tmax, &minrows);
        float *part_o = (float *)lm_cuda_scratch(lm_align256((size_t)B * NS * H * R * sizeof(float)) +
                                                 (size_t)B * NS * H * 2 * sizeof(float));
        float *part_ml = part_o + lm_align256((size_t)B * NS * H * R * sizeof(float)) / sizeof(float);
        dim3 grid(NS / DEC_WARPS, B);
        if (cache_bf16)
            tc_kernel_for(R, De)<<<grid, 32 * TC_WARPS, TC_WARPS * tc_warp_smem(R + De), lm_cuda_stream()>>>(
                part_o, part_ml, q_lat, q_pe, (const bf16 *)c_cache, (const bf16 *)kpe_cache, lens, H, Tmax, NS,
                minrows, scale);
        else
            mla_decode_split_k<<<grid, 32 * DEC_WARPS, 0, lm_cuda_stream()>>>(part_o, part_ml, q_lat, q_pe, c_cache,
                                                                              kpe_cache, lens, B, H, R, De, Tmax,
                                                                              NS, minrows, scale);
        cudaLaunchCheck();
        mla_decode_combine_k<<<dim3(H, B, (R + 31) / 32), 32 * DEC_COMB_WARPS, (size_t)NS * sizeof(float),
                               lm_cuda_stream()>>>(o_lat, part_o, part_ml, H, R, NS);
        cudaLaunchCheck();
        return;
    }
    float *sc = (float *)lm_cuda_scratch((size_t)B * H * (Tmax > 0 ? Tmax : 1) * sizeof(float));
    size_t smem = (size_t)(2 * R + De) * sizeof(float);
    LM_CHECK(smem <= 48 * 1024, "cuda mla_decode: latent rank %d too large", R);
    mla_decode_k<<<B * H, 32, smem, lm_cuda_stream()>>>(o_lat, q_lat, q_pe, c_cache, kpe_cache, lens, sc, B, H, R,
                                                        De, Tmax, scale);
    cudaLaunchCheck();
}

// ---- cache append: rows lens[b] − T … lens[b] − 1 of sequence b ← x [B, T, W] ----
// grid (⌈T·W/256⌉, B). The position is read on the device (a recorded decode step replays it
// at the cache's current end); a lens[b] < T or > Tmax (never from lm_cache) writes nothing.
// TC: float, or bf16 (the MLA caches the tensor-core decode reads, rounded to nearest even).
__device__ __forceinline__ void cache_put(float *p, float x) { *p = x; }
__device__ __forceinline__ void cache_put(__nv_bfloat16 *p, float x) { *p = __float2bfloat16_rn(x); }
template <typename TC>
__global__ static void cache_append_k(TC *cache, const float *x, const int *lens, int T, int W, int Tmax) {
    const int b = blockIdx.y, len = lens[b];
    const size_t n = (size_t)T * W, i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || len < T || len > Tmax) return;
    cache_put(cache + ((size_t)b * Tmax + len - T) * W + i, x[(size_t)b * n + i]);
}

void cuda_cache_append(real *cache, const real *x, const int *lens, int B, int T, int W, int Tmax, int as_bf16) {
    if (B <= 0 || T <= 0 || W <= 0) return;
    const size_t n = (size_t)T * W;
    const dim3 grid((unsigned)((n + 255) / 256), B);
    if (as_bf16) cache_append_k<<<grid, 256, 0, lm_cuda_stream()>>>((__nv_bfloat16 *)cache, x, lens, T, W, Tmax);
    else cache_append_k<<<grid, 256, 0, lm_cuda_stream()>>>(cache, x, lens, T, W, Tmax);
    cudaLaunchCheck();
}

// dst [rows, W] ← rows 0 … rows − 1 of sequence b (a bf16 cache's values widened)
__global__ static void cache_rows_k(float *dst, const __nv_bfloat16 *src, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __bfloat162float(src[i]);
}
void cuda_cache_rows(real *dst, const real *cache, int b, int rows, int W, int Tmax, int as_bf16) {
    LM_CHECK(rows >= 0 && rows <= Tmax && W > 0, "cuda cache_rows: %d rows of %d, width %d", rows, Tmax, W);
    const size_t n = (size_t)rows * W, at = (size_t)b * Tmax * W;
    if (!n) return;
    if (as_bf16) {
        cache_rows_k<<<lm_cuda_blocks(n, 256), 256, 0, lm_cuda_stream()>>>(dst, (const __nv_bfloat16 *)cache + at, n);
        cudaLaunchCheck();
    } else {
        cudaCheck(cudaMemcpyAsync(dst, cache + at, n * sizeof(float), cudaMemcpyDeviceToDevice, lm_cuda_stream()));
    }
}

// ---- per-head max logit (QK-Clip): one block per head, a fixed-order tree reduction ----
__global__ static void attn_max_logit_k(float *out, const float *q, const float *k, int B, int T, int H, int Dqk,
                                        float scale) {
    __shared__ float red[256];
    const int h = blockIdx.x;
    float mx = -INFINITY;
    const long pairs = (long)T * (T + 1) / 2;
    for (int b = 0; b < B; b++)
        for (long p = threadIdx.x; p < pairs; p += blockDim.x) {
            // pair index p → (t, s ≤ t): t = floor((sqrt(8p+1) − 1) / 2)
            long t = (long)((sqrtf(8.0f * (float)p + 1.0f) - 1.0f) * 0.5f);
            while (t * (t + 1) / 2 > p) t--;
            while ((t + 1) * (t + 2) / 2 <= p) t++;
            long s = p - t * (t + 1) / 2;
            const float *qt = q + (((size_t)b * T + t) * H + h) * Dqk, *ks = k + (((size_t)b * T + s) * H + h) * Dqk;
            float d = 0;
            for (int c = 0; c < Dqk; c++) d += qt[c] * ks[c];
            mx = fmaxf(mx, scale * d);
        }
    red[threadIdx.x] = mx;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + w]);
        __syncthreads();
    }
    if (threadIdx.x == 0) out[h] = red[0];
}

void cuda_attn_max_logit(real *out_host, const real *q, const real *k, int B, int T, int H, int Dqk, real scale) {
    float *d = (float *)lm_cuda_scratch((size_t)H * sizeof(float));
    attn_max_logit_k<<<H, 256, 0, lm_cuda_stream()>>>(d, q, k, B, T, H, Dqk, scale);
    cudaCheck(cudaGetLastError());
    lm_cuda_read(out_host, d, (size_t)H * sizeof(float));
}
