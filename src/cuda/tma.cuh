// tma.cuh — Hopper bulk tensor copies (TMA), shared by the grouped expert GEMMs
// (moe_gemm_tma.cu) and the warp-specialized flash attention (attn_flash_ws.cu). A tensor map
// describes a bf16 (or fp32) tensor in global memory and the box one copy moves between it and
// shared memory with the 128-byte swizzle (the layout the wgmma descriptors of wgmma.cuh
// expect). A load's completion is counted in bytes on an mbarrier (mbarrier.cuh); boxes that
// reach past the tensor's edges are zero-filled, and still count their whole size. A store
// (or an adding store) writes only the box's elements inside the tensor; its completion is
// tracked per thread in bulk groups; the threads that wrote its shared memory order those writes
// before it by wg_fence_proxy (wgmma.cuh).
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

// ---- stores: shared memory → global (the issuing thread's bulk groups) ----
// the box at src (1024-aligned) to coordinates (c0, c1) of the map: written, or added (fp32)
__device__ __forceinline__ void tma_store_2d(const CUtensorMap *map, uint32_t src, int c0, int c1) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n"
                 ::"l"(reinterpret_cast<uint64_t>(map)), "r"(src), "r"(c0), "r"(c1)
                 : "memory");
}
__device__ __forceinline__ void tma_add_2d(const CUtensorMap *map, uint32_t src, int c0, int c1) {
    asm volatile("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3}], [%1];\n"
                 ::"l"(reinterpret_cast<uint64_t>(map)), "r"(src), "r"(c0), "r"(c1)
                 : "memory");
}
// closes a bulk group of the stores issued since the last one
__device__ __forceinline__ void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// waits until at most N of this thread's bulk groups still read their shared memory
template <int N> __device__ __forceinline__ void tma_store_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
// waits until every bulk group of this thread has completed (its writes done)
__device__ __forceinline__ void tma_store_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

// Host: a bf16 tensor of `rank` (2 or 3) dimensions, dims[0] innermost (contiguous), strides[i]
// the byte step of dimension i + 1; boxes of box[0] × box[1] (× 1) elements, box[0]·2 = 128
// bytes (one swizzle row). Dies with a clear message if the driver refuses it.
CUtensorMap lm_tma_map_bf16(const void *base, int rank, const long *dims, const long *strides, int box0, int box1);
// The same for an fp32 tensor: boxes of 32 × box1 elements (box0 = 32: one 128-byte row)
CUtensorMap lm_tma_map_f32(const void *base, int rank, const long *dims, const long *strides, int box0, int box1);
#endif
