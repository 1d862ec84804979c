// test_balance.c — load balancing: the balancer module (QB, sign, quartile, aux, none)
// on a synthetic skewed router, the QB histogram quantile against an exact sort,
// pooling of micro-batch statistics, causality (a batch never sees its own statistics),
// the hand-derivable update rules and metrics, names, and the capacity schedule.
#include "harness.h"
#include "cpu/cpu.h"
#include "model/balancer.h"

static const lm_ops *ops = &lm_cpu_ops;

// ---------------------------------------------------------------------------
// a synthetic router: logits z_ij = N(0,1) + mu_j with mu spread evenly over
// [-2, 2], fresh tokens every call, so expert E-1 is strongly preferred

typedef struct {
    int E, k, N;        // N tokens per micro-batch
    real *z, *s, *gate, *alpha;
    int *idx, *counts, *offsets, *row_token, *slot_row;
} synth;

static void synth_init(synth *q, int E, int k, int N) {
    size_t NK = (size_t)N * k;
    q->E = E; q->k = k; q->N = N;
    q->z = tu_alloc((size_t)N * E); q->s = tu_alloc((size_t)N * E);
    q->gate = tu_alloc(NK); q->alpha = tu_alloc(N);
    q->idx = lm_malloc(NK * sizeof(int)); q->counts = lm_malloc(E * sizeof(int));
    q->offsets = lm_malloc((E + 1) * sizeof(int));
    q->row_token = lm_malloc(NK * sizeof(int)); q->slot_row = lm_malloc(NK * sizeof(int));
}
static void synth_free(synth *q) {
    free(q->z); free(q->s); free(q->gate); free(q->alpha); free(q->idx); free(q->counts);
    free(q->offsets); free(q->row_token); free(q->slot_row);
}
static void synth_draw(synth *q, lm_rng *r) {
    for (int i = 0; i < q->N; i++)
        for (int j = 0; j < q->E; j++)
            q->z[(size_t)i * q->E + j] = (real)(lm_rng_normal(r) - 2.0 + 4.0 * j / (q->E - 1));
}
// route the current batch with the balancer's bias and plan it (capacity < 0: dropless)
static void synth_route(synth *q, const lm_balancer *b, int capacity) {
    ops->moe_route_fwd(q->idx, q->gate, q->s, q->alpha, q->z, b->bias, q->N, q->E, q->k, 1, 1);
    ops->moe_plan(q->counts, q->offsets, q->row_token, q->slot_row, q->idx, q->s, q->N, q->E, q->k, capacity);
}

// `steps` optimizer steps of `micro` micro-batches of N fresh tokens, for `nb`
// strategies in lockstep (each batch is drawn once and routed by every balancer, so the
// strategies are compared on identical tokens); maxvio [nb][steps]
static void run_dynamics(int nb, const lm_balance_kind *kinds, const real *rates, int E, int k, int N,
                         int micro, int steps, uint64_t seed, double *maxvio) {
    lm_rng r; lm_rng_seed(&r, seed);
    lm_balancer *b = lm_malloc((size_t)nb * sizeof(lm_balancer));
    for (int c = 0; c < nb; c++) lm_balancer_init(&b[c], ops, kinds[c], E, k, 0, rates[c]);
    synth q;
    synth_init(&q, E, k, N);
    for (int t = 0; t < steps; t++) {
        for (int u = 0; u < micro; u++) {
            synth_draw(&q, &r);
            for (int c = 0; c < nb; c++) {
                synth_route(&q, &b[c], -1);
                lm_balancer_observe(&b[c], ops, q.s, q.alpha, q.counts, q.offsets, N);
            }
        }
        for (int c = 0; c < nb; c++) {
            lm_moe_metrics m;
            lm_balancer_update(&b[c], ops, &m);
            maxvio[c * steps + t] = m.maxvio;
        }
    }
    synth_free(&q);
    for (int c = 0; c < nb; c++) lm_balancer_free(&b[c], ops);
    free(b);
}

