// tma.cuh — Hopper bulk tensor copies (TMA), shared by the grouped expert GEMMs
// (moe_gemm_tma.cu) and the warp-specialized flash attention (attn_flash_ws.cu). A tensor map
// describes a bf16 tensor in global memory and the box one copy moves into shared memory with
// the 128-byte swizzle the wgmma descriptors of wgmma.cuh expect; its completion is counted in
// bytes on an mbarrier (mbarrier.cuh). Boxes that reach past the tensor's edges are
// zero-filled, and still count their whole size.
#ifndef LM_TMA_CUH
#define LM_TMA_CUH
#include <cuda.h>
#include <stdint.h>

// box at coordinates (c0 innermost, c1, ...) of the map → shared memory at dst (1024-aligned)
__device__ __forceinline__ void tma_2d(uint32_t dst, const CUtensorMap *map, int c0, int c1, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n"
                 ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1)
                 : "memory");
}
__device__ __forceinline__ void tma_3d(uint32_t dst, const CUtensorMap *map, int c0, int c1, int c2, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n"
                 ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
                 : "memory");
}

// bytes (a multiple of 16; both addresses 16-byte aligned) from global memory at src to shared
// memory at dst, counted on bar like the tensor copies
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void *src, int bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

// Host: a bf16 tensor of `rank` (2 or 3) dimensions, dims[0] innermost (contiguous), strides[i]
// the byte step of dimension i + 1; boxes of box[0] × box[1] (× 1) elements, box[0]·2 = 128
// bytes (one swizzle row). Dies with a clear message if the driver refuses it.
CUtensorMap lm_tma_map_bf16(const void *base, int rank, const long *dims, const long *strides, int box0, int box1);
#endif
