// moe.cu — MoE routing (sigmoid top-k with a selection-only bias), the dispatch plan,
// gather/scatter of token rows, and the gate-weighted combine (the grouped expert GEMMs are in
// moe_gemm.cu).
//
// Everything reads the plan (offsets, row maps) from device memory: no op here waits for
// the device (moe_gather_bwd sizes its sort by the allocated rows N·k, not offsets[E]).
#include "cuda_common.cuh"
#include "ops_math.h"
#include <cub/device/device_radix_sort.cuh>

// ---------------------------------------------------------------------------
// router. One warp per token: lane l holds experts l, l + 32, …; the k + 1 largest of s + bias
// come from k + 1 rounds of a warp arg-max, ties to the lower index (lm_route_token's order: an
// equal value does not move ahead of an earlier one), and the gates as lm_route_token makes them
// (the same sigmoid, the same sums in rank order). A thread per token running lm_route_token
// (its insertion sort in local memory, a chain of dependent loads) took 69 µs per `small` B4
// call, 15 a step; it stays for more than 2048 experts (a lane's 64-bit mask of taken experts).
#define ROUTE_WARPS 4
__global__ static void route_fwd_warp_k(int *idx, float *gate, float *s, float *alpha, const float *z,
                                        const float *bias, int N, int E, int k, float route_scale, int renorm) {
    const int lane = threadIdx.x & 31;
    const long i = (long)blockIdx.x * ROUTE_WARPS + (threadIdx.x >> 5);
    if (i >= N) return;
    const float *zi = z + i * E;
    float *si = s + i * E;
    for (int j = lane; j < E; j += 32) si[j] = lm_sigm(zi[j]);
    __syncwarp();   // lane 0 reads the others' s below
    const int m = k < E ? k + 1 : E;
    unsigned long long taken = 0;   // bit b: expert lane + 32·b chosen
    int top[LM_MAX_TOPK + 1];
    float val[LM_MAX_TOPK + 1];
    for (int t = 0; t < m; t++) {
        float best = -INFINITY;
        int bi = E;
        for (int j = lane, b = 0; j < E; j += 32, b++) {
            if (taken >> b & 1) continue;
            float v = si[j] + (bias ? bias[j] : 0.f);
            if (v != v) v = -INFINITY;   // NaN ranks last, as lm_route_token: a total order, so the lanes agree
            if (v > best || bi == E) { best = v; bi = j; }   // j rises: equal values keep the lower index
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, best, off);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
            if (oi < E && (bi == E || ov > best || (ov == best && oi < bi))) { best = ov; bi = oi; }
        }
        if (bi < E && (bi & 31) == lane) taken |= 1ull << (bi >> 5);
        top[t] = bi;
        val[t] = best;
    }
    if (lane) return;
    alpha[i] = k < E ? val[k] : val[k - 1] - 1;
    float sum = 0;
    for (int t = 0; t < k; t++) sum += si[top[t]];
    for (int t = 0; t < k; t++) {
        idx[i * k + t] = top[t];
        gate[i * k + t] = renorm ? route_scale * (si[top[t]] / sum) : route_scale * si[top[t]];
    }
}
// The same selection with a token's scores in registers: lane l holds experts l + 32b, b < VPL
// (E ≤ 32·VPL), and the k + 1 ≤ MR rounds are unrolled, so that nothing is read back from
// memory and the ranks stay in registers; lane t < k writes rank t. A round's warp arg-max is
// two warp reductions (redux.sync): the largest value as an order-preserving unsigned key,
// then the lowest index among the lanes holding it — the order above (ties to the lower index,
// NaN as −∞ and so below every number). Why: the loop kernel's 5-step shuffle arg-max of
// (value, index) pairs made it issue-bound — 28 µs a `small` B4 call (ncu, session 42:
// SM throughput 73%, DRAM 4% for the scores in registers with that arg-max); with the
// reductions 29.6 → 18.6 µs (ncu at its locked clock, the same kernel otherwise).
__device__ __forceinline__ unsigned route_key(float v) {   // a < b ⇔ key(a) < key(b); −∞ > 0
    if (v == 0.f) v = 0.f;   // −0 as +0: equal values, as the comparisons above see them
    const unsigned u = __float_as_uint(v);
    return u >> 31 ? ~u : u | 0x80000000u;
}
template <int VPL, int MR>
__global__ static void __launch_bounds__(32 * ROUTE_WARPS) route_fwd_reg_k(int *idx, float *gate, float *s, float *alpha,
                                                                        const float *z, const float *bias, int N,
                                                                        int E, int k, float route_scale, int renorm) {
    const int lane = threadIdx.x & 31;
    const long i = (long)blockIdx.x * ROUTE_WARPS + (threadIdx.x >> 5);
    if (i >= N) return;
    float sv[VPL], vv[VPL];   // s and the ranking value s + bias (NaN → −∞)
#pragma unroll
    for (int b = 0; b < VPL; b++) {
        const int j = lane + 32 * b;
        sv[b] = vv[b] = -INFINITY;
        if (j < E) {
            sv[b] = lm_sigm(z[i * E + j]);
            s[i * E + j] = sv[b];
            const float v = sv[b] + (bias ? bias[j] : 0.f);
            vv[b] = v != v ? -INFINITY : v;
        }
    }
    const int m = k < E ? k + 1 : E, ka = k < E ? k : k - 1;
    unsigned taken = 0;   // bit b: expert lane + 32·b chosen
    float sum = 0.f, mine_s = 0.f, al = 0.f;   // sum: Σ s over the k ranks in rank order, as lm_route_token
    int mine = 0;   // lane t < k: rank t's expert (mine_s its s)
#pragma unroll
    for (int t = 0; t < MR; t++) {
        if (t >= m) break;
        unsigned key = 0;   // this lane's best untaken expert: key 0 (below −∞) when it has none
        int bi = 0x7fffffff;
        float bs = 0.f;
#pragma unroll
        for (int b = 0; b < VPL; b++) {   // j rises: equal values keep the lower index
            const int j = lane + 32 * b;
            const unsigned kb = route_key(vv[b]);
            if (j < E && !(taken >> b & 1u) && kb > key) { key = kb; bi = j; bs = sv[b]; }
        }
        const unsigned kmax = __reduce_max_sync(0xffffffffu, key);
        // the winner is its lane's own best: that lane's bi, key kmax, lowest index of the lane
        const int win = (int)__reduce_min_sync(0xffffffffu, key == kmax ? (unsigned)bi : 0x7fffffffu);
        const float ws = __shfl_sync(0xffffffffu, bs, win & 31);
        if ((win & 31) == lane) taken |= 1u << (win >> 5);
        if (t < k) sum += ws;
        if (t < k && t == lane) { mine = win; mine_s = ws; }
        if (t == ka) {   // the value back from its key (route_key is a bijection)
            const float wv = __uint_as_float(kmax >> 31 ? kmax & 0x7fffffffu : ~kmax);
            al = k < E ? wv : wv - 1;
        }
    }
    if (lane == 0) alpha[i] = al;
    if (lane < k) {
        idx[i * k + lane] = mine;
        gate[i * k + lane] = renorm ? route_scale * (mine_s / sum) : route_scale * mine_s;
    }
}

