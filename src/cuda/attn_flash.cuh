// attn_flash.cuh — between the flash-attention host code (attn_flash.cu) and the wgmma forward
// (attn_flash_wg.cu). Pointers are device pointers; bf16 tensors are the rounded copies.
#ifndef LM_ATTN_FLASH_CUH
#define LM_ATTN_FLASH_CUH
#include <cuda_bf16.h>

// the causal forward on wgmma for Dqk/Dv ∈ {192/128, 128/128, 64/64}: o [B,T,H,Dv] fp32, lse
// [B,H,T] (may be NULL), q [B,T,H,Dqk], k [B,P+T,H,Dqk], v [B,P+T,H,Dv]. Returns 0 (doing
// nothing) for other dims or when lm_cuda_fa_wg() is 0.
int cuda_attn_flash_wg_fwd(float *o, float *lse, const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                           const __nv_bfloat16 *v, int B, int T, int P, int H, int Dqk, int Dv, float scale);
// the backward on wgmma for the same dims (attn_flash.cu's fa_bwd contract: dq, dk, dv fp32,
// accumulated, any may be NULL; lse, D [B,H,T]). Returns 0 as above.
int cuda_attn_flash_wg_bwd(float *dq, float *dk, float *dv, const __nv_bfloat16 *d_o, const __nv_bfloat16 *q,
                           const __nv_bfloat16 *k, const __nv_bfloat16 *v, const float *lse, const float *D, int B,
                           int T, int H, int Dqk, int Dv, float scale);
#endif
