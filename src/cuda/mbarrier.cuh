// mbarrier.cuh — shared-memory mbarriers, on which the Hopper bulk-copy (TMA) engine reports
// its completions (moe_gemm_tma.cu). Addresses are 32-bit shared-memory addresses
// (__cvta_generic_to_shared).
// These are sm_90 (not sm_90a) instructions, so they compile in every pass nvcc makes.
#ifndef LM_MBARRIER_CUH
#define LM_MBARRIER_CUH
#include <stdint.h>

__device__ __forceinline__ void mb_init(uint32_t bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// makes the initialised barriers visible to the bulk-copy engine (once, before any copy)
__device__ __forceinline__ void mb_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// one arrival that also expects `bytes` of bulk-copy completions on this phase
__device__ __forceinline__ void mb_expect_tx(uint32_t bar, int bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mb_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// waits until the phase of parity `parity` has completed (a fresh barrier counts its
// phase before 0 — parity 1 — as completed)
__device__ __forceinline__ void mb_wait(uint32_t bar, int parity) {
    uint32_t done = 0;
    while (!done) {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    }
}
#endif