__global__ static void route_fwd_k(int *idx, float *gate, float *s, float *alpha, const float *z, const float *bias,
                                   int N, int E, int k, float route_scale, int renorm) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    lm_route_token(idx + (size_t)i * k, gate + (size_t)i * k, s + (size_t)i * E, alpha + i, z + (size_t)i * E, bias,
                   E, k, route_scale, renorm);
}

void cuda_moe_route_fwd(int *idx, real *gate, real *s, real *alpha, const real *z, const real *bias,
                        int N, int E, int k, real route_scale, int renorm) {
    LM_CHECK(k >= 1 && k <= E && k <= LM_MAX_TOPK, "moe_route: need 1 <= k <= min(E, %d), got k=%d E=%d",
             LM_MAX_TOPK, k, E);
    if (N <= 0) return;
    const unsigned nb = (unsigned)((N + ROUTE_WARPS - 1) / ROUTE_WARPS), nt = 32 * ROUTE_WARPS;
    if (E <= 128 && k + 1 <= 9)   // `small`: top-4 of 80
        route_fwd_reg_k<4, 9><<<nb, nt, 0, lm_cuda_stream()>>>(idx, gate, s, alpha, z, bias, N, E, k, route_scale, renorm);
    else if (E <= 256 && k + 1 <= 9)   // Kimi Linear: top-8 of 256
        route_fwd_reg_k<8, 9><<<nb, nt, 0, lm_cuda_stream()>>>(idx, gate, s, alpha, z, bias, N, E, k, route_scale, renorm);
    else if (E <= 256 && k + 1 <= 17)   // up to top-16 of 256 (K3's 896 experts take the loop kernel)
        route_fwd_reg_k<8, 17><<<nb, nt, 0, lm_cuda_stream()>>>(idx, gate, s, alpha, z, bias, N, E, k, route_scale, renorm);
    else if (E <= 2048)
        route_fwd_warp_k<<<(N + ROUTE_WARPS - 1) / ROUTE_WARPS, 32 * ROUTE_WARPS, 0, lm_cuda_stream()>>>(
            idx, gate, s, alpha, z, bias, N, E, k, route_scale, renorm);
    else
        route_fwd_k<<<(N + 127) / 128, 128, 0, lm_cuda_stream()>>>(idx, gate, s, alpha, z, bias, N, E, k, route_scale,
                                                                   renorm);
    cudaLaunchCheck();
}

