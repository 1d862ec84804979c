// ldmatrix.cuh — two or four 8×8 bf16 tiles from shared memory into mma fragments by one instruction
// (ldmatrix), shared by the flash attention and the KDA kernels. Lane l gives the address of
// row l % 8 of tile l / 8; every row address must be 16-byte aligned.
#ifndef LM_CUDA_LDMATRIX_CUH
#define LM_CUDA_LDMATRIX_CUH
#include <cuda_bf16.h>
#include <stdint.h>

__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const __nv_bfloat16 *p) {
    unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}
// two tiles (lanes 0–15 give the row addresses)
__device__ __forceinline__ void ldsm_x2(uint32_t r[2], const __nv_bfloat16 *p) {
    unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(s));
}
// four tiles, each transposed
__device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], const __nv_bfloat16 *p) {
    unsigned s = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}
#endif
