// cuda_common.cuh — what every CUDA source of the backend shares: error checks
// (cudaCheck, cublasCheck, launch checks), the stream and cuBLAS handle, a reusable
// device workspace, and a few device helpers (block reductions, the column-sum pattern
// used by every deterministic parameter-gradient reduction).
//
// Stream: every op runs on lm_cuda_stream(), one stream created by the backend with the
// default (blocking) flags, so that work on the legacy default stream (cudaMalloc's zero fill,
// other programs' plain cudaMemcpy) stays ordered with it; it is not the legacy stream itself
// because only a created stream can be recorded into a CUDA graph (lm_cuda_graph_begin).
#ifndef LM_CUDA_COMMON_CUH
#define LM_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <cublasLt.h>
#include <initializer_list>
#include <stdint.h>
#include "cuda_backend.h"

void lm_cuda_fail(const char *what, const char *expr, const char *file, int line);
#define cudaCheck(call)                                                                     \
    do {                                                                                    \
        cudaError_t e_ = (call);                                                            \
        if (e_ != cudaSuccess) lm_cuda_fail(cudaGetErrorString(e_), #call, __FILE__, __LINE__); \
    } while (0)
#define cublasCheck(call)                                                                   \
    do {                                                                                    \
        cublasStatus_t s_ = (call);                                                         \
        if (s_ != CUBLAS_STATUS_SUCCESS) lm_cuda_fail(cublasGetStatusString(s_), #call, __FILE__, __LINE__); \
    } while (0)
// after every kernel launch
#define cudaLaunchCheck() cudaCheck(cudaGetLastError())

cublasHandle_t lm_cublas(void);
// cuBLASLt (GEMMs with an epilogue cublasGemmEx lacks: matmul.cu's residual) and the cuBLAS
// handle's workspace, which its calls share: both run in order on the op stream
cublasLtHandle_t lm_cublaslt(void);
void lm_cuda_lt_plans_free(void);   // matmul.cu's cuBLASLt plans (at the backend's shutdown)
void *lm_cublas_workspace(size_t *bytes);
// One device workspace shared by all ops (each op carves what it needs from one call;
// the previous contents are not kept). Growing it frees the old buffer with cudaFree,
// which waits for the device, so work already queued on the old buffer is finished.
void *lm_cuda_scratch(size_t bytes);
// reads a host copy of `bytes` from device memory on the op stream (waits; while recording,
// zeros and a spoiled recording)
void lm_cuda_read(void *host, const void *dev, size_t bytes);
// Recording (CUDA graphs, cuda_graph.cu). While the op stream records, nothing runs, so the
// backend must not allocate, free or read back: lm_cuda_recording() tells the allocation
// sites, which then mark the recording spoiled (lm_cuda_spoil_recording; lm_cuda_graph_end
// then returns NULL) and hand blocks to lm_cuda_free_later instead of cudaFree (freed when
// the recording ends). lm_cuda_mem_changed bumps the epoch a recorded graph is valid for:
// every allocation, free and write of weights whose bf16 copies a graph would read.
int lm_cuda_recording(void);
void lm_cuda_spoil_recording(void);
void lm_cuda_free_later(void *p);
void lm_cuda_mem_changed(void);
// the current device's SM count (queried once)
int lm_cuda_num_sms(void);

static inline unsigned lm_cuda_blocks(size_t n, int threads) {
    size_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : (b > 65535u * 32 ? 65535u * 32 : b));
}
static inline size_t lm_align256(size_t b) { return (b + 255) & ~(size_t)255; }
// 1 when every pointer is 16-byte aligned (NULL counts as aligned: an absent tensor), the
// condition of the kernels' 16-byte loads and stores
static inline int lm_aligned16(std::initializer_list<const void *> ps) {
    for (const void *p : ps)
        if ((uintptr_t)p % 16) return 0;
    return 1;
}

// ---- device helpers ----
__device__ __forceinline__ float dsigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ double warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
// Sum over the block (blockDim.x a multiple of 32, ≤ 1024); every thread gets the result.
// The order is fixed by blockDim, so the result is deterministic. `sh` holds 32 floats.
__device__ __forceinline__ float block_sum(float v, float *sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();   // sh may still be read by a previous call
    if (lane == 0) sh[w] = v;
    __syncthreads();
    float t = lane < nw ? sh[lane] : 0.0f;
    return warp_sum(t);
}
// ---- rows held in registers, four channels per thread (attnres.cu, norm.cu) ----
__device__ __forceinline__ float dot4(float4 a, float4 b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }
__device__ __forceinline__ float4 ld4(const float *p) { return *reinterpret_cast<const float4 *>(p); }
__device__ __forceinline__ float4 ld4(const float *p, bool ok) { return ok ? ld4(p) : make_float4(0.f, 0.f, 0.f, 0.f); }
// four fp32 values at p: one 16-byte access when vec (p 16-byte aligned), else four
__device__ __forceinline__ float4 ld4v(const float *p, int vec) {
    return vec ? ld4(p) : make_float4(p[0], p[1], p[2], p[3]);
}
__device__ __forceinline__ void st4v(float *p, float4 x, int vec) {
    if (vec) *reinterpret_cast<float4 *>(p) = x;
    else p[0] = x.x, p[1] = x.y, p[2] = x.z, p[3] = x.w;
}
__device__ __forceinline__ float4 mul4(float4 a, float4 b) { return make_float4(a.x * b.x, a.y * b.y, a.z * b.z, a.w * b.w); }
__device__ __forceinline__ float4 add4(float4 a, float4 b) { return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w); }
// four consecutive bf16 (8-byte aligned) to or from fp32: one 8-byte access, rounded to nearest
// even as lm_cuda_to_bf16 rounds
__device__ __forceinline__ void st4_bf16(__nv_bfloat16 *p, float4 x) {
    __nv_bfloat162 lo = __floats2bfloat162_rn(x.x, x.y), hi = __floats2bfloat162_rn(x.z, x.w);
    uint2 u;
    u.x = *reinterpret_cast<unsigned *>(&lo);
    u.y = *reinterpret_cast<unsigned *>(&hi);
    *reinterpret_cast<uint2 *>(p) = u;
}
__device__ __forceinline__ float4 ld4_bf16(const __nv_bfloat16 *p) {
    const uint2 u = *reinterpret_cast<const uint2 *>(p);
    const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&u.x));
    const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&u.y));
    return make_float4(lo.x, lo.y, hi.x, hi.y);
}
// a += s·b, for one value or four (templates over float / float4 call either)
__device__ __forceinline__ void axpy(float &a, float s, float b) { a += s * b; }
__device__ __forceinline__ void axpy(float4 &a, float s, float4 b) {
    a.x += s * b.x; a.y += s * b.y; a.z += s * b.z; a.w += s * b.w;
}
// p[0..3] += a·u − b·v, or = when assign (p not read) (16-byte aligned): a norm backward's
// dx update
__device__ __forceinline__ void axmby4(float *p, float a, float4 u, float b, float4 v, int assign) {
    float4 *d = reinterpret_cast<float4 *>(p);
    const float4 r = make_float4(a * u.x - b * v.x, a * u.y - b * v.y, a * u.z - b * v.z, a * u.w - b * v.w);
    if (assign) {
        *d = r;
    } else {
        const float4 o = *d;
        *d = make_float4(o.x + r.x, o.y + r.y, o.z + r.z, o.w + r.w);
    }
}
// the register kernels' launch shape: threads for C/4 float4 lanes (whole warps), and rows
// per block for kernels that also sum a parameter gradient over their rows (enough blocks
// to fill the GPU, few partial rows to add afterwards)
static inline int lm_reg_row_threads(int C) { return ((C / 4 + 31) / 32) * 32; }
static inline int lm_reg_rows_per_block(int N) { int r = N / 512; return r < 1 ? 1 : r > 16 ? 16 : r; }
// The same for `kernel` launched with `threads` and `smem` bytes of dynamic shared memory: of
// lm_reg_rows_per_block(N) down to half of it, the count whose grid fills its last wave of
// resident blocks best (the larger count on a tie). At the small preset's 16,384 rows, 16 rows
// a block made 1,024 blocks = 2.59 waves of 396 for the mixers' backward (ncu: the third wave
// 59% full); 14 make 1,171 = 2.96. LM_ROWS_FIT=0: lm_reg_rows_per_block's (A/B). The count
// groups the rows of the per-block partial sums (the gains' and mixers' parameter gradients),
// so their rounding now depends on the GPU's SM count and occupancy as well as on N.
int lm_reg_rows_per_block_fit(int N, const void *kernel, int threads, size_t smem);
// The warp's sums of P values per lane (P a power of two ≤ 32), scattered: at lane offset O a
// lane keeps the half of its values whose index bit is its lane bit O and adds its partner's
// copies of them (at compile time throughout, so w stays in registers); with one value left,
// plain sums over the remaining offsets. Lane l ends with w[0] = the sum of value l >> (5 − log2 P).
template <int P, int O>
__device__ __forceinline__ void warp_reduce_scatter(float *w, int lane) {
    if constexpr (P > 1) {
        constexpr int h = P / 2;
        const bool up = lane & O;
#pragma unroll
        for (int i = 0; i < h; i++) {
            const float send = up ? w[i] : w[i + h], keep = up ? w[i + h] : w[i];
            w[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
        }
        warp_reduce_scatter<h, O / 2>(w, lane);
    } else {
#pragma unroll
        for (int o = O; o >= 1; o >>= 1) w[0] += __shfl_xor_sync(0xffffffffu, w[0], o);
    }
}
// Sums K per-thread values over the block into tot[0..K): each warp by shuffles, then lane k
// of warp 0 adds the warps' k-th partials in warp order (a fixed tree). red: [32·K] shared
// floats; tot is complete for warp 0 on return (the other warps: after a __syncthreads).
// Several values (K ≥ 2) take a warp reduce-scatter: at the step of lane offset o, a lane sends
// the half of its values its partner keeps and adds the other half's partner values to its own,
// so the values halve at each step — P − 1 shuffles for P = K rounded up to a power of two
// (≤ 32; 5·K one at a time): for the AttnRes backward's 32 sums per row, 31 shuffles instead
// of 160. Lane l then holds the warp's sum of value l >> (5 − log2 P).
template <int K>
__device__ __forceinline__ void block_sums(float (&v)[K], float *red, float *tot) {
    const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5, nw = blockDim.x >> 5;
    constexpr int P = K <= 1 ? 1 : K <= 2 ? 2 : K <= 4 ? 4 : K <= 8 ? 8 : K <= 16 ? 16 : 32;
    if constexpr (K == 1 || K > 32) {
#pragma unroll
        for (int k = 0; k < K; k++) v[k] = warp_sum(v[k]);
        if (lane == 0)
#pragma unroll
            for (int k = 0; k < K; k++) red[wi * K + k] = v[k];
    } else {
        constexpr int LP = P == 2 ? 1 : P == 4 ? 2 : P == 8 ? 3 : P == 16 ? 4 : 5;
        float w[P];
#pragma unroll
        for (int k = 0; k < P; k++) w[k] = k < K ? v[k] : 0.f;
        warp_reduce_scatter<P, 16>(w, lane);
        const int k = lane >> (5 - LP);
        if ((lane & ((1 << (5 - LP)) - 1)) == 0 && k < K) red[wi * K + k] = w[0];
    }
    __syncthreads();
    if (wi == 0) {
        for (int k = lane; k < K; k += 32) {
            float s = 0;
            for (int w2 = 0; w2 < nw; w2++) s += red[w2 * K + k];
            tot[k] = s;
        }
        __syncwarp();
    }
}
// The end of a register RMSNorm row (one row per block, thread t owning channels 4t..4t+3, x
// zero past C): out = x · rstd · gain and its bf16 copy in lo (NULL: none) at element e, rstd
// by thread 0. red: [32] shared floats, tot: [1].
__device__ __forceinline__ void rms_row_out(float4 x, float *out, __nv_bfloat16 *lo, float *rstd, const float *gain,
                                            size_t e, bool on, int C, float eps, float *red, float *tot) {
    float v[1] = {dot4(x, x)};
    block_sums<1>(v, red, tot);
    __syncthreads();
    const float r = 1.0f / sqrtf(tot[0] / C + eps);
    if (threadIdx.x == 0) *rstd = r;
    if (!on) return;
    const int c = 4 * threadIdx.x;
    const float4 g = ld4(gain + c, true);
    const float4 y = make_float4(x.x * r * g.x, x.y * r * g.y, x.z * r * g.z, x.w * r * g.w);
    if (out) *reinterpret_cast<float4 *>(out + e) = y;   // NULL: the bf16 copy alone (rmsnorm_fwd)
    if (lo) st4_bf16(lo + e, y);
}
__device__ __forceinline__ float block_max(float v, float *sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    float t = lane < nw ? sh[lane] : -INFINITY;
    return warp_max(t);
}
__device__ __forceinline__ double block_sum_d(double v, double *sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum_d(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    double t = lane < nw ? sh[lane] : 0.0;
    return warp_sum_d(t);
}

// ---- deterministic column sums: sums[c] = Σ_{i<N} f(i, c), c < C ----
// Rows are cut into chunks (64 rows, more when N is huge so that there are at most 32768
// chunks); each (chunk, column) partial is summed in row order, then the partials in
// chunk order: the result depends only on N and C, never on timing.
static inline int colsum_rows_per_chunk(int N) {
    int r = 64;
    if ((N + r - 1) / r > 32768) r = (N + 32767) / 32768;
    return r;
}
static inline int colsum_chunks(int N) { int r = colsum_rows_per_chunk(N); return (N + r - 1) / r; }
static inline size_t colsum_ws_floats(int N, int C) {
    int nch = colsum_chunks(N);
    return (size_t)(nch ? nch : 1) * (size_t)C + (size_t)C;
}
template <class F>
__global__ void colsum_partial_k(float *part, int N, int C, int rpc, F f) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    int i0 = blockIdx.y * rpc, i1 = min(N, i0 + rpc);
    float s = 0.0f;
#pragma unroll 8   // independent loads in flight; the sum keeps its order
    for (int i = i0; i < i1; i++) s += f(i, c);
    part[(size_t)blockIdx.y * C + c] = s;
}
// sums [C] = (add ? sums : 0) + Σ_j part [j, C] by a fixed tree, on the op stream (also for
// kernels that write per-block partial sums of their own rows: attnres.cu, norm.cu, conv.cu)
void lm_cuda_colsum_final(float *sums, const float *part, int nch, int C, int add);
// ws: colsum_ws_floats(N, C) floats of device memory; returns the sums array (inside ws)
template <class F>
float *colsum(float *ws, int N, int C, F f) {
    int nch = colsum_chunks(N);
    float *sums = ws + (size_t)(nch ? nch : 1) * C;
    if (C <= 0) return sums;
    if (nch == 0) {
        cudaCheck(cudaMemsetAsync(sums, 0, (size_t)C * sizeof(float), lm_cuda_stream()));
        return sums;
    }
    dim3 grid((C + 127) / 128, nch);
    colsum_partial_k<<<grid, 128, 0, lm_cuda_stream()>>>(ws, N, C, colsum_rows_per_chunk(N), f);
    cudaLaunchCheck();
    lm_cuda_colsum_final(sums, ws, nch, C, 0);
    return sums;
}

// Deterministic scatter-add of rows: dst[keys[i]] += src[i] for i < n (rows of C floats),
// each destination row summing its sources in increasing i from its old value, exactly as
// a sequential loop would. keys are < 2^key_bits; rows with a negative key are skipped
// (with key_bits = 31 they sort last). Uses (and overwrites) the
// workspace: a stable radix sort (CUB) groups equal keys.
// The MoE combine and its gate gradient with the expert rows yp in bf16 (moe.cu; the experts
// op's kept form): y (+)= Σ_slot gate · yp[slot_row] (gate NULL: 1; assign: y written);
// dgate[i, t] += <dy[i], yp[slot_row[i, t]]>. C % 8 == 0 and yp 16-byte aligned; y, dy any
// (16-byte aligned: float4 accesses).
void lm_cuda_moe_combine_bf16(float *y, const __nv_bfloat16 *yp, const float *gate, const int *slot_row, int N, int k,
                              int C, int assign);
void lm_cuda_moe_dgate_bf16(float *dgate, const float *dy, const __nv_bfloat16 *yp, const int *slot_row, int N, int k,
                            int C);
void lm_cuda_scatter_add_rows(float *dst, const int *keys, const float *src, int n, int C, int key_bits);

// y [n] = x [n] rounded to bf16 (y: n bf16 of device memory, 8-byte aligned); on the op stream
struct __nv_bfloat16;
void lm_cuda_to_bf16(__nv_bfloat16 *y, const float *x, size_t n);
// y [rows, ldy]: columns 0..cols−1 of each row = x [rows, cols] rounded to bf16 (a column
// block of a wider bf16 matrix)
void lm_cuda_to_bf16_rows(__nv_bfloat16 *y, long ldy, const float *x, long rows, long cols);
// conv_silu_fwd / conv_silu_bwd without a cache (conv.cu) with a bf16 output / bf16 dout: the
// KDA op's own conv (lm_kda_args.conv_W). The same arithmetic as the fp32 ops, so equal to
// them followed by rounding / preceded by widening, bit for bit. The backward takes its dw
// partial sums in part (lm_cuda_conv_bwd_part_floats; the caller's, since the caller's own
// buffers live in the workspace) and only the vectorised form: C % 4 == 0, W ≤ 8, dinp,
// dout, inp 16-byte aligned (refused otherwise). lo (with assign): dinp written in bf16 instead,
// as the first C columns of rows of ldl elements (ldl % 4 == 0, lo 8-byte aligned), dinp untouched.
void lm_cuda_conv_silu_fwd_bf16(__nv_bfloat16 *out, const float *inp, const float *w, int B, int T, int C, int W);
size_t lm_cuda_conv_bwd_part_floats(int B, int T, int C, int W);
void lm_cuda_conv_silu_bwd_bf16(float *dinp, __nv_bfloat16 *lo, long ldl, float *dw, float *part,
                                const __nv_bfloat16 *dout, const float *inp, const float *w, int B, int T, int C,
                                int W, int assign);
// bf16 copy of the n fp32 weights at W (weight_cache.cu), made at the first use after they
// may have changed and kept until then. "May have changed" = lm_cuda_weights_written()
// covered them, or lm_cuda_weights_changed() was called, since the copy was made
// (cuda_backend.h).
const __nv_bfloat16 *lm_cuda_weight_bf16(const float *W, size_t n);
// The copy of exactly these n weights, if one exists, marked current: the caller is about
// to write bf16(W) into it (an optimizer updating W in place). NULL when there is none.
__nv_bfloat16 *lm_cuda_weight_bf16_claim(const float *W, size_t n);

// dst[i] += src[i] (NULL dst: nothing), and dst[i] += src[i] * mul[i]
void lm_cuda_acc_vec(float *dst, const float *src, const float *mul, int n);
// 1 if `kernel` launches in blocks of `threads` threads: its registers per thread allow it
// (cudaFuncAttributes.maxThreadsPerBlock, looked up once per kernel)
int lm_cuda_fits(const void *kernel, int threads);

#endif