__global__ static void route_bwd_k(float *dz, const float *dgate, const float *s, const int *idx, int N, int E, int k,
                                   float route_scale, int renorm) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    const float *si = s + (size_t)i * E, *dg = dgate + (size_t)i * k;
    const int *id = idx + (size_t)i * k;
    float *dzi = dz + (size_t)i * E;
    float sum = 0, dot = 0;
    for (int t = 0; t < k; t++) {
        sum += si[id[t]];
        dot += dg[t] * si[id[t]];
    }
    for (int t = 0; t < k; t++) {
        float st = si[id[t]];
        float ds = renorm ? route_scale / sum * (dg[t] - dot / sum) : route_scale * dg[t];
        dzi[id[t]] += ds * st * (1 - st);
    }
}

void cuda_moe_route_bwd(real *dz, const real *dgate, const real *s, const int *idx,
                        int N, int E, int k, real route_scale, int renorm) {
    if (!dz || N <= 0) return;
    route_bwd_k<<<(N + 127) / 128, 128, 0, lm_cuda_stream()>>>(dz, dgate, s, idx, N, E, k, route_scale, renorm);
    cudaLaunchCheck();
}

// ---------------------------------------------------------------------------
// plan. A stable radix sort of the assignments a = i·k + t by expert gives the dropless
// layout directly (experts in order, tokens increasing inside an expert). Under a
// capacity, an over-full expert keeps the rows whose rank (score descending, ties to the
// lower token) is below the capacity, still listed by token.