static void print_traj(const char *name, const double *v, int n) {
    printf("   MaxVio %-22s:", name);
    for (int t = 0; t < n; t++) printf(" %.3f", v[t]);
    printf("\n");
}

// The asserted configuration: E = 16, k = 2, 2 micro-batches of 32768 fresh tokens per
// step. The batch is larger than the 4096 of a first sketch on purpose: with 4096
// tokens (q = 512 per expert) the sampling noise alone (σ ≈ 4% per expert, times √2 as
// the bias is estimated on one batch and used on the next) puts the max over 16
// experts above 0.1 on a good fraction of steps for ANY causal balancer, oracle
// included. That run is still printed for reference.
#define DYN_E 16
#define DYN_K 2
#define DYN_N 32768
#define DYN_MICRO 2
#define DYN_STEPS 20
#define DYN_SETTLE 5     // updates qb gets before MaxVio must stay below 0.1

static void test_dynamics(void **state) {
    (void)state;
    const lm_balance_kind kinds[4] = {LM_BAL_QB, LM_BAL_NONE, LM_BAL_SIGN, LM_BAL_QUARTILE};
    const real rates[4] = {0, 0, 1e-3, 1e-3};
    double mv[4 * DYN_STEPS], small[DYN_STEPS];
    run_dynamics(4, kinds, rates, DYN_E, DYN_K, DYN_N, DYN_MICRO, DYN_STEPS, 1, mv);
    run_dynamics(1, kinds, rates, DYN_E, DYN_K, 2048, DYN_MICRO, DYN_STEPS, 2, small);
    const double *qb = mv, *none = mv + DYN_STEPS, *sign = mv + 2 * DYN_STEPS, *quart = mv + 3 * DYN_STEPS;
    print_traj("qb", qb, DYN_STEPS);
    print_traj("none", none, DYN_STEPS);
    print_traj("sign u=1e-3", sign, DYN_STEPS);
    print_traj("quartile step=1e-3", quart, DYN_STEPS);
    print_traj("qb, 4096 tok/step (info)", small, DYN_STEPS);
    double qb_worst = 0, none_best = INFINITY;
    for (int t = DYN_SETTLE; t < DYN_STEPS; t++) qb_worst = tu_worst(qb_worst, qb[t]);
    for (int t = 0; t < DYN_STEPS; t++) none_best = tu_least(none_best, none[t]);
    tu_check("qb max MaxVio after 5 updates (steps 5..19)", qb_worst, 0.1);
    tu_check("none: 1 / (min MaxVio over all steps), below 1 iff MaxVio stayed > 1", 1 / none_best, 1);
    tu_check("qb step-0 MaxVio equals none's (same tokens, zero bias)", fabs(qb[0] - none[0]), 0);
    // the ±step rules move in the right direction, slowly: paired with none on the same tokens
    tu_check("sign improves on none at the last step (sign/none ratio < 1)", sign[DYN_STEPS - 1] / none[DYN_STEPS - 1],
             0.99);
    tu_check("quartile improves on none at the last step (ratio < 1)", quart[DYN_STEPS - 1] / none[DYN_STEPS - 1], 0.99);
}

// ---------------------------------------------------------------------------
// the QB histogram quantile against the exact lower quantile on the same margins

static int cmp_real(const void *pa, const void *pb) {
    real a = *(const real *)pa, b = *(const real *)pb;
    return (a > b) - (a < b);
}

