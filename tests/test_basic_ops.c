// test_basic_ops.c — forward values and finite-difference gradients of the dense
// ops: matmul, RMSNorm, headwise gated RMSNorm, sigmoid gate, SwiGLU/SiTU-GLU,
// embedding, softmax cross-entropy.
#include "harness.h"
#include "cpu/cpu.h"

static const lm_ops *ops = &lm_cpu_ops;

// ---------------------------------------------------------------------------
// matmul: loss = Σ out ⊙ P
typedef struct { int N, C, OC; real *inp, *W, *b, *out, *P; } mm_ctx;
static double mm_loss(void *p) {
    mm_ctx *c = p;
    ops->matmul_fwd(c->out, c->inp, c->W, c->b, c->N, c->C, c->OC);
    return tu_dot(c->out, c->P, (size_t)c->N * c->OC);
}
static void test_matmul(void **state) {
    (void)state;
    lm_rng r; lm_rng_seed(&r, 1);
    mm_ctx c = {.N = 7, .C = 12, .OC = 5};
    c.inp = tu_randn(c.N * c.C, &r, 1); c.W = tu_randn(c.OC * c.C, &r, 0.5);
    c.b = tu_randn(c.OC, &r, 1); c.out = tu_alloc(c.N * c.OC); c.P = tu_randn(c.N * c.OC, &r, 1);
    mm_loss(&c);
    // forward against a direct triple loop
    double maxd = 0;
    for (int i = 0; i < c.N; i++)
        for (int o = 0; o < c.OC; o++) {
            double s = c.b[o];
            for (int k = 0; k < c.C; k++) s += (double)c.inp[i * c.C + k] * c.W[o * c.C + k];
            maxd = tu_worst(maxd, fabs(s - c.out[i * c.OC + o]));
        }
    tu_check("matmul fwd max abs diff", maxd, TOL(1e-12, 1e-5));
    real *di = tu_alloc(c.N * c.C), *dW = tu_alloc(c.OC * c.C), *db = tu_alloc(c.OC);
    ops->matmul_bwd(di, dW, db, c.P, c.inp, c.W, c.N, c.C, c.OC);
    tu_check("matmul d_inp", tu_gradcheck(c.inp, di, c.N * c.C, mm_loss, &c, TU_H, 200, &r), TOL(1e-8, 1e-2));
    tu_check("matmul d_W", tu_gradcheck(c.W, dW, c.OC * c.C, mm_loss, &c, TU_H, 200, &r), TOL(1e-8, 1e-2));
    tu_check("matmul d_bias", tu_gradcheck(c.b, db, c.OC, mm_loss, &c, TU_H, 200, &r), TOL(1e-8, 1e-2));
    // accumulation: a second backward doubles every gradient
    real *dW2 = tu_copy(dW, c.OC * c.C);
    ops->matmul_bwd(NULL, dW2, NULL, c.P, c.inp, c.W, c.N, c.C, c.OC);
    for (int i = 0; i < c.OC * c.C; i++) dW[i] *= 2;
    tu_check("matmul bwd accumulates", tu_rel_rms(dW2, dW, c.OC * c.C), TOL(1e-14, 1e-6));
    free(c.inp); free(c.W); free(c.b); free(c.out); free(c.P); free(di); free(dW); free(db); free(dW2);
}

