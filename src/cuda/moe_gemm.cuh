// moe_gemm.cuh — the bf16-operand grouped GEMM kernels (moe_gemm_wg.cu, moe_gemm_tma.cu) that
// moe_gemm.cu's ops dispatch to.
#ifndef LM_MOE_GEMM_CUH
#define LM_MOE_GEMM_CUH
#include <cuda_bf16.h>

// Tile configurations (moe_gemm_wg.cu): BIG 128 × 256 tiles, one CTA per SM; NARROW
// 128 × 128, one CTA per SM, a deeper copy pipeline; PAIR 128 × 128, two CTAs per SM.
enum { LM_WG_BIG = 1, LM_WG_NARROW = 2, LM_WG_PAIR = 3 };
int lm_wg_tile_cols(int cfg);   // N columns per tile

// dinp 0: Out [R,N] = per expert e: rows [offsets[e], offsets[e+1]) of A [R,K] times
// B_e [N,K]ᵀ (B_e = B + e·N·K). dinp 1: Out [R,N] += A_rows · B_e with B_e [K,N].
// tile_start [E+1]: the prefix sum of each expert's ceil(rows/128) · ceil(N/lm_wg_tile_cols(cfg))
// tiles (device memory). Needs K, N multiples of 8 and 16-byte aligned A, B, Out.
void lm_wg_grouped_rows(float *Out, const __nv_bfloat16 *A, const __nv_bfloat16 *B, const int *offsets,
                        const int *tile_start, int E, int N, int K, int dinp, int cfg);
// The same products with TMA copies and a warp-specialized pipeline (moe_gemm_tma.cu):
// 128 × lm_wt_tile_cols() tiles; R = rows allocated in A (the copies' bounds). A second part
// (A2, B2, depth K2 > 0; dinp only) continues the k range: Out (+)= A·B_e + A2·B2_e.
// acc 0: Out = (else +=). out_bf16: Out is bf16 [R,N], written rounded (not with acc).
int lm_wt_tile_cols(void);
void lm_wt_grouped_rows(void *Out, const __nv_bfloat16 *A, const __nv_bfloat16 *B, const __nv_bfloat16 *A2,
                        const __nv_bfloat16 *B2, const int *offsets, const int *tile_start, int E, int R, int N, int K,
                        int K2, int dinp, int acc, int out_bf16);
// dW [E,M,N] += per expert Σ over its rows r of A[r,m] · B[r,n]; A [R,M], B [R,N]; assign:
// dW = (zeros for experts without rows; dW's contents on entry do not matter).
// Needs M, N multiples of 8 and 16-byte aligned pointers.
void lm_wg_grouped_dw(float *dW, const __nv_bfloat16 *A, const __nv_bfloat16 *B, const int *offsets, int E, int M,
                      int N, int cfg, int assign);
// The same with TMA copies and a warp-specialized pipeline (moe_gemm_tma.cu); R = rows
// allocated in A, A2 and B (the copies' bounds). dW2, A2 (may be NULL): a second weight of the
// same shape sharing B, in the same launch.
void lm_wt_grouped_dw(float *dW, float *dW2, const __nv_bfloat16 *A, const __nv_bfloat16 *A2, const __nv_bfloat16 *B,
                      const int *offsets, int E, int R, int M, int N, int assign);

// A row-product tile of the grouped kernels: expert e, its rows from offsets[e] + m0 (rows =
// the expert's row count), columns from n0.
struct GroupedTile {
    int e, o0, rows, m0, n0;
};
// tile → its GroupedTile for TM × TN tiles. tile_start [E+1] is the prefix sum of each
// expert's ceil(rows/TM) · ceil(N/TN) tiles; an expert's tiles run m-fastest, so concurrent
// CTAs share its weight's column slab in L2.
#ifdef __CUDACC__
__device__ __forceinline__ GroupedTile grouped_tile(int tile, const int *offsets, const int *tile_start, int E, int TM,
                                                    int TN) {
    int lo = 0, hi = E;   // last e with tile_start[e] <= tile (empty experts share starts)
    while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (tile_start[mid] <= tile) lo = mid; else hi = mid;
    }
    GroupedTile t;
    t.e = lo;
    const int local = tile - tile_start[lo];
    t.o0 = offsets[lo];
    t.rows = offsets[lo + 1] - t.o0;
    const int mtn = (t.rows + TM - 1) / TM;
    t.m0 = (local % mtn) * TM;
    t.n0 = (local / mtn) * TN;
    return t;
}
#endif
// moe_gemm.cu's dispatch of the products above, for ops that hold bf16 operands themselves
// (moe_experts.cu). lm_moe_bf16_kernel: the kernel for a product of inner width C and OC
// outputs under the current modes, for one use (LM_MOE_USE_*), or 0 when such a product takes
// an fp32-operand kernel. The rest as lm_wg_grouped_rows / lm_wg_grouped_dw, the tile list ts
// [E+1] made by lm_moe_bf16_schedule for Out's N columns. overwrite (with dinp): Out's
// contents on entry do not matter and the product replaces them (the TMA kernel writes; the
// others add, so Out is zeroed first). lm_moe_bf16_rows2: Out (+)= A·B_e + A2·B2_e (inner
// widths K, K2), one product where the kernel takes two parts. out_bf16: Out is bf16 [R,N],
// written (forward, or overwrite) — only where lm_moe_bf16_out_ok(kern) (the TMA kernel);
// else Out is fp32.
enum { LM_MOE_USE_FWD, LM_MOE_USE_DINP, LM_MOE_USE_DINP_ZEROED, LM_MOE_USE_DW };
int lm_moe_bf16_kernel(int C, int OC, int aligned, int use);
int lm_moe_bf16_out_ok(int kern);
void lm_moe_bf16_schedule(int *ts, const int *offsets, int E, int N, int kern);
void lm_moe_bf16_rows(int kern, void *Out, const __nv_bfloat16 *A, const __nv_bfloat16 *B, const int *offsets,
                      const int *ts, int E, int R, int N, int K, int dinp, int overwrite, int out_bf16);
void lm_moe_bf16_rows2(int kern, void *Out, const __nv_bfloat16 *A, const __nv_bfloat16 *B, const __nv_bfloat16 *A2,
                       const __nv_bfloat16 *B2, const int *offsets, const int *ts, int E, int R, int N, int K, int K2,
                       int overwrite, int out_bf16);
// dW [E,OC,C] (+)= per expert doutᵀ · inp over its rows (R allocated); dW_b, dout_b (may be
// NULL): a second weight sharing inp, one launch where the kernel takes two
void lm_moe_bf16_dw(int kern, float *dW, const __nv_bfloat16 *dout, float *dW_b, const __nv_bfloat16 *dout_b,
                    const __nv_bfloat16 *inp, const int *offsets, int E, int R, int OC, int C, int assign);

#endif
