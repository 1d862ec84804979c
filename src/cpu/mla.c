// mla.c — NOT YET IMPLEMENTED (placeholder so the tree links).
#include "cpu.h"

void cpu_mla_split_fwd(real *k, real *v, const real *kv, const real *kpe, int N, int H, int Dn, int De, int Dv) {
    (void)k; (void)v; (void)kv; (void)kpe; (void)N; (void)H; (void)Dn; (void)De; (void)Dv;
    lm_die("cpu_mla_split_fwd: not implemented");
}

void cpu_mla_split_bwd(real *dkv, real *dkpe, const real *dk, const real *dv, int N, int H, int Dn, int De, int Dv) {
    (void)dkv; (void)dkpe; (void)dk; (void)dv; (void)N; (void)H; (void)Dn; (void)De; (void)Dv;
    lm_die("cpu_mla_split_bwd: not implemented");
}

void cpu_attn_fwd(real *o, real *lse, const real *q, const real *k, const real *v, int B, int T, int H, int Dqk, int Dv, real scale) {
    (void)o; (void)lse; (void)q; (void)k; (void)v; (void)B; (void)T; (void)H; (void)Dqk; (void)Dv; (void)scale;
    lm_die("cpu_attn_fwd: not implemented");
}

void cpu_attn_bwd(real *dq, real *dk, real *dv, const real *d_o, const real *q, const real *k, const real *v, const real *o, const real *lse, int B, int T, int H, int Dqk, int Dv, real scale) {
    (void)dq; (void)dk; (void)dv; (void)d_o; (void)q; (void)k; (void)v; (void)o; (void)lse; (void)B; (void)T; (void)H; (void)Dqk; (void)Dv; (void)scale;
    lm_die("cpu_attn_bwd: not implemented");
}
