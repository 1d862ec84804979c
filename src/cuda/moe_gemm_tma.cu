// moe_gemm_tma.cu — the row-grouped expert GEMMs (forward and input gradient) with TMA copies
// and a warp-specialized pipeline (sm_90a): the forward's kernel in moe_gemm.cu (auto, or
// LM_MOE_GEMM=tma, which also takes the input gradient).
//
//   fwd:  Out [R,N]  = per expert e: rows [offsets[e], offsets[e+1]) of A [R,K] · B_e [N,K]ᵀ
//   dinp: Out [R,N] += A_rows · B_e with B_e [K,N] (the weights as stored, read MN-major)
//   bf16 operands, fp32 accumulation and output.
//
// Why: the cp.async kernels of moe_gemm_wg.cu stall on a CTA-wide barrier per k slice (ncu:
// tensor pipes active ~50% in the forward). Here one producer thread issues TMA copies of
// whole tiles (the hardware applies the 128-byte swizzle) and per ring slot two mbarriers
// replace the barrier: `full` completes when the slot's bytes have landed, `empty` when both
// consumer warpgroups' multiplies of the slot are done. 288 threads: warps 0–7 are two
// consumer warpgroups (64 rows each of a 128 × 256 tile, 128 fp32 accumulators per thread),
// warp 8 is the producer; one CTA per SM, persistent over moe_gemm.cu's tile list, and the
// producer runs up to STAGES slices ahead — across tiles, so the next tile's copies overlap
// this tile's epilogue.
//
// Rows past an expert's end and columns past N are read from the neighbouring expert (or
// zero-filled past the tensor's end) and never stored; k past K is zero-filled in A, so the
// neighbouring data it meets in B adds nothing — unless that data is Inf or NaN (0 · Inf is
// NaN): a non-finite weight of expert e+1 can then reach expert e's input gradient (only
// when K is not a multiple of 64; the cp.async kernels zero-fill both operands).
#include "cuda_common.cuh"
#include "moe_gemm.cuh"
#include "wgmma.cuh"
#include "mbarrier.cuh"
#include <cuda.h>
#include <cudaTypedefs.h>

#define WT_M 128
#define WT_N 256
#define WT_K 64
#define WT_STAGES 4
#define WT_THREADS 288   // 2 consumer warpgroups + 1 producer warp
#define WT_A_BYTES (WT_M * WT_K * 2)
#define WT_B_BYTES (WT_N * WT_K * 2)
#define WT_STAGE (WT_A_BYTES + WT_B_BYTES)
#define WT_SMEM (WT_STAGES * WT_STAGE + 1024 + 2 * WT_STAGES * 8)

// ---- TMA (PTX); the mbarriers are in mbarrier.cuh ----
// 2-D tile copy global → shared: box at (c0 inner, c1 outer) of the tensor map, completion
// counted in bytes on `bar`
__device__ __forceinline__ void tma_2d(uint32_t dst, const CUtensorMap *map, int c0, int c1, uint32_t bar) {
    WG_ASM("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n"
           ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1)
           : "memory");
}

