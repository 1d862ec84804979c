// test_optim.c — AdamW against its formula, Muon's Newton–Schulz orthogonalisation
// (singular values near 1, update RMS ≈ 0.2·lr as Moonlight intends), the WSD schedule,
// and that both optimizers reduce the loss of a small model.
#include "harness.h"
#include "cpu/cpu.h"
#include "model/model.h"
#include "train/optimizer.h"
#include "train/qk_clip.h"

static const lm_ops *ops = &lm_cpu_ops;

// two spans with their own weight decay and a gap between them that stays untouched
static void test_adamw_formula(void **state) {
    (void)state;
    lm_rng r;
    lm_rng_seed(&r, 1);
    const int n = 50;
    real *p = tu_randn(n, &r, 1), *g = tu_randn(n, &r, 1), *m = tu_randn(n, &r, 0.1), *v = tu_rand_uniform(n, &r, 0, 0.1);
    real *p0 = tu_copy(p, n), *m0 = tu_copy(m, n), *v0 = tu_copy(v, n);
    const double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, bc1 = 1 - pow(b1, 3), bc2 = 1 - pow(b2, 3);
    const double gs = 0.75;   // the clipping factor
    const lm_adamw_span spans[2] = {{0, 20, 0.1}, {27, 23, 0.0}};
    ops->adamw(p, g, m, v, spans, 2, lr, b1, b2, eps, bc1, bc2, gs);
    double worst = 0;
    int gap_kept = 1;
    for (int i = 0; i < n; i++) {
        if (i >= 20 && i < 27) {
            gap_kept &= p[i] == p0[i] && m[i] == m0[i] && v[i] == v0[i];
            continue;
        }
        const double wd = i < 20 ? 0.1 : 0.0, gi = gs * g[i];
        double mm = b1 * m0[i] + (1 - b1) * gi, vv = b2 * v0[i] + (1 - b2) * gi * gi;
        double want = p0[i] - lr * ((mm / bc1) / (sqrt(vv / bc2) + eps) + wd * p0[i]);
        worst = tu_worst(worst, fabs(want - p[i]));
    }
    tu_check("adamw vs formula (max abs)", worst, TOL(1e-14, 1e-6));
    assert_true(gap_kept);
    free(p); free(g); free(m); free(v); free(p0); free(m0); free(v0);
}

// singular values of the Muon update direction: all near 1 (NS5 lands them in ~[0.7, 1.2])
static void test_muon_orthogonalises(void **state) {
    (void)state;
    lm_rng r;
    lm_rng_seed(&r, 2);
    const int rows = 24, cols = 40;
    real *p = tu_alloc(rows * cols), *g = tu_randn(rows * cols, &r, 1), *m = tu_alloc(rows * cols);
    const real lr = 1;
    ops->muon(p, g, m, 1, rows, cols, lr, 0, 0);   // p = −lr·0.2·sqrt(40)·O
    // O Oᵀ should be near the identity: check its eigenvalues through the Frobenius
    // distance and the diagonal
    double sc = 0.2 * sqrt((double)cols), off = 0, diag_lo = 1e9, diag_hi = 0;
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < rows; j++) {
            double s = 0;
            for (int k = 0; k < cols; k++) s += (double)p[i * cols + k] * p[j * cols + k];
            s /= sc * sc;
            if (i == j) { diag_lo = tu_least(diag_lo, s); diag_hi = tu_worst(diag_hi, s); }
            else off = tu_worst(off, fabs(s));
        }
    printf("measured muon: diag(OOᵀ) in [%.3f, %.3f], max |offdiag| %.3f\n", diag_lo, diag_hi, off);
    assert_true(diag_lo > 0.5 && diag_hi < 1.5 && off < 0.3);
    // Moonlight's scaling: update = lr·0.2·sqrt(max(r,c))·O and O has min(r,c) singular
    // values ≈ 1, so RMS(update) = 0.2·lr·sqrt(mean σ²) ≈ 0.2·lr (AdamW's typical RMS)
    double rms = sqrt(tu_dot(p, p, rows * cols) / (rows * cols));
    printf("measured muon update RMS = %.4f · lr\n", rms / lr);
    tu_check("muon update RMS vs 0.2·lr (rel)", fabs(rms / (0.2 * lr) - 1), 0.25);
    free(p); free(g); free(m);
}

static void test_wsd_schedule(void **state) {
    (void)state;
    lm_optim_config c;
    lm_optim_default(&c);
    c.lr = 1; c.warmup = 10; c.total_steps = 100; c.decay_frac = 0.2; c.final_frac = 0.1;
    tu_check("wsd warmup step 0", fabs(lm_optim_lr(&c, 0) - 0.1), 1e-6);
    tu_check("wsd warmup step 9", fabs(lm_optim_lr(&c, 9) - 1.0), 1e-6);
    tu_check("wsd stable step 50", fabs(lm_optim_lr(&c, 50) - 1.0), 1e-6);
    tu_check("wsd stable step 79", fabs(lm_optim_lr(&c, 79) - 1.0), 1e-6);
    tu_check("wsd decay midway", fabs(lm_optim_lr(&c, 89) - (1 - 0.5 * 0.9)), 1e-6);
    tu_check("wsd last step = final", fabs(lm_optim_lr(&c, 99) - 0.1), 1e-6);
}