static void check_hist_quantile(int nbins) {
    const int E = 12, k = 3, N = 3000;
    lm_rng r; lm_rng_seed(&r, 100 + nbins);
    lm_balancer b;
    lm_balancer_init(&b, ops, LM_BAL_QB, E, k, nbins, 0);
    real *bias0 = tu_rand_uniform(E, &r, -0.4, 0.4);
    lm_balancer_set_bias(&b, ops, bias0);
    synth q;
    synth_init(&q, E, k, N);
    synth_draw(&q, &r);
    synth_route(&q, &b, -1);
    lm_balancer_observe(&b, ops, q.s, q.alpha, q.counts, q.offsets, N);
    int *hist = lm_malloc((size_t)E * nbins * sizeof(int));
    ops->to_host(hist, b.hist, (size_t)E * nbins * sizeof(int));
    const double lo = b.lo, w = b.width;
    const int64_t target = ((int64_t)k * N + E - 1) / E;
    real *col = tu_alloc(N);
    double maxd = 0, exact[12], emean = 0;
    int outside = 0;
    int64_t total_bad = 0;
    for (int j = 0; j < E; j++) {
        int64_t tot = 0;
        for (int h = 0; h < nbins; h++) tot += hist[(size_t)j * nbins + h];
        total_bad += tot != N;
        for (int i = 0; i < N; i++) {
            col[i] = q.alpha[i] - q.s[(size_t)i * E + j];
            outside += col[i] < lo || col[i] >= lo + nbins * w;
        }
        qsort(col, N, sizeof(real), cmp_real);
        exact[j] = col[target - 1];   // the lower quantile: the target-th smallest margin
        emean += exact[j];
        double hq = lm_qb_hist_quantile(hist + (size_t)j * nbins, nbins, lo, w, target);
        maxd = tu_worst(maxd, fabs(hq - exact[j]) / w);
    }
    emean /= E;
    char what[128];
    snprintf(what, sizeof what, "qb hist: every margin inside [min b-1, max b+1] (%d bins, count outside)", nbins);
    tu_check(what, outside, 0);
    snprintf(what, sizeof what, "qb hist: each expert row counts every token (%d bins, bad rows)", nbins);
    tu_check(what, (double)total_bad, 0);
    snprintf(what, sizeof what, "qb hist quantile vs exact sorted lower quantile, in bin widths (%d bins)", nbins);
    tu_check(what, maxd, 1 + 1e-4);
    // the full update: bias = b̂ − mean b̂, within two bin widths of the exact version
    lm_balancer_update(&b, ops, NULL);
    double maxu = 0;
    for (int j = 0; j < E; j++) maxu = tu_worst(maxu, fabs(b.bias_host[j] - (exact[j] - emean)) / w);
    snprintf(what, sizeof what, "qb update vs exact centred quantiles, in bin widths (%d bins)", nbins);
    tu_check(what, maxu, 2 + 1e-4);
    free(col); free(hist); free(bias0);
    synth_free(&q);
    lm_balancer_free(&b, ops);
}

static void test_hist_quantile(void **state) {
    (void)state;
    check_hist_quantile(64);
    check_hist_quantile(LM_QB_NBINS_DEFAULT);
    // hand-made row: counts 2, 0, 3, 5 on [0, 4): the 4th value is 1/3 into bin 2
    int h[4] = {2, 0, 3, 5};
    double v = lm_qb_hist_quantile(h, 4, 0, 1, 4), v2 = lm_qb_hist_quantile(h, 4, 0, 1, 2);
    tu_check("qb hist quantile hand row (target 4 -> 2 + 2/3)", fabs(v - (2 + 2.0 / 3)), 1e-15);
    tu_check("qb hist quantile hand row (target 2 -> end of bin 0)", fabs(v2 - 1), 0);
}

// ---------------------------------------------------------------------------
// pooling: one batch of 2N tokens or two micro-batches of N give the same bias

static void observe_split(lm_balancer *b, synth *big, int parts) {
    const int n = big->N / parts, E = big->E;
    int *cnt = lm_malloc(E * sizeof(int)), *off = lm_malloc((E + 1) * sizeof(int));
    int *rt = lm_malloc((size_t)n * big->k * sizeof(int)), *sr = lm_malloc((size_t)n * big->k * sizeof(int));
    for (int p = 0; p < parts; p++) {
        const real *s = big->s + (size_t)p * n * E;
        const int *idx = big->idx + (size_t)p * n * big->k;
        ops->moe_plan(cnt, off, rt, sr, idx, s, n, E, big->k, -1);
        lm_balancer_observe(b, ops, s, big->alpha + (size_t)p * n, cnt, off, n);
    }
    free(cnt); free(off); free(rt); free(sr);
}