__global__ static void plan_hist_k(int *counts, const int *idx, size_t NK, int E) {
    for (size_t a = blockIdx.x * (size_t)blockDim.x + threadIdx.x; a < NK; a += (size_t)gridDim.x * blockDim.x) {
        int e = idx[a];
        if (e >= 0 && e < E) atomicAdd(&counts[e], 1);   // integer counts: exact in any order
    }
}
// off_dl [E+1] dropless offsets; offsets [E+1] after capacity. One block: thread t sums its run
// of ⌈E / threads⌉ experts, a block scan of those sums, then each thread writes its run's
// offsets (integers: exact). Was one thread walking all E: ~9 µs a launch at E = 80 (ncu,
// session 22), a decode step's largest MoE-plan kernel.
#define OFF_THREADS 1024
__device__ __forceinline__ int plan_cap(int c, int capacity) { return capacity >= 0 && c > capacity ? capacity : c; }
// Exclusive prefix sums over the block (≤ 1024 threads, every thread calls) of two per-thread
// values: inclusive scans over each warp, then over the warps' totals. ws: 2 × 32 ints of
// shared memory, read after the last barrier: once per kernel (a second call would need a
// barrier first). Returns the sums of a and of b over the threads before this one.
__device__ static int2 block_excl_scan2(int a, int b, int (*ws)[32]) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int ia = a, ib = b;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int x = __shfl_up_sync(0xffffffffu, ia, o), y = __shfl_up_sync(0xffffffffu, ib, o);
        if (lane >= o) ia += x, ib += y;
    }
    if (lane == 31) ws[0][warp] = ia, ws[1][warp] = ib;
    __syncthreads();
    if (warp == 0) {
        int x = lane < nw ? ws[0][lane] : 0, y = lane < nw ? ws[1][lane] : 0;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int u = __shfl_up_sync(0xffffffffu, x, o), v = __shfl_up_sync(0xffffffffu, y, o);
            if (lane >= o) x += u, y += v;
        }
        if (lane < nw) ws[0][lane] = x, ws[1][lane] = y;
    }
    __syncthreads();
    return make_int2((warp ? ws[0][warp - 1] : 0) + ia - a, (warp ? ws[1][warp - 1] : 0) + ib - b);
}
__global__ static void __launch_bounds__(OFF_THREADS) plan_offsets_k(int *off_dl, int *offsets, const int *counts, int E,
                                                                     int capacity) {
    __shared__ int wsum[2][32];
    const int t = threadIdx.x;
    const int per = (E + blockDim.x - 1) / blockDim.x, e0 = min(E, t * per), e1 = min(E, e0 + per);
    int a = 0, b = 0;
    for (int e = e0; e < e1; e++) {
        const int c = counts[e];
        a += c;
        b += plan_cap(c, capacity);
    }
    const int2 ex = block_excl_scan2(a, b, wsum);
    int sa = ex.x, sb = ex.y;
    if (t == 0) off_dl[0] = offsets[0] = 0;
    for (int e = e0; e < e1; e++) {
        const int c = counts[e];
        off_dl[e + 1] = sa += c;
        offsets[e + 1] = sb += plan_cap(c, capacity);
    }
}
__global__ static void iota_k(int *v, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        v[i] = (int)i;
}
__device__ __forceinline__ bool plan_over(const int *counts, int e, int capacity) {
    return capacity >= 0 && counts[e] > capacity;
}
// rank of each sorted row inside its over-full expert (score desc, then token asc)
__global__ static void plan_rank_k(int *rank, const int *skey, const int *sval, const int *off_dl, const int *counts,
                                   const float *s, size_t NK, int E, int k, int capacity) {
    for (size_t r = blockIdx.x * (size_t)blockDim.x + threadIdx.x; r < NK; r += (size_t)gridDim.x * blockDim.x) {
        int e = skey[r];
        if (!plan_over(counts, e, capacity)) { rank[r] = 0; continue; }
        int tok = sval[r] / k;
        float sr = s[(size_t)tok * E + e];
        int rk = 0;
        for (int q = off_dl[e]; q < off_dl[e + 1]; q++) {
            int tq = sval[q] / k;
            float sq = s[(size_t)tq * E + e];
            rk += sq > sr || (sq == sr && tq < tok);
        }
        rank[r] = rk;
    }
}
__global__ static void plan_place_k(int *row_token, int *slot_row, const int *skey, const int *sval, const int *rank,
                                    const int *off_dl, const int *offsets, const int *counts, size_t NK, int k,
                                    int capacity) {
    for (size_t r = blockIdx.x * (size_t)blockDim.x + threadIdx.x; r < NK; r += (size_t)gridDim.x * blockDim.x) {
        int e = skey[r], a = sval[r], tok = a / k;
        int pos;
        if (!plan_over(counts, e, capacity)) {
            pos = (int)r - off_dl[e];
        } else {
            if (rank[r] >= capacity) { slot_row[a] = -1; continue; }
            pos = 0;
            for (int q = off_dl[e]; q < (int)r; q++) pos += rank[q] < capacity;
        }
        int row = offsets[e] + pos;
        row_token[row] = tok;
        slot_row[a] = row;
    }
}

