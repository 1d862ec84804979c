// kda_decode.cu — one recurrent KDA step per sequence on a pool of fp32 states (decode),
// and the short-convolution decode step that produces its q, k, v.
//
// Decode is memory-bound: every (sequence, head) — an "item" — reads and writes its K×V fp32
// state once (64 KiB each way at K = V = 128). The value columns of the step are independent
// but for the norms of q and k, so one block takes VT of the item's V columns (the state rows'
// VT-wide pieces; VT = V/2 by default, below); each of its threads (128 at K = 128, else 256)
// holds a KR × 4 tile in registers (16-byte loads,
// all issued before the gate math), so the state makes exactly one round trip:
//   S ← Diag(e^g) S;  p = Sᵀk̂;  r = β(v − p);  S ← S + k̂ rᵀ;  o = Sᵀ(scale·q̂)
// (the two reductions over K go through shared memory).
// Measured on the H200 at 64 sequences × 32 heads, K = V = 128 (bench/RESULTS.md, session 7),
// kernel time by ncu: VT = 128 71.9 µs (110 registers, 2 blocks per SM), VT = 64 71.4 µs
// (79 registers, 3 per SM; also steadier by CUDA events: 75.6–75.9 µs against 75.6–82.2),
// VT = 32 79.2 µs; ~71% of DRAM peak. A persistent kernel with the states streamed through
// a shared-memory ring by the bulk-copy engine (one block per SM, with plain or bulk
// stores) was slower: 77.7 / 73.8 µs — its eight warps per SM waited at barriers.
// Session 11 (bench_kda --decode, CUDA events, one call): out of place (kda_decode_to into a second pool)
// 73.6 µs per call, 70.3 µs per step back to back, against 75.8 / 71.6 in place; a copy-only
// kernel does 69.1 / 65.6 (in place 77.3 / 66.3). Not the kernel's win: a warp per 16 columns
// with no block barriers (74.9), launch bounds for 4 or 6 blocks per SM (75.6 / 133 µs, spills)
// and streaming (.cs) loads and stores (±0.5 µs) were no faster.
#include "kda_common.cuh"
#include <stdlib.h>

#define DEC_THREADS 256

// q, k, v, f, beta and o are TI / TO (bf16 for the kernel API, fp32 for the backend's op)
struct DecArgs {
    int H;
    int gate_mode;
    float lb, scale;
    const void *q, *k, *v, *f, *beta;
    const float *A_log, *dt_bias;
    const float *state_in;   // may equal state_out (in place)
    float *state_out;
    const int *slots_in, *slots_out;
    void *o;
};
__device__ __forceinline__ float dec_ld(const bf16 *p, size_t i) { return bf(p[i]); }
__device__ __forceinline__ float dec_ld(const float *p, size_t i) { return p[i]; }
__device__ __forceinline__ void dec_st(bf16 *p, size_t i, float x) { p[i] = __float2bfloat16(x); }
__device__ __forceinline__ void dec_st(float *p, size_t i, float x) { p[i] = x; }

template <int K, int VT, int NT> struct DecShared {
    static constexpr int VG = VT / 4, RG = NT / VG, KR = K / RG;
    float sq[K], sk[K], sal[K], sr[VT], red[RG][VT + 4], wsum[2][NT / 32];
};