static void test_pooling(void **state) {
    (void)state;
    const int E = 16, k = 2, N = 4096;
    lm_balance_kind kinds[3] = {LM_BAL_QB, LM_BAL_SIGN, LM_BAL_QUARTILE};
    for (int c = 0; c < 3; c++) {
        lm_rng r; lm_rng_seed(&r, 200);
        lm_balancer one, two;
        lm_balancer_init(&one, ops, kinds[c], E, k, 0, 1e-3);
        lm_balancer_init(&two, ops, kinds[c], E, k, 0, 1e-3);
        real *bias0 = tu_rand_uniform(E, &r, -0.3, 0.3);
        lm_balancer_set_bias(&one, ops, bias0);
        lm_balancer_set_bias(&two, ops, bias0);
        synth q;
        synth_init(&q, E, k, 2 * N);
        synth_draw(&q, &r);
        synth_route(&q, &one, -1);
        lm_balancer_observe(&one, ops, q.s, q.alpha, q.counts, q.offsets, 2 * N);
        observe_split(&two, &q, 2);
        lm_moe_metrics m1, m2;
        lm_balancer_update(&one, ops, &m1);
        lm_balancer_update(&two, ops, &m2);
        real b1[16], b2[16];
        lm_balancer_get_bias(&one, b1);
        lm_balancer_get_bias(&two, b2);
        char what[128];
        snprintf(what, sizeof what, "%s: bias from 1x%d tokens vs 2x%d (max abs diff)", lm_balance_name(kinds[c]), 2 * N, N);
        tu_check(what, tu_max_abs_diff(b1, b2, E), 0);
        int bad = m1.tokens != m2.tokens || m1.tokens != 2 * N;
        for (int j = 0; j < E; j++) bad += m1.loads[j] != m2.loads[j];
        snprintf(what, sizeof what, "%s: pooled loads and token counts (mismatches)", lm_balance_name(kinds[c]));
        tu_check(what, bad, 0);
        free(bias0);
        synth_free(&q);
        lm_balancer_free(&one, ops);
        lm_balancer_free(&two, ops);
    }
}

// ---------------------------------------------------------------------------
// the batched update (one download for every layer) against one update per balancer:
// three kinds side by side with a gap (a dense layer) in the list, two steps (the second
// reuses the transfer memory), a capacity plan (dropped tokens) on the qb layer