// The whole plan for a few assignments without a capacity (decode steps) in one block: the
// counts (a thread per expert over the keys in shared memory), the offsets (plan_offsets_k's
// scan), and each assignment's row = its expert's offset + the earlier assignments of that
// expert (the stable order the radix sort gives). The general path is seven launches (two
// memsets, histogram, offsets, iota, the sort, placement): ~40 µs of a B1 step's MoE layer.
#define PLAN_FEW 1024
__global__ static void __launch_bounds__(PLAN_FEW) plan_few_k(int *counts, int *offsets, int *row_token, int *slot_row,
                                                              const int *idx, int NK, int E, int k) {
    __shared__ int key[PLAN_FEW], cnt[PLAN_FEW], off[PLAN_FEW + 1], wsum[2][32];
    const int t = threadIdx.x;
    for (int r = t; r < NK; r += blockDim.x) key[r] = idx[r];
    __syncthreads();
    for (int e = t; e < E; e += blockDim.x) {
        int c = 0;
        for (int r = 0; r < NK; r++) c += key[r] == e;
        cnt[e] = c;
        counts[e] = c;
    }
    __syncthreads();
    // exclusive scan of cnt: thread t sums its run of experts, a block scan of the sums
    const int per = (E + blockDim.x - 1) / blockDim.x, e0 = min(E, t * per), e1 = min(E, e0 + per);
    int a = 0;
    for (int e = e0; e < e1; e++) a += cnt[e];
    int sa = block_excl_scan2(a, 0, wsum).x;
    if (t == 0) off[0] = offsets[0] = 0;
    for (int e = e0; e < e1; e++) off[e + 1] = offsets[e + 1] = sa += cnt[e];
    __syncthreads();
    for (int r = t; r < NK; r += blockDim.x) {
        const int e = key[r];
        if (e < 0 || e >= E) {
            slot_row[r] = -1;
            continue;
        }
        int pos = 0;
        for (int q = 0; q < r; q++) pos += key[q] == e;
        row_token[off[e] + pos] = r / k;
        slot_row[r] = off[e] + pos;
    }
    for (int r = off[E] + t; r < NK; r += blockDim.x) row_token[r] = -1;   // rows no assignment uses
}

void cuda_moe_plan(int *counts, int *offsets, int *row_token, int *slot_row, const int *idx,
                   const real *s, int N, int E, int k, int capacity) {
    const size_t NK = (size_t)N * k;
    cudaStream_t st = lm_cuda_stream();
    if (capacity < 0 && NK > 0 && NK <= PLAN_FEW && E <= PLAN_FEW) {
        const int threads = (int)(NK > (size_t)E ? NK : (size_t)E);
        plan_few_k<<<1, (threads + 31) / 32 * 32, 0, st>>>(counts, offsets, row_token, slot_row, idx, (int)NK, E, k);
        cudaLaunchCheck();
        return;
    }
    cudaCheck(cudaMemsetAsync(counts, 0, (size_t)E * sizeof(int), st));
    if (NK == 0) {
        cudaCheck(cudaMemsetAsync(offsets, 0, (size_t)(E + 1) * sizeof(int), st));
        return;
    }
    int bits = 1;
    while (bits < 31 && (1 << bits) < E) bits++;
    size_t tmp = 0;
    cudaCheck(cub::DeviceRadixSort::SortPairs(NULL, tmp, (const int *)NULL, (int *)NULL, (const int *)NULL,
                                              (int *)NULL, (int)NK, 0, bits, st));
    size_t vb = lm_align256(NK * sizeof(int)), eb = lm_align256((size_t)(E + 1) * sizeof(int));
    char *ws = (char *)lm_cuda_scratch(eb + 4 * vb + lm_align256(tmp));
    int *off_dl = (int *)ws;
    int *vin = (int *)(ws + eb), *skey = (int *)(ws + eb + vb), *sval = (int *)(ws + eb + 2 * vb);
    int *rank = (int *)(ws + eb + 3 * vb);
    void *tws = ws + eb + 4 * vb;
    unsigned g = lm_cuda_blocks(NK, 256);
    if (g > 4096) g = 4096;
    plan_hist_k<<<g, 256, 0, st>>>(counts, idx, NK, E);
    cudaLaunchCheck();
    const int off_threads = E >= OFF_THREADS ? OFF_THREADS : (E + 31) / 32 * 32;
    plan_offsets_k<<<1, off_threads > 0 ? off_threads : 32, 0, st>>>(off_dl, offsets, counts, E, capacity);
    cudaLaunchCheck();
    iota_k<<<g, 256, 0, st>>>(vin, NK);
    cudaLaunchCheck();
    cudaCheck(cub::DeviceRadixSort::SortPairs(tws, tmp, idx, skey, vin, sval, (int)NK, 0, bits, st));
    cudaCheck(cudaMemsetAsync(row_token, 0xff, NK * sizeof(int), st));   // −1 past offsets[E]
    if (capacity >= 0) {
        plan_rank_k<<<g, 256, 0, st>>>(rank, skey, sval, off_dl, counts, s, NK, E, k, capacity);
        cudaLaunchCheck();
    }
    plan_place_k<<<g, 256, 0, st>>>(row_token, slot_row, skey, sval, rank, off_dl, offsets, counts, NK, k, capacity);
    cudaLaunchCheck();
}

// ---------------------------------------------------------------------------
// gather / scatter

