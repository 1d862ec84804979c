// memory.c — CPU backend memory: plain host memory, 64-byte aligned.
#include "cpu.h"

void *cpu_alloc(size_t bytes) {
    size_t n = (bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, n ? n : 64);
    if (!p) lm_die("out of memory allocating %zu bytes", bytes);
    memset(p, 0, n ? n : 64);
    return p;
}
void cpu_free(void *p) { free(p); }
void cpu_to_device(void *dst, const void *host_src, size_t bytes) { if (bytes) memcpy(dst, host_src, bytes); }
void cpu_to_host(void *host_dst, const void *src, size_t bytes) { if (bytes) memcpy(host_dst, src, bytes); }
void cpu_copy(void *dst, const void *src, size_t bytes) { if (bytes) memmove(dst, src, bytes); }
void cpu_zero(void *p, size_t bytes) { if (bytes) memset(p, 0, bytes); }

void cpu_copy2d(real *dst, size_t dst_stride, const real *src, size_t src_stride, size_t rows, size_t cols) {
    for (size_t r = 0; r < rows; r++) memmove(dst + r * dst_stride, src + r * src_stride, cols * sizeof(real));
}
