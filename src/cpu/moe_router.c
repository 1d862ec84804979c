// moe_router.c — NOT YET IMPLEMENTED (placeholder so the tree links).
#include "cpu.h"

void cpu_moe_route_fwd(int *idx, real *gate, real *s, real *alpha, const real *z, const real *bias, int N, int E, int k, real route_scale, int renorm) {
    (void)idx; (void)gate; (void)s; (void)alpha; (void)z; (void)bias; (void)N; (void)E; (void)k; (void)route_scale; (void)renorm;
    lm_die("cpu_moe_route_fwd: not implemented");
}

void cpu_moe_route_bwd(real *dz, const real *dgate, const real *s, const int *idx, int N, int E, int k, real route_scale, int renorm) {
    (void)dz; (void)dgate; (void)s; (void)idx; (void)N; (void)E; (void)k; (void)route_scale; (void)renorm;
    lm_die("cpu_moe_route_bwd: not implemented");
}