// both optimizers bring the training loss of a small model down on a fixed batch
static void test_optimizers_reduce_loss(void **state) {
    (void)state;
    for (int kind = 0; kind < 2; kind++) {
        lm_config c;
        lm_config_preset(&c, "tiny");
        c.vocab = 40; c.d_model = 32; c.n_layers = 2; c.kda_heads = 2; c.kda_head_dim = 16;
        c.mla_heads = 2; c.kv_lora_rank = 16; c.qk_nope_dim = 8; c.qk_extra_dim = 4; c.v_head_dim = 8;
        c.d_ff_dense = 32; c.n_experts = 4; c.top_k = 2; c.d_ff_expert = 16;
        assert_int_equal(lm_config_finalize(&c), LM_OK);
        lm_model *m = lm_model_create(&c, ops, 5);
        lm_optim_config oc;
        lm_optim_default(&oc);
        oc.kind = kind;
        oc.lr = 3e-3;
        oc.warmup = 0;
        lm_optim o;
        lm_optim_init(&o, m, &oc);
        lm_rng r;
        lm_rng_seed(&r, 9);
        int tok[64], tgt[64];
        for (int i = 0; i < 64; i++) { tok[i] = (int)lm_rng_below(&r, 40); tgt[i] = (tok[i] * 7 + 3) % 40; }
        lm_fwd_opts fo = {.training = 1, .capacity = -1, .aux_weight = 1};
        double first = 0, last = 0;
        for (int step = 0; step < 40; step++) {
            lm_model_zero_grads(m);
            double l = lm_model_forward(m, tok, tgt, 2, 32, fo);
            lm_model_backward(m, (real)(1.0 / m->last_count));
            lm_optim_step(&o, m, oc.lr);
            for (int i = 0; i < c.n_layers; i++)
                if (lm_layer_is_moe(&c, i)) lm_balancer_update(&m->bal[i], ops, NULL);
            if (step == 0) first = l;
            last = l;
        }
        printf("measured %s: loss %.3f -> %.3f in 40 steps\n", kind ? "muon" : "adamw", first, last);
        assert_true(last < 0.5 * first);
        lm_optim_free(&o, m);
        lm_model_free(m);
    }
}

// QK-Clip: a head whose max logit exceeds τ ends with max logit τ on the same inputs;
// the other heads' weights are untouched
static void test_qk_clip(void **state) {
    (void)state;
    lm_config c;
    lm_config_preset(&c, "tiny");
    c.vocab = 40; c.d_model = 32; c.n_layers = 2;
    snprintf(c.layer_types, sizeof c.layer_types, "KM");
    c.kda_heads = 2; c.kda_head_dim = 16; c.mla_heads = 3; c.kv_lora_rank = 16;
    c.qk_nope_dim = 8; c.qk_extra_dim = 4; c.v_head_dim = 8;
    c.d_ff_dense = 32; c.n_experts = 4; c.top_k = 2; c.d_ff_expert = 16; c.init_std = 0.5;
    assert_int_equal(lm_config_finalize(&c), LM_OK);
    lm_model *m = lm_model_create(&c, ops, 3);
    const int Dqk = 12;
    lm_layer_params *p = &m->params.layer[1];
    ops->scale(p->mq_proj + (size_t)1 * Dqk * c.d_model, 8, (size_t)Dqk * c.d_model);   // head 1: huge logits
    int tok[48];
    for (int i = 0; i < 48; i++) tok[i] = (i * 13) % 40;
    lm_fwd_opts fo = {.training = 0, .capacity = -1};
    real before[2 * 3], after[2 * 3];
    lm_model_forward(m, tok, NULL, 2, 24, fo);
    lm_qk_reset(m, before);
    lm_qk_observe(m, before);
    const real tau = 30;
    printf("measured max logits before: %.2f %.2f %.2f\n", before[3], before[4], before[5]);
    assert_true(before[4] > tau && before[3] < tau && before[5] < tau);
    size_t nq = (size_t)3 * Dqk * c.d_model;
    real *q0 = tu_copy(p->mq_proj, nq);
    assert_int_equal(lm_qk_clip(m, before, tau), 1);
    lm_model_forward(m, tok, NULL, 2, 24, fo);
    lm_qk_reset(m, after);
    lm_qk_observe(m, after);
    tu_check("qk-clip: clipped head max logit == tau (rel)", fabs(after[4] / tau - 1), TOL(1e-12, 1e-5));
    tu_check("qk-clip: other heads' max logits unchanged", fabs(after[3] - before[3]) + fabs(after[5] - before[5]), 0);
    tu_check("qk-clip: other heads' q rows unchanged",
             tu_max_abs_diff(p->mq_proj, q0, (size_t)Dqk * c.d_model) +
                 tu_max_abs_diff(p->mq_proj + 2 * (size_t)Dqk * c.d_model, q0 + 2 * (size_t)Dqk * c.d_model,
                                 (size_t)Dqk * c.d_model), 0);
    free(q0);
    lm_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adamw_formula), cmocka_unit_test(test_muon_orthogonalises),
        cmocka_unit_test(test_wsd_schedule), cmocka_unit_test(test_optimizers_reduce_loss),
        cmocka_unit_test(test_qk_clip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