// DINP: B MN-major (map over W as [E·K rows, N]) and Out +=; else B K-major (map over W as
// [E·N rows, K]) and Out =. mapA over A [R rows, K].
template <bool DINP>
__global__ static void __launch_bounds__(WT_THREADS, 1)
    wt_rows_k(const __grid_constant__ CUtensorMap mapA, const __grid_constant__ CUtensorMap mapB, float *Out,
              const int *offsets, const int *tile_start, int E, int N, int K) {
    extern __shared__ uint8_t wt_raw[];
    const uint32_t ring = ((uint32_t)__cvta_generic_to_shared(wt_raw) + 1023u) & ~1023u;
    const uint32_t full0 = ring + WT_STAGES * WT_STAGE, empty0 = full0 + WT_STAGES * 8;
    const int tid = threadIdx.x, warp = tid >> 5;
    if (tid == 0) {
        for (int s = 0; s < WT_STAGES; s++) {
            mb_init(full0 + 8 * s, 1);    // the producer's expect_tx arrival (+ the bytes)
            mb_init(empty0 + 8 * s, 2);   // one arrival per consumer warpgroup
        }
        mb_init_fence();
    }
    __syncthreads();
    const int total = tile_start[E], KT = (K + WT_K - 1) / WT_K;

    if (warp == 8) {   // producer
        if ((tid & 31) != 0) return;
        int slot = 0, phase = 0;
        for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
            const GroupedTile t = grouped_tile(tile, offsets, tile_start, E, WT_M, WT_N);
            const int e = t.e, o0 = t.o0, m0 = t.m0, n0 = t.n0;
            for (int kt = 0; kt < KT; kt++) {
                mb_wait(empty0 + 8 * slot, phase ^ 1);
                const uint32_t sa = ring + slot * WT_STAGE, sb = sa + WT_A_BYTES, full = full0 + 8 * slot;
                mb_expect_tx(full, WT_STAGE);
                tma_2d(sa, &mapA, kt * WT_K, o0 + m0, full);
                if (DINP) {   // four 64-wide n blocks of 64 k rows (8 KB each)
#pragma unroll
                    for (int mb = 0; mb < WT_N / 64; mb++)
                        tma_2d(sb + mb * 8192, &mapB, n0 + 64 * mb, e * K + kt * WT_K, full);
                } else {
                    tma_2d(sb, &mapB, kt * WT_K, e * N + n0, full);
                }
                if (++slot == WT_STAGES) { slot = 0; phase ^= 1; }
            }
        }
        return;
    }

    // consumers: warpgroup wg multiplies rows 64·wg .. 64·wg+63 of each tile
    const int wg = warp >> 2;
    const bool leader = (tid & 127) == 0;
    int slot = 0, phase = 0;
    float acc[WT_N / 2];
    for (int tile = blockIdx.x; tile < total; tile += gridDim.x) {
        const GroupedTile t = grouped_tile(tile, offsets, tile_start, E, WT_M, WT_N);
        const int o0 = t.o0, rows = t.rows, m0 = t.m0, n0 = t.n0;
        int prev = -1;
        for (int kt = 0; kt < KT; kt++) {
            mb_wait(full0 + 8 * slot, phase);
            const uint32_t sa = ring + slot * WT_STAGE, sb = sa + WT_A_BYTES;
            wg_fence();
#pragma unroll
            for (int j = 0; j < WT_K / 16; j++) {
                const uint64_t da = wb_desc(sa + wg * 64 * 128 + j * 32, 16, 1024);
                const uint64_t db = DINP ? wb_desc(sb + 2 * j * 1024, 8192, 1024) : wb_desc(sb + j * 32, 16, 1024);
                wg_mma_n256<0, DINP ? 1 : 0>(acc, da, db, kt > 0 || j > 0);
            }
            wg_commit();
            wg_wait<1>();   // the previous slice's multiply is done: its slot can be refilled
            if (prev >= 0 && leader) mb_arrive(empty0 + 8 * prev);
            prev = slot;
            if (++slot == WT_STAGES) { slot = 0; phase ^= 1; }
        }
        wg_wait<0>();
        if (prev >= 0 && leader) mb_arrive(empty0 + 8 * prev);
        // epilogue (accumulator layout as in moe_gemm_wg.cu); dinp adds to the fp32 output,
        // its old values loaded 8 at a time before their stores (182 TFLOP/s at Kimi shapes;
        // 189 one at a time — both below moe_gemm_wg.cu's two-CTA kernel, which auto uses)
        const int w = (tid & 127) >> 5, l = tid & 31, M = rows - m0, NN = N - n0;
        float *C = Out + (long)(o0 + m0) * N + n0;
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            const int m = wg * 64 + w * 16 + (l >> 2) + 8 * hf;
            if (m >= M) continue;
            float *crow = C + (long)m * N;
#pragma unroll
            for (int i0 = 0; i0 < WT_N / 8; i0 += 8) {
                float2 old[8];
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    const int n = 8 * (i0 + u) + 2 * (l & 3);
                    old[u] = DINP && n < NN ? *reinterpret_cast<const float2 *>(crow + n) : make_float2(0.0f, 0.0f);
                }
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    const int n = 8 * (i0 + u) + 2 * (l & 3);
                    if (n >= NN) continue;
                    const int r = 4 * (i0 + u) + 2 * hf;
                    *reinterpret_cast<float2 *>(crow + n) = make_float2(acc[r] + old[u].x, acc[r + 1] + old[u].y);
                }
            }
        }
    }
}

// ---- host ----
static PFN_cuTensorMapEncodeTiled_v12000 wt_encoder(void) {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = NULL;
    if (!fn) {
        cudaDriverEntryPointQueryResult q;
        cudaCheck(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&fn, 12000, cudaEnableDefault,
                                                   &q));
        LM_CHECK(q == cudaDriverEntryPointSuccess && fn, "cuTensorMapEncodeTiled is not available from the driver");
    }
    return fn;
}
// bf16 matrix [outer, inner] (row stride inner), boxes of box_outer × box_inner, 128-byte swizzle
static CUtensorMap wt_map(const __nv_bfloat16 *base, long inner, long outer, int box_inner, int box_outer) {
    CUtensorMap m;
    cuuint64_t dims[2] = {(cuuint64_t)inner, (cuuint64_t)outer}, strides[1] = {(cuuint64_t)inner * 2};
    cuuint32_t box[2] = {(cuuint32_t)box_inner, (cuuint32_t)box_outer}, es[2] = {1, 1};
    CUresult r = wt_encoder()(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)base, dims, strides, box, es,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    LM_CHECK(r == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed (%d) for a %ld x %ld bf16 matrix", (int)r, outer, inner);
    return m;
}

int lm_wt_tile_cols(void) { return WT_N; }

void lm_wt_grouped_rows(float *Out, const __nv_bfloat16 *A, const __nv_bfloat16 *B, const int *offsets,
                        const int *tile_start, int E, int R, int N, int K, int dinp) {
    LM_CHECK(K > 0 && N > 0 && R > 0, "grouped GEMM (TMA): empty operand (R %d, N %d, K %d)", R, N, K);
    static int ready[2] = {0, 0};
    const int sms = lm_cuda_num_sms();
    const CUtensorMap ma = wt_map(A, K, R, WT_K, WT_M);
    // B: dinp, W as [E·K rows, N] in 64 × 64 boxes (n blocks); fwd, W as [E·N rows, K]
    const CUtensorMap mb = dinp ? wt_map(B, N, (long)E * K, 64, WT_K) : wt_map(B, K, (long)E * N, WT_K, WT_N);
    void (*kern)(const CUtensorMap, const CUtensorMap, float *, const int *, const int *, int, int, int) =
        dinp ? wt_rows_k<true> : wt_rows_k<false>;
    if (!ready[dinp != 0]) {
        cudaCheck(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, WT_SMEM));
        ready[dinp != 0] = 1;
    }
    kern<<<sms, WT_THREADS, WT_SMEM, lm_cuda_stream()>>>(ma, mb, Out, offsets, tile_start, E, N, K);
    cudaLaunchCheck();
}
