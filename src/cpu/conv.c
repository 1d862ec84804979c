// conv.c — NOT YET IMPLEMENTED (placeholder so the tree links).
#include "cpu.h"

void cpu_conv_silu_fwd(real *out, const real *inp, const real *w, const real *cache, int B, int T, int C, int W) {
    (void)out; (void)inp; (void)w; (void)cache; (void)B; (void)T; (void)C; (void)W;
    lm_die("cpu_conv_silu_fwd: not implemented");
}

void cpu_conv_silu_bwd(real *dinp, real *dw, const real *dout, const real *inp, const real *w, const real *cache, int B, int T, int C, int W) {
    (void)dinp; (void)dw; (void)dout; (void)inp; (void)w; (void)cache; (void)B; (void)T; (void)C; (void)W;
    lm_die("cpu_conv_silu_bwd: not implemented");
}

void cpu_conv_cache_update(real *cache, const real *inp, int B, int T, int C, int W) {
    (void)cache; (void)inp; (void)B; (void)T; (void)C; (void)W;
    lm_die("cpu_conv_cache_update: not implemented");
}