// grid (B·H·V/VT): block → item (sequence b, head h) and its columns c0 .. c0 + VT − 1
template <int K, int V, int VT, typename TI, typename TO, int NT>
__global__ void __launch_bounds__(NT) kda_decode_kernel(DecArgs a) {
    static_assert(NT >= K && NT >= VT, "a thread per channel for the norms, per column for the sums");
    typedef DecShared<K, VT, NT> Sh;
    const TI *aq = (const TI *)a.q, *ak = (const TI *)a.k, *av = (const TI *)a.v, *af = (const TI *)a.f;
    constexpr int VG = Sh::VG, RG = Sh::RG, KR = Sh::KR;
    __shared__ __align__(16) Sh sm;   // red and sr are read as float4
    const int item = blockIdx.x / (V / VT), c0 = (blockIdx.x % (V / VT)) * VT;
    const int b = item / a.H, h = item % a.H, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int cg = tid % VG, rg = tid / VG;   // (NT / VG row groups of KR rows)
    const int sin = a.slots_in ? a.slots_in[b] : b, sout = a.slots_out ? a.slots_out[b] : b;
    const float *Si = a.state_in + ((size_t)sin * a.H + h) * K * V + c0;   // row stride V
    float *So = a.state_out + ((size_t)sout * a.H + h) * K * V + c0;
    const size_t bh = (size_t)item;

    float4 x[KR];
#pragma unroll
    for (int i = 0; i < KR; i++) {
        x[i] = *reinterpret_cast<const float4 *>(Si + (size_t)(rg * KR + i) * V + 4 * cg);
    }
    const float vt = tid < VT ? dec_ld(av, bh * V + c0 + tid) : 0.f;

    float q2 = 0.f, k2 = 0.f;
    if (tid < K) {
        float qv = dec_ld(aq, bh * K + tid), kv = dec_ld(ak, bh * K + tid);
        float g = kda_gate(a.gate_mode, a.lb, expf(a.A_log[h]), dec_ld(af, bh * K + tid) + a.dt_bias[(size_t)h * K + tid]);
        sm.sq[tid] = qv;
        sm.sk[tid] = kv;
        sm.sal[tid] = ex2f_(g * KDA_LOG2E);
        q2 = qv * qv;
        k2 = kv * kv;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        q2 += __shfl_xor_sync(0xffffffffu, q2, o);
        k2 += __shfl_xor_sync(0xffffffffu, k2, o);
    }
    if (lane == 0) {
        sm.wsum[0][warp] = q2;
        sm.wsum[1][warp] = k2;
    }
    __syncthreads();
    float tq = 0.f, tk = 0.f;
#pragma unroll
    for (int w = 0; w < NT / 32; w++) {
        tq += sm.wsum[0][w];
        tk += sm.wsum[1][w];
    }
    const float rq = rsqrtf(tq + 1e-6f) * a.scale, rk = rsqrtf(tk + 1e-6f);
    const float beta = sigmoidf_(dec_ld((const TI *)a.beta, bh));

    // decay and prediction p = Sᵀ k̂
    float4 p = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int i = 0; i < KR; i++) {
        int kk = rg * KR + i;
        float al = sm.sal[kk], kn = sm.sk[kk] * rk;
        x[i].x *= al; x[i].y *= al; x[i].z *= al; x[i].w *= al;
        p.x = fmaf(kn, x[i].x, p.x); p.y = fmaf(kn, x[i].y, p.y);
        p.z = fmaf(kn, x[i].z, p.z); p.w = fmaf(kn, x[i].w, p.w);
    }
    *reinterpret_cast<float4 *>(&sm.red[rg][4 * cg]) = p;
    __syncthreads();
    if (tid < VT) {
        float s = 0.f;
#pragma unroll
        for (int r = 0; r < RG; r++) s += sm.red[r][tid];
        sm.sr[tid] = beta * (vt - s);
    }
    __syncthreads();
    // rank-1 write and read-out o = Sᵀ q̂
    float4 rr = *reinterpret_cast<const float4 *>(&sm.sr[4 * cg]), oo = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int i = 0; i < KR; i++) {
        int kk = rg * KR + i;
        float kn = sm.sk[kk] * rk, qn = sm.sq[kk] * rq;
        x[i].x = fmaf(kn, rr.x, x[i].x); x[i].y = fmaf(kn, rr.y, x[i].y);
        x[i].z = fmaf(kn, rr.z, x[i].z); x[i].w = fmaf(kn, rr.w, x[i].w);
        oo.x = fmaf(qn, x[i].x, oo.x); oo.y = fmaf(qn, x[i].y, oo.y);
        oo.z = fmaf(qn, x[i].z, oo.z); oo.w = fmaf(qn, x[i].w, oo.w);
        // one 16-byte store: written as a plain float4 assignment it became four (and 1.6× slower)
        __stwb(reinterpret_cast<float4 *>(So + (size_t)kk * V + 4 * cg), x[i]);
    }
    *reinterpret_cast<float4 *>(&sm.red[rg][4 * cg]) = oo;   // every read of red above precedes the last barrier
    __syncthreads();
    if (tid < VT) {
        float s = 0.f;
#pragma unroll
        for (int r = 0; r < RG; r++) s += sm.red[r][tid];
        dec_st((TO *)a.o, bh * V + c0 + tid, s);
    }
}

// the column pieces per item: KDA_DECODE_SPLIT = 1, 2 or 4, else DEC_SPLIT_DEFAULT
#define DEC_SPLIT_DEFAULT 2
static int decode_split(void) {
    const char *e = getenv("KDA_DECODE_SPLIT");
    int s = e ? atoi(e) : 0;
    return s == 1 || s == 2 || s == 4 ? s : DEC_SPLIT_DEFAULT;
}

// threads per block at K = 128 and splits 2 and 4: KDA_DECODE_THREADS = 128 or 256, else 128.
// Session 25 (bench_kda --decode, steady state, the same call twice; copy floor 65.6–65.9 µs):
// split 2 out of place 70.3 / 70.7 µs at 256 threads (KR = 8 rows a thread, 64 registers),
// 70.1 / 70.1 at 128 (KR = 16, 104 registers: 32 KB of loads in flight per block either way);
// in place 71.7 / 72.1 → 71.5 / 71.6. Split 4 at 128 threads: 71.3 / 71.6.
static int decode_threads(void) {
    const char *e = getenv("KDA_DECODE_THREADS");
    return e && atoi(e) == DEC_THREADS ? DEC_THREADS : 128;
}