// ---------------------------------------------------------------------------
typedef struct { int N, C; real *x, *g, *out, *rstd, *P; } rn_ctx;
static double rn_loss(void *p) {
    rn_ctx *c = p;
    ops->rmsnorm_fwd(c->out, c->rstd, c->x, c->g, c->N, c->C, 1e-5, NULL);
    return tu_dot(c->out, c->P, (size_t)c->N * c->C);
}
static void test_rmsnorm(void **state) {
    (void)state;
    lm_rng r; lm_rng_seed(&r, 2);
    rn_ctx c = {.N = 6, .C = 16};
    c.x = tu_randn(c.N * c.C, &r, 2); c.g = tu_rand_uniform(c.C, &r, 0.5, 1.5);
    c.out = tu_alloc(c.N * c.C); c.rstd = tu_alloc(c.N); c.P = tu_randn(c.N * c.C, &r, 1);
    rn_loss(&c);
    // divided by the gain, row 0 has RMS sqrt(ms / (ms + eps)), ms = mean(x²)
    double rms = 0, ms = 0;
    for (int k = 0; k < c.C; k++) rms += (double)c.out[k] / c.g[k] * c.out[k] / c.g[k], ms += (double)c.x[k] * c.x[k];
    ms /= c.C;
    tu_check("rmsnorm row RMS", fabs(sqrt(rms / c.C) - sqrt(ms / (ms + 1e-5))), TOL(1e-12, 1e-6));
    real *dx = tu_alloc(c.N * c.C), *dg = tu_alloc(c.C);
    ops->rmsnorm_bwd(dx, dg, c.P, c.x, c.g, c.rstd, c.N, c.C, 0);
    tu_check("rmsnorm d_inp", tu_gradcheck(c.x, dx, c.N * c.C, rn_loss, &c, TU_H, 200, &r), TOL(1e-7, 2e-2));
    tu_check("rmsnorm d_gain", tu_gradcheck(c.g, dg, c.C, rn_loss, &c, TU_H, 200, &r), TOL(1e-7, 2e-2));
    real *dx2 = tu_alloc(c.N * c.C);   // the written form replaces whatever dinp held (NaN here)
    for (int i = 0; i < c.N * c.C; i++) dx2[i] = NAN;
    ops->rmsnorm_bwd(dx2, NULL, c.P, c.x, c.g, c.rstd, c.N, c.C, 1);
    tu_check("rmsnorm assign: d_inp written (max abs diff)", tu_max_abs_diff(dx2, dx, c.N * c.C), 0);
    free(dx2);
    free(c.x); free(c.g); free(c.out); free(c.rstd); free(c.P); free(dx); free(dg);
}

// ---------------------------------------------------------------------------
typedef struct { int N, H, V; real *x, *z, *w, *out, *rstd, *P; } grn_ctx;
static double grn_loss(void *p) {
    grn_ctx *c = p;
    ops->gated_rmsnorm_fwd(c->out, c->rstd, c->x, c->z, c->w, c->N, c->H, c->V, 1e-5, NULL, NULL);
    return tu_dot(c->out, c->P, (size_t)c->N * c->H * c->V);
}
static void test_gated_rmsnorm(void **state) {
    (void)state;
    lm_rng r; lm_rng_seed(&r, 3);
    grn_ctx c = {.N = 5, .H = 3, .V = 8};
    size_t n = (size_t)c.N * c.H * c.V;
    c.x = tu_randn(n, &r, 1); c.z = tu_randn(n, &r, 1.5); c.w = tu_rand_uniform(c.V, &r, 0.5, 1.5);
    c.out = tu_alloc(n); c.rstd = tu_alloc(c.N * c.H); c.P = tu_randn(n, &r, 1);
    grn_loss(&c);
    // value check of one element against the formula, head 1 of row 2
    const real *xh = c.x + (2 * c.H + 1) * c.V;
    double ss = 0;
    for (int i = 0; i < c.V; i++) ss += (double)xh[i] * xh[i];
    double want = xh[3] / sqrt(ss / c.V + 1e-5) * c.w[3] / (1 + exp(-(double)c.z[(2 * c.H + 1) * c.V + 3]));
    tu_check("gated_rmsnorm value", fabs(want - c.out[(2 * c.H + 1) * c.V + 3]), TOL(1e-12, 1e-6));
    real *dx = tu_alloc(n), *dz = tu_alloc(n), *dw = tu_alloc(c.V);
    ops->gated_rmsnorm_bwd(dx, dz, dw, c.P, c.x, c.z, c.w, c.rstd, c.N, c.H, c.V, 0, NULL, NULL, NULL);
    tu_check("gated_rmsnorm d_x", tu_gradcheck(c.x, dx, n, grn_loss, &c, TU_H, 200, &r), TOL(1e-7, 2e-2));
    tu_check("gated_rmsnorm d_z", tu_gradcheck(c.z, dz, n, grn_loss, &c, TU_H, 200, &r), TOL(1e-7, 2e-2));
    tu_check("gated_rmsnorm d_w", tu_gradcheck(c.w, dw, c.V, grn_loss, &c, TU_H, 200, &r), TOL(1e-7, 2e-2));
    // the written form: dx, dz replaced whatever they held (NaN here); dw still adds
    real *dx2 = tu_alloc(n), *dz2 = tu_alloc(n), *dw2 = tu_copy(dw, c.V);
    for (size_t i = 0; i < n; i++) dx2[i] = dz2[i] = NAN;
    ops->gated_rmsnorm_bwd(dx2, dz2, dw2, c.P, c.x, c.z, c.w, c.rstd, c.N, c.H, c.V, 1, NULL, NULL, NULL);
    tu_check("gated_rmsnorm assign: d_x written (max abs diff)", tu_max_abs_diff(dx2, dx, n), 0);
    tu_check("gated_rmsnorm assign: d_z written (max abs diff)", tu_max_abs_diff(dz2, dz, n), 0);
    for (int i = 0; i < c.V; i++) dw[i] *= 2;
    tu_check("gated_rmsnorm assign: d_w still accumulates", tu_rel_rms(dw2, dw, c.V), TOL(1e-15, 1e-7));
    free(c.x); free(c.z); free(c.w); free(c.out); free(c.rstd); free(c.P); free(dx); free(dz); free(dw);
    free(dx2); free(dz2); free(dw2);
}