static void test_batched_update(void **state) {
    (void)state;
    const int E = 12, k = 2, N = 1024, nl = 4;
    const lm_balance_kind kinds[4] = {LM_BAL_QB, LM_BAL_SIGN, LM_BAL_NONE, LM_BAL_QUARTILE};
    lm_balancer one[4], all[4];
    lm_bal_xfer x = {0};
    for (int l = 0; l < nl; l++) {
        lm_balancer_init(&one[l], ops, kinds[l], E, k, 0, 1e-3);
        lm_balancer_init(&all[l], ops, kinds[l], E, k, 0, 1e-3);
    }
    lm_rng r;
    lm_rng_seed(&r, 77);
    synth q;
    synth_init(&q, E, k, N);
    int bad_bias = 0, bad_metrics = 0;
    for (int step = 0; step < 2; step++) {
        for (int u = 0; u < 3; u++)   // micro-batches
            for (int l = 0; l < nl; l++) {
                if (l == 2) continue;   // the gap: never observed, skipped by both paths
                synth_draw(&q, &r);
                synth_route(&q, &one[l], l == 0 ? N * k / E : -1);
                lm_balancer_observe(&one[l], ops, q.s, q.alpha, q.counts, l == 0 ? q.offsets : NULL, N);
                lm_balancer_observe(&all[l], ops, q.s, q.alpha, q.counts, l == 0 ? q.offsets : NULL, N);
            }
        lm_moe_metrics m1[4], m2[4];
        lm_balancer *list[4] = {&all[0], &all[1], NULL, &all[3]};
        for (int l = 0; l < nl; l++)
            if (l != 2) lm_balancer_update(&one[l], ops, &m1[l]);
        lm_balancers_update(list, nl, ops, m2, &x);
        for (int l = 0; l < nl; l++) {
            if (l == 2) continue;
            real b1[12], b2[12];
            lm_balancer_get_bias(&one[l], b1);
            lm_balancer_get_bias(&all[l], b2);
            bad_bias += tu_max_abs_diff(b1, b2, E) != 0;
            bad_metrics += m1[l].tokens != m2[l].tokens || m1[l].dropped != m2[l].dropped ||
                           m1[l].maxvio != m2[l].maxvio || m1[l].bias_std != m2[l].bias_std;
            for (int j = 0; j < E; j++) bad_metrics += m1[l].loads[j] != m2[l].loads[j];
        }
        tu_check("batched update: qb layer dropped tokens (> 0 expected)", m2[0].dropped > 0 ? 0 : 1, 0);
    }
    tu_check("batched update: biases differing from per-layer updates (layers x steps)", bad_bias, 0);
    tu_check("batched update: metrics differing from per-layer updates", bad_metrics, 0);
    lm_bal_xfer_free(&x, ops);
    synth_free(&q);
    for (int l = 0; l < nl; l++) {
        lm_balancer_free(&one[l], ops);
        lm_balancer_free(&all[l], ops);
    }
}

// ---------------------------------------------------------------------------
// causality: observe never changes the bias, so the selection a batch was routed
// with is the one computed before its statistics existed; only update moves b

static void test_causality(void **state) {
    (void)state;
    const int E = 16, k = 2, N = 2048;
    lm_balance_kind kinds[2] = {LM_BAL_QB, LM_BAL_SIGN};
    for (int c = 0; c < 2; c++) {
        lm_rng r; lm_rng_seed(&r, 300);
        lm_balancer b;
        lm_balancer_init(&b, ops, kinds[c], E, k, 0, 1e-3);
        synth q;
        synth_init(&q, E, k, N);
        int *idx_before = lm_malloc((size_t)N * k * sizeof(int));
        real before[16], after_obs[16], after_upd[16];
        int bias_moved_on_observe = 0, reroute_changed = 0, steps_moved = 0;
        for (int t = 0; t < 3; t++) {
            synth_draw(&q, &r);
            lm_balancer_get_bias(&b, before);
            synth_route(&q, &b, -1);
            memcpy(idx_before, q.idx, (size_t)N * k * sizeof(int));
            lm_balancer_observe(&b, ops, q.s, q.alpha, q.counts, q.offsets, N);
            lm_balancer_observe(&b, ops, q.s, q.alpha, q.counts, q.offsets, N);   // a second micro-batch
            lm_balancer_get_bias(&b, after_obs);
            bias_moved_on_observe += tu_max_abs_diff(before, after_obs, E) != 0;
            bias_moved_on_observe += memcmp(b.bias, before, E * sizeof(real)) != 0;   // the backend copy too
            synth_route(&q, &b, -1);   // same batch, after its statistics were observed
            reroute_changed += memcmp(idx_before, q.idx, (size_t)N * k * sizeof(int)) != 0;
            lm_balancer_update(&b, ops, NULL);
            lm_balancer_get_bias(&b, after_upd);
            steps_moved += tu_max_abs_diff(before, after_upd, E) > 0;
        }
        char what[128];
        snprintf(what, sizeof what, "%s: bias changed by observe (count over 3 steps)", lm_balance_name(kinds[c]));
        tu_check(what, bias_moved_on_observe, 0);
        snprintf(what, sizeof what, "%s: routing changed between route and update (count)", lm_balance_name(kinds[c]));
        tu_check(what, reroute_changed, 0);
        snprintf(what, sizeof what, "%s: steps whose update did not move the bias (count)", lm_balance_name(kinds[c]));
        tu_check(what, 3 - steps_moved, 0);
        free(idx_before);
        synth_free(&q);
        lm_balancer_free(&b, ops);
    }
}

