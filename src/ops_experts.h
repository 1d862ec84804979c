// ops_experts.h — the routed experts (ops.h moe_experts_fwd/bwd) as a sequence of the
// finer ops of one table: the CPU backend's implementation, and the CUDA backend's in its
// fp32 GEMM modes. Header-only so that both backends link it without the other's library.
#ifndef LM_OPS_EXPERTS_H
#define LM_OPS_EXPERTS_H
#include "ops.h"

// y [N, C] += Σ_slot gate · E_e(x[token]); saves ex->xp, ea, eb, eh, yp (all fp32)
static inline void lm_experts_fwd_by_ops(const lm_ops *o, const lm_experts *ex, real *y, const real *x) {
    const size_t n = (size_t)ex->R * ex->F;
    o->moe_gather_fwd(ex->xp, x, ex->row_token, ex->offsets, ex->E, ex->C);
    o->grouped_matmul2_fwd(ex->ea, ex->eb, ex->xp, ex->W1, ex->W3, ex->offsets, ex->E, ex->C, ex->F, ex->R);
    o->glu_fwd(ex->eh, ex->ea, ex->eb, n, ex->act, NULL);
    o->grouped_matmul_fwd(ex->yp, ex->eh, ex->W2, ex->offsets, ex->E, ex->F, ex->C, ex->R);
    o->moe_combine_fwd(y, ex->yp, ex->gate, ex->slot_row, ex->N, ex->k, ex->C);
}

// the backward of the above, reading the fp32 xp and eh it saved. The finer ops add into
// the work buffers, which may hold anything on entry: zeroed first (and so are dW1, dW3, dW2
// when the op is to write them, and dx).
static inline void lm_experts_bwd_by_ops(const lm_ops *o, const lm_experts *ex, const lm_experts_grads *g, real *dx,
                                         const real *dy) {
    const size_t n = (size_t)ex->R * ex->F, nc = (size_t)ex->R * ex->C, nw = (size_t)ex->E * ex->F * ex->C;
    if (g->dW_assign) {   // the finer ops add: written = added onto zeros
        if (g->dW1) o->zero(g->dW1, nw * sizeof(real));
        if (g->dW3) o->zero(g->dW3, nw * sizeof(real));
        if (g->dW2) o->zero(g->dW2, nw * sizeof(real));
    }
    if (g->dx_assign && dx) o->zero(dx, (size_t)ex->N * ex->C * sizeof(real));
    o->zero(g->dyp, nc * sizeof(real));
    o->zero(g->deh, n * sizeof(real));
    o->zero(g->dea, n * sizeof(real));
    o->zero(g->deb, n * sizeof(real));
    o->zero(g->dxp, nc * sizeof(real));
    o->moe_combine_bwd(g->dyp, g->dgate, dy, ex->yp, ex->gate, ex->slot_row, ex->N, ex->k, ex->C);
    o->grouped_matmul_bwd(g->deh, g->dW2, g->dyp, ex->eh, ex->W2, ex->offsets, ex->E, ex->F, ex->C, ex->R);
    o->glu_bwd(g->dea, g->deb, g->deh, ex->ea, ex->eb, n, ex->act);
    o->grouped_matmul2_bwd(g->dxp, g->dW1, g->dW3, g->dea, g->deb, ex->xp, ex->W1, ex->W3, ex->offsets, ex->E, ex->C,
                           ex->F, ex->R);
    o->moe_gather_bwd(dx, g->dxp, ex->row_token, ex->offsets, ex->E, ex->C, ex->R);
}

#endif
