// attn_flash.cuh — between the flash-attention host code and mma.sync kernels (attn_flash.cu)
// and the wgmma kernels (attn_flash_wg.cu): the device helpers both use, and the wgmma entry
// points. Pointers are device pointers; bf16 tensors are the rounded copies.
#ifndef LM_ATTN_FLASH_CUH
#define LM_ATTN_FLASH_CUH
#include <cuda_bf16.h>
#include <stdint.h>

#define FA_LOG2E 1.4426950408889634f

// two floats as packed bf16 (low half first): an mma/wgmma A or B register
__device__ __forceinline__ uint32_t fa_pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}
// 2^x (approximate, like the hardware softmax of every flash kernel); 2^−inf = 0
__device__ __forceinline__ float fa_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// the causal forward on wgmma for Dqk/Dv ∈ {192/128, 128/128, 64/64}: o [B,T,H,Dv] fp32, lse
// [B,H,T] (may be NULL), q [B,T,H,Dqk], k [B,P+T,H,Dqk], v [B,P+T,H,Dv]. Returns 0 (doing
// nothing) for other dims or when lm_cuda_fa_wg() is 0.
int cuda_attn_flash_wg_fwd(float *o, float *lse, const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                           const __nv_bfloat16 *v, int B, int T, int P, int H, int Dqk, int Dv, float scale);
// the same forward with a TMA producer warp and ping-ponged warpgroups (attn_flash_ws.cu), for
// the same dims (0 for others)
int cuda_attn_flash_ws_fwd(float *o, float *lse, const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                           const __nv_bfloat16 *v, int B, int T, int P, int H, int Dqk, int Dv, float scale);
// dQ alone on that pipeline (the backward's dq, as cuda_attn_flash_wg_bwd's); 0 for other dims
int cuda_attn_flash_ws_dq(float *dq, const __nv_bfloat16 *d_o, const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                          const __nv_bfloat16 *v, const float *lse, const float *D, int B, int T, int H, int Dqk,
                          int Dv, float scale, int assign);
// dK, dV alone on that pipeline (as cuda_attn_flash_wg_bwd's; either may be NULL)
int cuda_attn_flash_ws_dkdv(float *dk, float *dv, const __nv_bfloat16 *d_o, const __nv_bfloat16 *q,
                            const __nv_bfloat16 *k, const __nv_bfloat16 *v, const float *lse, const float *D, int B,
                            int T, int H, int Dqk, int Dv, float scale, int assign);
// the backward on wgmma for the same dims (attn_flash.cu's fa_bwd contract: dq, dk, dv fp32,
// accumulated (assign: written), any may be NULL; lse, D [B,H,T]). Returns 0 as above.
int cuda_attn_flash_wg_bwd(float *dq, float *dk, float *dv, const __nv_bfloat16 *d_o, const __nv_bfloat16 *q,
                           const __nv_bfloat16 *k, const __nv_bfloat16 *v, const float *lse, const float *D, int B,
                           int T, int H, int Dqk, int Dv, float scale, int assign);
#endif