// ---------------------------------------------------------------------------
// mean of the bias after a qb update is 0; its spread is not

static void test_qb_mean_zero(void **state) {
    (void)state;
    double means[DYN_STEPS];
    const int E = 16, k = 2, N = 4096;
    lm_rng r; lm_rng_seed(&r, 400);
    lm_balancer b;
    lm_balancer_init(&b, ops, LM_BAL_QB, E, k, 0, 0);
    real *bias0 = tu_rand_uniform(E, &r, 0.5, 1.5);   // start far from centred
    lm_balancer_set_bias(&b, ops, bias0);
    synth q;
    synth_init(&q, E, k, N);
    double worst = 0, spread = INFINITY;
    for (int t = 0; t < 4; t++) {
        synth_draw(&q, &r);
        synth_route(&q, &b, -1);
        lm_balancer_observe(&b, ops, q.s, q.alpha, q.counts, q.offsets, N);
        lm_moe_metrics m;
        lm_balancer_update(&b, ops, &m);
        double mean = 0, mn = INFINITY, mx = -INFINITY;
        for (int j = 0; j < E; j++) {
            mean += b.bias_host[j];
            mn = tu_least(mn, b.bias_host[j]);
            mx = tu_worst(mx, b.bias_host[j]);
        }
        means[t] = mean / E;
        worst = tu_worst(worst, fabs(means[t]));
        spread = tu_least(spread, mx - mn);
    }
    tu_check("qb |mean(bias)| after each update", worst, TOL(1e-15, 1e-7));
    tu_check("qb bias is not trivially 0 (1 / min spread < 100)", 1 / spread, 100);
    free(bias0);
    synth_free(&q);
    lm_balancer_free(&b, ops);
}

// ---------------------------------------------------------------------------
// hand-derivable rules and metrics on given loads