__global__ static void gather_fwd_k(float *xp, const float *x, const int *row_token, const int *offsets, int E, int C) {
    const size_t n = (size_t)offsets[E] * C;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t r = e / C, c = e % C;
        xp[e] = x[(size_t)row_token[r] * C + c];
    }
}

void cuda_moe_gather_fwd(real *xp, const real *x, const int *row_token, const int *offsets, int E, int C) {
    if (C <= 0) return;
    gather_fwd_k<<<2048, 256, 0, lm_cuda_stream()>>>(xp, x, row_token, offsets, E, C);   // grid-stride over rows
    cudaLaunchCheck();
}

// dx[row_token[r]] += dxp[r], rows of one token summed in row order (deterministic). The
// sort covers all R allocated rows: the unused ones (row_token −1) sort last and add
// nothing, so offsets[E] never has to come back to the host.
void cuda_moe_gather_bwd(real *dx, const real *dxp, const int *row_token, const int *offsets, int E, int C, int R) {
    if (!dx || C <= 0) return;
    lm_cuda_scatter_add_rows(dx, row_token, dxp, R, C, 31);
}

// ---------------------------------------------------------------------------
// combine

// y [N, C] += Σ_slot gate · yp[slot_row] in slot order (gate NULL: 1; the experts op's
// backward sums dx += Σ_slot dxp[slot_row] so); T = float (Cv = C), or float4: four
// channels per thread, 16-byte loads and stores (Cv = C / 4; the same additions in the same order)
// (assign: y = the sum, its old values not read)
template <typename T>
__global__ static void combine_fwd_k(T *y, const T *yp, const float *gate, const int *slot_row, int N, int k, int Cv,
                                     int assign) {
    size_t n = (size_t)N * Cv;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t i = e / Cv, c = e % Cv;
        T acc = assign ? T{} : y[e];
        for (int t = 0; t < k; t++) {
            int r = slot_row[i * k + t];
            if (r < 0) continue;
            axpy(acc, gate ? gate[i * k + t] : 1.0f, yp[(size_t)r * Cv + c]);
        }
        y[e] = acc;
    }
}

void lm_cuda_moe_combine(real *y, const real *yp, const real *gate, const int *slot_row, int N, int k, int C,
                         int assign) {
    size_t n = (size_t)N * C;
    if (!n) return;
    if (C % 4 == 0 && lm_aligned16({y, yp})) {   // Kimi shapes (bench_moe): 0.686 → 0.396 ms
        combine_fwd_k<float4><<<lm_cuda_blocks(n / 4, 256), 256, 0, lm_cuda_stream()>>>(
            (float4 *)y, (const float4 *)yp, gate, slot_row, N, k, C / 4, assign);
    } else {
        combine_fwd_k<float><<<lm_cuda_blocks(n, 256), 256, 0, lm_cuda_stream()>>>(y, yp, gate, slot_row, N, k, C,
                                                                                  assign);
    }
    cudaLaunchCheck();
}
void cuda_moe_combine_fwd(real *y, const real *yp, const real *gate, const int *slot_row, int N, int k, int C) {
    lm_cuda_moe_combine(y, yp, gate, slot_row, N, k, C, 0);
}

// bf16 yp (the experts op's kept form, moe_experts.cu): eight channels a thread, one 16-byte
// load of yp per slot; the same additions in the same order as combine_fwd_k's. C8 = C / 8.
// vec: y 16-byte aligned (the same sums either way)
__global__ static void combine_fwd_bf16_k(float *y, const __nv_bfloat16 *yp, const float *gate, const int *slot_row,
                                          int N, int k, int C8, int assign, int vec) {
    const size_t n = (size_t)N * C8;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        const size_t i = e / C8, c = 8 * (e % C8), C = 8 * (size_t)C8;
        float *yo = y + i * C + c;
        float4 a = assign ? make_float4(0.f, 0.f, 0.f, 0.f) : ld4v(yo, vec), b = assign ? a : ld4v(yo + 4, vec);
        for (int t = 0; t < k; t++) {
            const int r = slot_row[i * k + t];
            if (r < 0) continue;
            const float g = gate ? gate[i * k + t] : 1.0f;
            const __nv_bfloat16 *src = yp + (size_t)r * C + c;
            axpy(a, g, ld4_bf16(src));
            axpy(b, g, ld4_bf16(src + 4));
        }
        st4v(yo, a, vec);
        st4v(yo + 4, b, vec);
    }
}
void lm_cuda_moe_combine_bf16(float *y, const __nv_bfloat16 *yp, const float *gate, const int *slot_row, int N, int k,
                              int C, int assign) {
    LM_CHECK(C % 8 == 0 && lm_aligned16({yp}), "combine (bf16 rows): C %% 8 and 16-byte aligned rows");
    const size_t n = (size_t)N * C / 8;
    if (!n) return;
    combine_fwd_bf16_k<<<lm_cuda_blocks(n, 256), 256, 0, lm_cuda_stream()>>>(y, yp, gate, slot_row, N, k, C / 8,
                                                                            assign, lm_aligned16({y}));
    cudaLaunchCheck();
}