// ---------------------------------------------------------------------------
typedef struct { size_t n; int act, glu; real *a, *b, *out, *P; } g_ctx;
static double g_loss(void *p) {
    g_ctx *c = p;
    if (c->glu) ops->glu_fwd(c->out, c->a, c->b, c->n, c->act, NULL);
    else ops->sigmoid_gate_fwd(c->out, c->a, c->b, c->n, NULL);
    return tu_dot(c->out, c->P, c->n);
}
static void check_gate(int glu, int act, const char *name, double scale) {
    lm_rng r; lm_rng_seed(&r, 4 + act + 2 * glu);
    g_ctx c = {.n = 64, .act = act, .glu = glu};
    c.a = tu_randn(c.n, &r, scale); c.b = tu_randn(c.n, &r, scale);
    c.out = tu_alloc(c.n); c.P = tu_randn(c.n, &r, 1);
    g_loss(&c);
    real *da = tu_alloc(c.n), *db = tu_alloc(c.n);
    if (glu) ops->glu_bwd(da, db, c.P, c.a, c.b, c.n, act);
    else ops->sigmoid_gate_bwd(da, db, c.P, c.a, c.b, c.n, 0);
    char what[96];
    snprintf(what, sizeof what, "%s d_first", name);
    tu_check(what, tu_gradcheck(c.a, da, c.n, g_loss, &c, TU_H, 200, &r), TOL(1e-7, 2e-2));
    snprintf(what, sizeof what, "%s d_second", name);
    tu_check(what, tu_gradcheck(c.b, db, c.n, g_loss, &c, TU_H, 200, &r), TOL(1e-7, 2e-2));
    if (!glu) {   // written (assign): NaN on entry replaced, equal to adding into zeros
        real *wa = tu_alloc(c.n), *wb = tu_alloc(c.n);
        for (size_t i = 0; i < c.n; i++) wa[i] = wb[i] = NAN;
        ops->sigmoid_gate_bwd(wa, wb, c.P, c.a, c.b, c.n, 1);
        double m = 0;
        for (size_t i = 0; i < c.n; i++) m = tu_worst(tu_worst(m, fabs(wa[i] - da[i])), fabs(wb[i] - db[i]));
        snprintf(what, sizeof what, "%s written (assign) == added into zeros (max abs)", name);
        tu_check(what, m, 0);
        free(wa); free(wb);
    }
    free(c.a); free(c.b); free(c.out); free(c.P); free(da); free(db);
}
static void test_gates(void **state) {
    (void)state;
    check_gate(0, 0, "sigmoid_gate", 2);
    check_gate(1, LM_ACT_SWIGLU, "swiglu", 2);
    check_gate(1, LM_ACT_SITU, "situ_glu", 8);   // wide inputs reach the tanh caps
    // SiTU is bounded by 100 and matches SwiGLU near zero
    real g[2] = {50, 1e-3}, u[2] = {1000, 1e-3}, h[2], hs[2];
    ops->glu_fwd(h, g, u, 2, LM_ACT_SITU, NULL);
    ops->glu_fwd(hs, g, u, 2, LM_ACT_SWIGLU, NULL);
    tu_check("situ cap |h| <= 100", fabs(h[0]) > 100 ? fabs(h[0]) - 100 : 0, 0);
    tu_check("situ ~ swiglu near 0 (rel)", fabs(h[1] - hs[1]) / fabs(hs[1]), 1e-2);
}