static void test_rules_and_metrics(void **state) {
    (void)state;
    const int E = 8, k = 2, N = 180;
    int loads[8] = {10, 20, 30, 40, 50, 60, 70, 80};   // Σ = 360 = N·k, mean 45
    const real u = 0.125;                               // exact in binary
    // sign: +u below the mean, −u above
    lm_balancer b;
    lm_balancer_init(&b, ops, LM_BAL_SIGN, E, k, 0, u);
    lm_balancer_observe(&b, ops, NULL, NULL, loads, NULL, N);
    lm_balancer_update(&b, ops, NULL);
    int bad = 0;
    for (int j = 0; j < E; j++) bad += b.bias_host[j] != (j < 4 ? u : -u);
    bad += memcmp(b.bias, b.bias_host, E * sizeof(real)) != 0;   // uploaded
    tu_check("sign rule b += u*sign(mean - load) (mismatches)", bad, 0);
    lm_balancer_free(&b, ops);
    // sign: a load equal to the mean does not move
    int l3[3] = {10, 45, 80};
    lm_balancer_init(&b, ops, LM_BAL_SIGN, 3, 1, 0, u);
    lm_balancer_observe(&b, ops, NULL, NULL, l3, NULL, 135);
    lm_balancer_update(&b, ops, NULL);
    bad = (b.bias_host[0] != u) + (b.bias_host[1] != 0) + (b.bias_host[2] != -u);
    tu_check("sign rule: load == mean keeps b (mismatches)", bad, 0);
    lm_balancer_free(&b, ops);
    // quartile: q25 = 27.5, q75 = 62.5 (linear interpolation) → 10, 20 up; 70, 80 down
    lm_balancer_init(&b, ops, LM_BAL_QUARTILE, E, k, 0, u);
    lm_balancer_observe(&b, ops, NULL, NULL, loads, NULL, N);
    lm_balancer_update(&b, ops, NULL);
    real want_q[8] = {u, u, 0, 0, 0, 0, -u, -u};
    bad = 0;
    for (int j = 0; j < E; j++) bad += b.bias_host[j] != want_q[j];
    tu_check("quartile rule (mismatches)", bad, 0);
    lm_balancer_free(&b, ops);

    // metrics, with a known bias, a dead expert and drops; two observes accumulate
    int l2[8] = {0, 10, 15, 20, 25, 30, 35, 45};      // Σ = 180 per observe, 360 per step
    real bias[8] = {-1, 1, 0, 0, 0, 0, 0, 0};          // min −1, max 1, std 0.5
    lm_balance_kind kinds[3] = {LM_BAL_AUX, LM_BAL_NONE, LM_BAL_QB};
    for (int c = 0; c < 3; c++) {
        lm_balancer_init(&b, ops, kinds[c], E, k, 0, u);
        lm_balancer_set_bias(&b, ops, bias);
        int offs[9] = {0};
        offs[8] = 170;   // 90 tokens · 2 = 180 assignments, 10 dropped per observe
        real *s = NULL, *alpha = NULL;
        if (kinds[c] == LM_BAL_QB) { s = tu_alloc(90 * E); alpha = tu_alloc(90); }
        lm_balancer_observe(&b, ops, s, alpha, l2, offs, 90);
        lm_balancer_observe(&b, ops, s, alpha, l2, offs, 90);
        lm_moe_metrics m;
        lm_balancer_update(&b, ops, &m);
        double H = 0;
        for (int j = 0; j < E; j++)
            if (l2[j]) H -= (2.0 * l2[j] / 360) * log(2.0 * l2[j] / 360);
        H /= log(8.0);
        bad = (m.tokens != 180) + (m.assignments != 360) + (m.dropped != 20) + (m.dead != 1) + (m.E != E);
        for (int j = 0; j < E; j++) bad += m.loads[j] != 2 * l2[j];
        bad += m.bias_min != -1 || m.bias_max != 1;
        char what[128];
        snprintf(what, sizeof what, "%s metrics: tokens, loads, dropped, dead, bias range (mismatches)", lm_balance_name(kinds[c]));
        tu_check(what, bad, 0);
        snprintf(what, sizeof what, "%s metrics: MaxVio (90 - 45)/45 = 1", lm_balance_name(kinds[c]));
        tu_check(what, fabs(m.maxvio - 1), 1e-15);
        snprintf(what, sizeof what, "%s metrics: normalised entropy vs direct", lm_balance_name(kinds[c]));
        tu_check(what, fabs(m.entropy - H), 1e-15);
        snprintf(what, sizeof what, "%s metrics: bias std = 0.5", lm_balance_name(kinds[c]));
        tu_check(what, fabs(m.bias_std - 0.5), 1e-15);
        if (kinds[c] != LM_BAL_QB) {
            real got[8];
            lm_balancer_get_bias(&b, got);
            snprintf(what, sizeof what, "%s: update leaves the bias (max abs change)", lm_balance_name(kinds[c]));
            tu_check(what, tu_max_abs_diff(got, bias, E), 0);
        }
        // accumulators were reset: an empty step reports zeros and keeps the bias
        real keep[8];
        lm_balancer_get_bias(&b, keep);
        lm_balancer_update(&b, ops, &m);
        real got2[8];
        lm_balancer_get_bias(&b, got2);
        bad = (m.tokens != 0) + (m.assignments != 0) + (m.maxvio != 0) + (m.dead != E) + (m.dropped != 0);
        bad += tu_max_abs_diff(got2, keep, E) != 0;
        snprintf(what, sizeof what, "%s: reset after update, empty step keeps bias (mismatches)", lm_balance_name(kinds[c]));
        tu_check(what, bad, 0);
        free(s); free(alpha);
        lm_balancer_free(&b, ops);
    }

    // a real capped plan: dropped = N·k − offsets[E] and loads are counts before dropping
    lm_rng r; lm_rng_seed(&r, 500);
    lm_balancer_init(&b, ops, LM_BAL_QB, 16, 2, 0, 0);
    synth q;
    synth_init(&q, 16, 2, 1024);
    synth_draw(&q, &r);
    int cap = lm_moe_capacity(1.0, 100, 0, 1024, 16, 2);
    synth_route(&q, &b, cap);
    lm_balancer_observe(&b, ops, q.s, q.alpha, q.counts, q.offsets, 1024);
    lm_moe_metrics m;
    lm_balancer_update(&b, ops, &m);
    int64_t want_drop = 0;
    bad = 0;
    for (int j = 0; j < 16; j++) {
        want_drop += q.counts[j] > cap ? q.counts[j] - cap : 0;
        bad += m.loads[j] != q.counts[j];
    }
    bad += m.dropped != want_drop || want_drop == 0;
    tu_check("capped plan: metrics dropped and pre-drop loads (mismatches)", bad, 0);
    synth_free(&q);
    lm_balancer_free(&b, ops);
}

