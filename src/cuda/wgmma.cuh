// wgmma.cuh — Hopper warpgroup MMA (wgmma.mma_async) on bf16 operands in shared memory with
// the 128-byte swizzle, shared by the grouped GEMM kernels (moe_gemm_wg.cu, moe_gemm_tma.cu)
// and the flash attention (attn_flash_wg.cu).
//
// Shared-memory layouts the descriptors below describe (all 1024-byte aligned):
//   K-major operand, ROWS × 64 k: row r is 128 bytes at r·128, its 16-byte chunk c at
//     chunk c ^ (r & 7); descriptor LBO 16 (unused), SBO 1024 (8-row groups); a k16 step
//     advances the start by 32 bytes.
//   MN-major operand, 64 k × ROWS: "atoms" of 8 k rows × 64 m (n) values, 128 bytes per k
//     row, chunk c at c ^ (k & 7); LBO = the byte step between 64-wide m (n) blocks, SBO =
//     the byte step between 8-row k groups (checked on the H200: the exchanged assignment
//     fails the tests); a k16 step advances the start by 2·SBO.
#ifndef LM_WGMMA_CUH
#define LM_WGMMA_CUH
#include <cuda_bf16.h>
#include <stdint.h>

// wgmma and its fences exist only in the arch-specific sm_90a target; nvcc 13 also runs a
// generic compute_90 pass for -arch=sm_90a, where these compile to a trap (never run)
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WG_ASM(...) asm volatile(__VA_ARGS__)
#else
#define WG_ASM(...) __trap()
#endif
__device__ __forceinline__ void wg_fence() { WG_ASM("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { WG_ASM("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wg_wait() {
    WG_ASM("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// cp.async writes are generic-proxy writes; wgmma reads shared memory through the async proxy
__device__ __forceinline__ void wg_fence_proxy() { WG_ASM("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// shared-memory matrix descriptor, 128-byte swizzle: start, LBO, SBO (bytes)
__device__ __forceinline__ uint64_t wb_desc(uint32_t saddr, int lbo, int sbo) {
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32) |
           (1ull << 62);
}

// the same with the 32-byte swizzle (K-major rows of 16 bf16 — one k16 step —, 8-row atoms of
// 256 bytes; SBO the step between 8-row groups, 256 when they are packed)
__device__ __forceinline__ uint64_t wb_desc_sw32(uint32_t saddr, int sbo) {
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | (1ull << 16) | ((uint64_t)(sbo >> 4) << 32) | (3ull << 62);
}

// a warpgroup's register budget (setmaxnreg): a producer warpgroup gives its registers to the
// consumers (a CTA of 384 threads starts at 168 each)
template <int N> __device__ __forceinline__ void wg_setmaxnreg_dec() {
    WG_ASM("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> __device__ __forceinline__ void wg_setmaxnreg_inc() {
    WG_ASM("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
// The CTA's roles: the warpgroup from warp nc on (the last) gives its registers to the consumer
// warps 0 .. nc − 1 and its first thread runs produce(); true in the consumer warps
template <class F> __device__ __forceinline__ bool wg_consumer(int nc, F produce) {
    if ((int)(threadIdx.x >> 5) >= nc) {
        wg_setmaxnreg_dec<24>();
        if ((int)threadIdx.x == 32 * nc) produce();
        return false;
    }
    wg_setmaxnreg_inc<240>();
    return true;
}

// ---- cp.async tile copies into those layouts (every thread of the CTA takes part) ----
__device__ __forceinline__ void wg_cp16(uint32_t s, const void *g, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(g), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void wg_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// waits until at most N of this thread's committed groups are still in flight
template <int N> __device__ __forceinline__ void wg_cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// K-major tile, ROWS rows × 64 k: element (r, k) at g[r·ld + k]; row r is swizzle row r
// (atom r/8). Valid r < nr, k < nk (k in whole 8-element chunks); the rest reads as zero.
// NTHR threads (tid < NTHR) share the copies.
template <int ROWS, int NTHR>
__device__ __forceinline__ void wg_load_kmaj(uint32_t s, const __nv_bfloat16 *g, long ld, int nr, int nk, int tid) {
    static_assert(ROWS * 8 % NTHR == 0, "whole rounds of 16-byte copies");
#pragma unroll
    for (int it = 0; it < ROWS * 8 / NTHR; it++) {
        const int l = tid + it * NTHR, r = l >> 3, c = l & 7;
        const bool v = r < nr && 8 * c < nk;
        wg_cp16(s + r * 128 + ((c ^ (r & 7)) << 4), v ? g + (long)r * ld + 8 * c : g, v);
    }
}
// MN-major tile, ROWS (m or n) × 64 k: element (r, k) at g[k·ld + r]; k row κ, values
// 64j..64j+63 form swizzle row κ & 7 of atom (κ/8)·(ROWS/64) + j
template <int ROWS, int NTHR>
__device__ __forceinline__ void wg_load_mn(uint32_t s, const __nv_bfloat16 *g, long ld, int nr, int nk, int tid) {
    constexpr int CPR = ROWS / 8;   // 16-byte chunks per k row
    static_assert(ROWS * 8 % NTHR == 0, "whole rounds of 16-byte copies");
#pragma unroll
    for (int it = 0; it < ROWS * 8 / NTHR; it++) {
        const int l = tid + it * NTHR, kr = l / CPR, c = l % CPR;
        const bool v = kr < nk && 8 * c < nr;
        const int off = ((kr >> 3) * (ROWS / 64) + (c >> 3)) * 1024 + (kr & 7) * 128 + (((c & 7) ^ (kr & 7)) << 4);
        wg_cp16(s + off, v ? g + (long)kr * ld + 8 * c : g, v);
    }
}

// C += (x, y) as one fire-and-forget reduction in L2 instead of a load and a store, so an
// epilogue does not wait for the old values. Where each element is added once per launch
// the sum is the load-add-store's (red flushes subnormal sums to zero; far below bf16 noise).
__device__ __forceinline__ void wg_red_add2(float *p, float x, float y) {
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(p), "f"(x), "f"(y) : "memory");
}
// The two warpgroups' m64 × nWN fp32 accumulators of a 128 × WN tile to C (ld ldc; valid
// rows < M, columns < N): C = acc, or with ACC C += acc by reductions. Register 4i+q of
// warp w (of warpgroup wg), lane l is row 64·wg + 16w + l/4 + 8·(q/2), column 8i + 2·(l%4) + q%2.
template <int WN, bool ACC>
__device__ __forceinline__ void wg_store_acc(const float (&acc)[WN / 2], float *C, long ldc, int M, int N, int tid) {
    const int wg = tid >> 7, w = (tid & 127) >> 5, l = tid & 31;
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int m = wg * 64 + w * 16 + (l >> 2) + 8 * hf;
        if (m >= M) continue;
        float *crow = C + (long)m * ldc;
#pragma unroll
        for (int i = 0; i < WN / 8; i++) {
            const int n = 8 * i + 2 * (l & 3), r = 4 * i + 2 * hf;
            if (n >= N) continue;
            if constexpr (ACC) wg_red_add2(crow + n, acc[r], acc[r + 1]);
            else *reinterpret_cast<float2 *>(crow + n) = make_float2(acc[r], acc[r + 1]);
        }
    }
}

// The same tile rounded to bf16 (C = bf16(acc), written). A quad holds 8 columns of a row per
// i, i.e. 16 bytes in bf16: stored as they lie, each store instruction wrote half sectors (a
// training step's expert GEMMs took 1.2 ms longer than with fp32 outputs, ncu). So over each
// pair of i the quad's 16 columns (one 32-byte sector) are exchanged by shuffles, lane q taking
// columns 4q..4q+3, and written as 8-byte pieces. Needs N % 4 == 0.
template <int WN>
__device__ __forceinline__ void wg_store_bf16(const float (&acc)[WN / 2], __nv_bfloat16 *C, long ldc, int M, int N,
                                              int tid) {
    static_assert(WN % 16 == 0, "pairs of 8-column groups");
    const int wg = tid >> 7, w = (tid & 127) >> 5, l = tid & 31, q = l & 3;
    // lane q's columns 4q, 4q+1 come from quad lane (2q) & 3, 4q+2, 4q+3 from lane (2q+1) & 3,
    // of the pair's first group (q < 2) or second
    const int src0 = (l & ~3) | ((2 * q) & 3), src1 = (l & ~3) | ((2 * q + 1) & 3);
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int m = wg * 64 + w * 16 + (l >> 2) + 8 * hf;
        __nv_bfloat16 *crow = C + (long)m * ldc;
#pragma unroll
        for (int i = 0; i < WN / 8; i += 2) {
            const int r = 4 * i + 2 * hf;
            const __nv_bfloat162 a = __floats2bfloat162_rn(acc[r], acc[r + 1]);       // group i
            const __nv_bfloat162 b = __floats2bfloat162_rn(acc[r + 4], acc[r + 5]);   // group i + 1
            const unsigned ua = *reinterpret_cast<const unsigned *>(&a), ub = *reinterpret_cast<const unsigned *>(&b);
            const unsigned a0 = __shfl_sync(0xffffffffu, ua, src0), a1 = __shfl_sync(0xffffffffu, ua, src1);
            const unsigned b0 = __shfl_sync(0xffffffffu, ub, src0), b1 = __shfl_sync(0xffffffffu, ub, src1);
            const int n = 8 * i + 4 * q;
            if (m < M && n < N) {
                uint2 v;
                v.x = q < 2 ? a0 : b0;
                v.y = q < 2 ? a1 : b1;
                *reinterpret_cast<uint2 *>(crow + n) = v;
            }
        }
    }
}

// the multiplies themselves (m64 × N × k16, A from shared memory or registers): wgmma_ops.cuh

#endif