// ---------------------------------------------------------------------------
typedef struct { int N, C, Vocab; int *tok; real *table, *out, *P; } e_ctx;
static double e_loss(void *p) {
    e_ctx *c = p;
    ops->embed_fwd(c->out, c->tok, c->table, c->N, c->C);
    return tu_dot(c->out, c->P, (size_t)c->N * c->C);
}
static void test_embed(void **state) {
    (void)state;
    lm_rng r; lm_rng_seed(&r, 7);
    e_ctx c = {.N = 9, .C = 4, .Vocab = 5};
    int tok[9] = {0, 3, 3, 1, 4, 3, 0, 2, 2};
    c.tok = tok; c.table = tu_randn(c.Vocab * c.C, &r, 1);
    c.out = tu_alloc(c.N * c.C); c.P = tu_randn(c.N * c.C, &r, 1);
    real *dt = tu_alloc(c.Vocab * c.C);
    e_loss(&c);
    ops->embed_bwd(dt, c.tok, c.P, c.N, c.C);
    tu_check("embed d_table (repeated tokens)", tu_gradcheck(c.table, dt, c.Vocab * c.C, e_loss, &c, TU_H, 100, &r),
             TOL(1e-8, 1e-2));
    free(c.table); free(c.out); free(c.P); free(dt);
}

// ---------------------------------------------------------------------------
typedef struct { int N, V; int *tgt; real *z, *loss, *lse; } x_ctx;
static double x_loss(void *p) {
    x_ctx *c = p;
    ops->xent_fwd(c->loss, c->lse, c->z, c->tgt, c->N, c->V);
    double s = 0;
    for (int i = 0; i < c->N; i++) s += c->loss[i];
    return s * 0.25;
}
static void test_xent(void **state) {
    (void)state;
    lm_rng r; lm_rng_seed(&r, 8);
    x_ctx c = {.N = 6, .V = 11};
    int tgt[6] = {3, -1, 10, 0, 5, -1};
    c.tgt = tgt; c.z = tu_randn(c.N * c.V, &r, 3);
    c.loss = tu_alloc(c.N); c.lse = tu_alloc(c.N);
    x_loss(&c);
    // value: loss = log Σ exp(z) − z[t]
    double s = 0;
    for (int j = 0; j < c.V; j++) s += exp((double)c.z[2 * c.V + j]);
    tu_check("xent value", fabs(log(s) - c.z[2 * c.V + 10] - c.loss[2]), TOL(1e-12, 1e-5));
    tu_check("xent ignored target gives 0", fabs(c.loss[1]), 0);
    real *dz = tu_alloc(c.N * c.V);
    ops->xent_bwd(dz, c.z, c.lse, c.tgt, 0.25, c.N, c.V);
    tu_check("xent d_logits", tu_gradcheck(c.z, dz, c.N * c.V, x_loss, &c, TU_H, 200, &r), TOL(1e-8, 1e-2));
    free(c.z); free(c.loss); free(c.lse); free(dz);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul),   cmocka_unit_test(test_rmsnorm), cmocka_unit_test(test_gated_rmsnorm),
        cmocka_unit_test(test_gates),    cmocka_unit_test(test_embed),   cmocka_unit_test(test_xent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
