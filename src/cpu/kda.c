// kda.c — NOT YET IMPLEMENTED (placeholder so the tree links).
#include "cpu.h"

void cpu_kda_fwd(const lm_kda_args *a) {
    (void)a;
    lm_die("cpu_kda_fwd: not implemented");
}

void cpu_kda_bwd(const lm_kda_args *a) {
    (void)a;
    lm_die("cpu_kda_bwd: not implemented");
}

void cpu_kda_decode(const lm_kda_args *a) {
    (void)a;
    lm_die("cpu_kda_decode: not implemented");
}