// ---------------------------------------------------------------------------
static void test_names(void **state) {
    (void)state;
    const char *names[5] = {"qb", "sign", "quartile", "aux", "none"};
    lm_balance_kind want[5] = {LM_BAL_QB, LM_BAL_SIGN, LM_BAL_QUARTILE, LM_BAL_AUX, LM_BAL_NONE};
    int bad = 0;
    for (int i = 0; i < 5; i++) {
        lm_balance_kind k = LM_BAL_NONE;
        bad += lm_balance_parse(names[i], &k) != LM_OK || k != want[i] || strcmp(lm_balance_name(k), names[i]) != 0;
    }
    lm_balance_kind k = LM_BAL_SIGN;
    bad += lm_balance_parse("quantile", &k) != LM_ERR || k != LM_BAL_SIGN;
    bad += strstr(lm_last_error(), "quantile") == NULL;
    bad += lm_balance_parse("QB", &k) != LM_ERR || lm_balance_parse("", &k) != LM_ERR;
    tu_check("balance names parse, round-trip, unknown names rejected (mismatches)", bad, 0);
}

static void test_capacity_schedule(void **state) {
    (void)state;
    int bad = 0;
    bad += lm_moe_capacity(0, 100, 0, 4096, 16, 2) != -1;        // no capacity factor
    bad += lm_moe_capacity(1.25, 100, 100, 4096, 16, 2) != -1;   // relaxed
    bad += lm_moe_capacity(1.25, 0, 0, 4096, 16, 2) != -1;
    bad += lm_moe_capacity(1.25, 100, 0, 4096, 16, 2) != 640;    // 1.25 · 512
    bad += lm_moe_capacity(1.25, 100, 50, 4096, 16, 2) != 2368;  // (1.25 + 6.75/2) · 512
    bad += lm_moe_capacity(1.25, 100, 99, 4096, 16, 2) != 4062;  // ceil(7.9325 · 512)
    bad += lm_moe_capacity(10, 100, 0, 4096, 16, 2) != 4096;     // capped at N
    tu_check("capacity schedule values (mismatches)", bad, 0);
    // non-decreasing in the step
    int prev = 0, mono = 0;
    for (int t = 0; t < 100; t++) {
        int c = lm_moe_capacity(1.0, 100, t, 1000, 64, 6);
        mono += c < prev;
        prev = c;
    }
    tu_check("capacity schedule is non-decreasing (violations)", mono, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dynamics),      cmocka_unit_test(test_hist_quantile),
        cmocka_unit_test(test_pooling),       cmocka_unit_test(test_batched_update),
        cmocka_unit_test(test_causality),
        cmocka_unit_test(test_qb_mean_zero),  cmocka_unit_test(test_rules_and_metrics),
        cmocka_unit_test(test_names),         cmocka_unit_test(test_capacity_schedule),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