template <int K, int V, typename T>
static cudaError_t launch_decode(const DecArgs &a, int B, cudaStream_t stream) {
    const int split = decode_split();
    const unsigned grid = (unsigned)(B * a.H * split);
    if (K == 128 && split > 1 && decode_threads() == 128) {
        if (split == 4) kda_decode_kernel<K, V, V / 4, T, T, 128><<<grid, 128, 0, stream>>>(a);
        else kda_decode_kernel<K, V, V / 2, T, T, 128><<<grid, 128, 0, stream>>>(a);
    } else if (split == 4) {
        kda_decode_kernel<K, V, V / 4, T, T, DEC_THREADS><<<grid, DEC_THREADS, 0, stream>>>(a);
    } else if (split == 2) {
        kda_decode_kernel<K, V, V / 2, T, T, DEC_THREADS><<<grid, DEC_THREADS, 0, stream>>>(a);
    } else {
        kda_decode_kernel<K, V, V, T, T, DEC_THREADS><<<grid, DEC_THREADS, 0, stream>>>(a);
    }
    return cudaGetLastError();
}
template <typename T>
static cudaError_t decode_to(int B, int H, int K, int V, int gate_mode, float lb, float scale, const T *q, const T *k,
                             const T *v, const T *f, const T *beta, const float *A_log, const float *dt_bias,
                             const float *state_in, const int *slots_in, float *state_out, const int *slots_out, T *o,
                             cudaStream_t stream) {
    if (B < 0 || H <= 0 || (gate_mode != 0 && gate_mode != 1) || !state_in || !state_out) return cudaErrorInvalidValue;
    if (B == 0) return cudaSuccess;
    DecArgs a;
    a.H = H; a.gate_mode = gate_mode; a.lb = lb; a.scale = scale;
    a.q = q; a.k = k; a.v = v; a.f = f; a.beta = beta; a.A_log = A_log; a.dt_bias = dt_bias;
    a.state_in = state_in; a.state_out = state_out; a.slots_in = slots_in; a.slots_out = slots_out; a.o = o;
    if (K == 128 && V == 128) return launch_decode<128, 128, T>(a, B, stream);
    if (K == 64 && V == 64) return launch_decode<64, 64, T>(a, B, stream);
    if (K == 128 && V == 64) return launch_decode<128, 64, T>(a, B, stream);
    if (K == 64 && V == 128) return launch_decode<64, 128, T>(a, B, stream);
    return cudaErrorInvalidValue;
}

extern "C" cudaError_t kda_decode_to(int B, int H, int K, int V, int gate_mode, float lb, float scale, const bf16 *q,
                                     const bf16 *k, const bf16 *v, const bf16 *f, const bf16 *beta, const float *A_log,
                                     const float *dt_bias, const float *state_in, const int *slots_in, float *state_out,
                                     const int *slots_out, bf16 *o, cudaStream_t stream) {
    return decode_to<bf16>(B, H, K, V, gate_mode, lb, scale, q, k, v, f, beta, A_log, dt_bias, state_in, slots_in,
                           state_out, slots_out, o, stream);
}

extern "C" cudaError_t kda_decode_f32(int B, int H, int K, int V, int gate_mode, float lb, float scale, const float *q,
                                      const float *k, const float *v, const float *f, const float *beta,
                                      const float *A_log, const float *dt_bias, float *state, const int *slots, float *o,
                                      cudaStream_t stream) {
    return decode_to<float>(B, H, K, V, gate_mode, lb, scale, q, k, v, f, beta, A_log, dt_bias, state, slots, state,
                            slots, o, stream);
}

extern "C" cudaError_t kda_decode(int B, int H, int K, int V, int gate_mode, float lb, float scale, const bf16 *q,
                                  const bf16 *k, const bf16 *v, const bf16 *f, const bf16 *beta, const float *A_log,
                                  const float *dt_bias, float *state, const int *slots, bf16 *o, cudaStream_t stream) {
    return kda_decode_to(B, H, K, V, gate_mode, lb, scale, q, k, v, f, beta, A_log, dt_bias, state, slots, state, slots,
                         o, stream);
}

// one thread per (sequence, channel): reads its W-1 cached inputs, writes the rolled cache
__global__ void kda_conv_decode_kernel(int B, int C, int W, const bf16 *x, const float *w, bf16 *cache,
                                       const int *slots, bf16 *y) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)B * C) return;
    int b = (int)(i / C), c = (int)(i % C);
    int slot = slots ? slots[b] : b;
    bf16 *cb = cache + (size_t)slot * (W - 1) * C + c;
    bf16 xc = x[i];
    float s = 0.f;
    for (int j = 0; j < W - 1; j++) s += w[(size_t)c * W + j] * bf(cb[(size_t)j * C]);
    s += w[(size_t)c * W + W - 1] * bf(xc);
    y[i] = __float2bfloat16(s * sigmoidf_(s));
    for (int j = 0; j + 1 < W - 1; j++) cb[(size_t)j * C] = cb[(size_t)(j + 1) * C];
    if (W > 1) cb[(size_t)(W - 2) * C] = xc;
}

extern "C" cudaError_t kda_conv_decode(int B, int C, int W, const bf16 *x, const float *w, bf16 *cache,
                                       const int *slots, bf16 *y, cudaStream_t stream) {
    if (B < 0 || C <= 0 || W < 1 || W > 8) return cudaErrorInvalidValue;
    long long n = (long long)B * C;
    if (n == 0) return cudaSuccess;
    kda_conv_decode_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(B, C, W, x, w, cache, slots, y);
    return cudaGetLastError();
}