// dyp[row] += gate · dy[i] (each row serves exactly one (token, slot))
__global__ static void combine_bwd_dyp_k(float *dyp, const float *dy, const float *gate, const int *slot_row, int N,
                                         int k, int C) {
    size_t n = (size_t)N * k * C;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t it = e / C, c = e % C;
        int r = slot_row[it];
        if (r < 0) continue;
        dyp[(size_t)r * C + c] += gate[it] * dy[(it / k) * C + c];
    }
}
// dgate[i, t] += <dy[i], yp[row]>, one warp per (token, slot)
__global__ static void combine_bwd_dgate_k(float *dgate, const float *dy, const float *yp, const int *slot_row, int N,
                                           int k, int C) {
    const int lane = threadIdx.x & 31;
    const long it = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (it >= (long)N * k) return;
    int r = slot_row[it];
    if (r < 0) return;
    const float *a = dy + (size_t)(it / k) * C, *b = yp + (size_t)r * C;
    float s = 0.0f;
    for (int c = lane; c < C; c += 32) s += a[c] * b[c];
    s = warp_sum(s);
    if (lane == 0) dgate[it] += s;
}

// the same with bf16 yp (C % 8 == 0, yp 16-byte aligned; vec: dy too): eight channels a lane
__global__ static void combine_dgate_bf16_k(float *dgate, const float *dy, const __nv_bfloat16 *yp, const int *slot_row,
                                            int N, int k, int C, int vec) {
    const int lane = threadIdx.x & 31;
    const long it = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (it >= (long)N * k) return;
    const int r = slot_row[it];
    if (r < 0) return;
    const float *a = dy + (size_t)(it / k) * C;
    const __nv_bfloat16 *b = yp + (size_t)r * C;
    float s = 0.0f;
    for (int c = 8 * lane; c < C; c += 256)
        s += dot4(ld4v(a + c, vec), ld4_bf16(b + c)) + dot4(ld4v(a + c + 4, vec), ld4_bf16(b + c + 4));
    s = warp_sum(s);
    if (lane == 0) dgate[it] += s;
}
void lm_cuda_moe_dgate_bf16(float *dgate, const float *dy, const __nv_bfloat16 *yp, const int *slot_row, int N, int k,
                            int C) {
    LM_CHECK(C % 8 == 0 && lm_aligned16({yp}), "combine backward (bf16 rows): C %% 8 and 16-byte aligned rows");
    const long w = (long)N * k;
    if (w <= 0) return;
    combine_dgate_bf16_k<<<(unsigned)((w + 7) / 8), 256, 0, lm_cuda_stream()>>>(dgate, dy, yp, slot_row, N, k, C,
                                                                              lm_aligned16({dy}));
    cudaLaunchCheck();
}

void cuda_moe_combine_bwd(real *dyp, real *dgate, const real *dy, const real *yp, const real *gate,
                          const int *slot_row, int N, int k, int C) {
    if (N <= 0 || k <= 0 || C <= 0) return;
    if (dyp) {
        size_t n = (size_t)N * k * C;
        combine_bwd_dyp_k<<<lm_cuda_blocks(n, 256), 256, 0, lm_cuda_stream()>>>(dyp, dy, gate, slot_row, N, k, C);
        cudaLaunchCheck();
    }
    if (dgate) {
        long w = (long)N * k;
        combine_bwd_dgate_k<<<(unsigned)((w + 7) / 8), 256, 0, lm_cuda_stream()>>>(dgate, dy, yp, slot_row, N, k, C);
        cudaLaunchCheck();
    }
}
