// kda_decode.cu — one recurrent KDA step per sequence on a pool of fp32 states (decode),
// and the short-convolution decode step that produces its q, k, v.
//
// Decode is memory-bound: every (sequence, head) reads and writes its K×V fp32 state once
// (64 KiB each way at K = V = 128). One block per (sequence, head); each thread holds a
// KR × 4 tile of the state in registers (16-byte loads, all issued before the gate math),
// so the state makes exactly one round trip:
//   S ← Diag(e^g) S;  p = Sᵀk̂;  r = β(v − p);  S ← S + k̂ rᵀ;  o = Sᵀ(scale·q̂)
// (the two reductions over K go through shared memory).
#include "kda_common.cuh"

#define DEC_THREADS 256

struct DecArgs {
    int H;
    int gate_mode;
    float lb, scale;
    const bf16 *q, *k, *v, *f, *beta;
    const float *A_log, *dt_bias;
    float *state;
    const int *slots;
    bf16 *o;
};

template <int K, int V>
__global__ void __launch_bounds__(DEC_THREADS) kda_decode_kernel(DecArgs a) {
    constexpr int VG = V / 4, RG = DEC_THREADS / VG, KR = K / RG;
    __shared__ float sq[K], sk[K], sal[K], sr[V], red[RG][V + 4], wsum[2][DEC_THREADS / 32];
    int b = blockIdx.x / a.H, h = blockIdx.x % a.H, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int cg = tid % VG, rg = tid / VG;
    int slot = a.slots ? a.slots[b] : b;
    float *S = a.state + ((size_t)slot * a.H + h) * K * V;
    size_t bh = (size_t)b * a.H + h;

    float4 x[KR];
#pragma unroll
    for (int i = 0; i < KR; i++) x[i] = *reinterpret_cast<const float4 *>(S + (size_t)(rg * KR + i) * V + 4 * cg);

    float q2 = 0.f, k2 = 0.f;
    if (tid < K) {
        float qv = bf(a.q[bh * K + tid]), kv = bf(a.k[bh * K + tid]);
        float g = kda_gate(a.gate_mode, a.lb, expf(a.A_log[h]), bf(a.f[bh * K + tid]) + a.dt_bias[(size_t)h * K + tid]);
        sq[tid] = qv;
        sk[tid] = kv;
        sal[tid] = expf(g);
        q2 = qv * qv;
        k2 = kv * kv;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        q2 += __shfl_xor_sync(0xffffffffu, q2, o);
        k2 += __shfl_xor_sync(0xffffffffu, k2, o);
    }
    if (lane == 0) {
        wsum[0][warp] = q2;
        wsum[1][warp] = k2;
    }
    __syncthreads();
    float tq = 0.f, tk = 0.f;
#pragma unroll
    for (int w = 0; w < DEC_THREADS / 32; w++) {
        tq += wsum[0][w];
        tk += wsum[1][w];
    }
    float rq = rsqrtf(tq + 1e-6f) * a.scale, rk = rsqrtf(tk + 1e-6f);
    float beta = sigmoidf_(bf(a.beta[bh]));

    // decay and prediction p = Sᵀ k̂
    float4 p = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int i = 0; i < KR; i++) {
        int kk = rg * KR + i;
        float al = sal[kk], kn = sk[kk] * rk;
        x[i].x *= al; x[i].y *= al; x[i].z *= al; x[i].w *= al;
        p.x = fmaf(kn, x[i].x, p.x); p.y = fmaf(kn, x[i].y, p.y);
        p.z = fmaf(kn, x[i].z, p.z); p.w = fmaf(kn, x[i].w, p.w);
    }
    *reinterpret_cast<float4 *>(&red[rg][4 * cg]) = p;
    __syncthreads();
    if (tid < V) {
        float s = 0.f;
#pragma unroll
        for (int r = 0; r < RG; r++) s += red[r][tid];
        sr[tid] = beta * (bf(a.v[bh * V + tid]) - s);
    }
    __syncthreads();
    // rank-1 write and read-out o = Sᵀ q̂
    float4 rr = *reinterpret_cast<const float4 *>(&sr[4 * cg]), oo = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int i = 0; i < KR; i++) {
        int kk = rg * KR + i;
        float kn = sk[kk] * rk, qn = sq[kk] * rq;
        x[i].x = fmaf(kn, rr.x, x[i].x); x[i].y = fmaf(kn, rr.y, x[i].y);
        x[i].z = fmaf(kn, rr.z, x[i].z); x[i].w = fmaf(kn, rr.w, x[i].w);
        oo.x = fmaf(qn, x[i].x, oo.x); oo.y = fmaf(qn, x[i].y, oo.y);
        oo.z = fmaf(qn, x[i].z, oo.z); oo.w = fmaf(qn, x[i].w, oo.w);
        *reinterpret_cast<float4 *>(S + (size_t)kk * V + 4 * cg) = x[i];
    }
    *reinterpret_cast<float4 *>(&red[rg][4 * cg]) = oo;   // every read of red above precedes the last barrier
    __syncthreads();
    if (tid < V) {
        float s = 0.f;
#pragma unroll
        for (int r = 0; r < RG; r++) s += red[r][tid];
        a.o[bh * V + tid] = __float2bfloat16(s);
    }
}

extern "C" cudaError_t kda_decode(int B, int H, int K, int V, int gate_mode, float lb, float scale, const bf16 *q,
                                  const bf16 *k, const bf16 *v, const bf16 *f, const bf16 *beta, const float *A_log,
                                  const float *dt_bias, float *state, const int *slots, bf16 *o, cudaStream_t stream) {
    if (B < 0 || H <= 0 || (gate_mode != 0 && gate_mode != 1)) return cudaErrorInvalidValue;
    if (B == 0) return cudaSuccess;
    DecArgs a;
    a.H = H; a.gate_mode = gate_mode; a.lb = lb; a.scale = scale;
    a.q = q; a.k = k; a.v = v; a.f = f; a.beta = beta; a.A_log = A_log; a.dt_bias = dt_bias;
    a.state = state; a.slots = slots; a.o = o;
    unsigned grid = (unsigned)(B * H);
    if (K == 128 && V == 128) kda_decode_kernel<128, 128><<<grid, DEC_THREADS, 0, stream>>>(a);
    else if (K == 64 && V == 64) kda_decode_kernel<64, 64><<<grid, DEC_THREADS, 0, stream>>>(a);
    else if (K == 128 && V == 64) kda_decode_kernel<128, 64><<<grid, DEC_THREADS, 0, stream>>>(a);
    else if (K == 64 && V == 128) kda_decode_kernel<64, 128><<<grid, DEC_THREADS, 0, stream>>>(a);
    else return cudaErrorInvalidValue;
    return cudaGetLastError();
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
