// test_moe.c — the MoE feed-forward ops: sigmoid top-k router with selection-only
// bias (values, tie-breaking, alpha, gradients), dispatch plan (dropless and capped),
// gather, grouped GEMM, combine, auxiliary loss, z-loss, and a whole routed FFN built
// from these ops against a direct per-token loop.
#include "harness.h"
#include "cpu/cpu.h"

static const lm_ops *ops = &lm_cpu_ops;

// ---------------------------------------------------------------------------
// helpers

// Router logits z [N,E] whose top k+1 biased scores s + bias are pairwise at least
// `gap` apart (rows resampled until they are), so that a finite-difference step on one
// logit can never reorder the selection.
static real *gen_separated_logits(int N, int E, int k, const real *bias, double gap, lm_rng *r) {
    real *z = tu_alloc((size_t)N * E);
    real *v = tu_alloc(E);
    for (int i = 0; i < N; i++) {
        for (;;) {
            for (int j = 0; j < E; j++) {
                z[(size_t)i * E + j] = (real)(1.5 * lm_rng_normal(r));
                v[j] = lm_sigmoid(z[(size_t)i * E + j]) + (bias ? bias[j] : 0);
            }
            // selection-sort the top k+1 and check consecutive gaps
            int ok = 1;
            for (int t = 0; t < k + 1 && t < E; t++) {
                int b = t;
                for (int j = t + 1; j < E; j++) if (v[j] > v[b]) b = j;
                real tmp = v[t]; v[t] = v[b]; v[b] = tmp;
                if (t > 0 && v[t - 1] - v[t] < gap) ok = 0;
            }
            if (ok) break;
        }
    }
    free(v);
    return z;
}

typedef struct { real v; int j; } bv;
static int bv_cmp(const void *pa, const void *pb) {   // value descending, then lower index
    const bv *a = pa, *b = pb;
    if (a->v != b->v) return a->v > b->v ? -1 : 1;
    return a->j - b->j;
}

// ---------------------------------------------------------------------------
// router gradient: loss = Σ gate ⊙ P with the selection held fixed
typedef struct {
    int N, E, k, renorm;
    real scale;
    real *z, *bias, *gate, *s, *alpha, *P;
    int *idx, *idx_ref, flips;
} rt_ctx;
static double rt_loss(void *p) {
    rt_ctx *c = p;
    ops->moe_route_fwd(c->idx, c->gate, c->s, c->alpha, c->z, c->bias, c->N, c->E, c->k, c->scale, c->renorm);
    for (int a = 0; a < c->N * c->k; a++) c->flips += c->idx[a] != c->idx_ref[a];
    return tu_dot(c->gate, c->P, (size_t)c->N * c->k);
}
static void check_route_grad(int renorm, int with_bias) {
    lm_rng r; lm_rng_seed(&r, 11 + renorm + 2 * with_bias);
    rt_ctx c = {.N = 10, .E = 8, .k = 3, .renorm = renorm, .scale = 2.446};
    size_t NE = (size_t)c.N * c.E, NK = (size_t)c.N * c.k;
    c.bias = with_bias ? tu_rand_uniform(c.E, &r, -0.4, 0.4) : NULL;
    c.z = gen_separated_logits(c.N, c.E, c.k, c.bias, 0.02, &r);
    c.gate = tu_alloc(NK); c.s = tu_alloc(NE); c.alpha = tu_alloc(c.N); c.P = tu_randn(NK, &r, 1);
    c.idx = lm_malloc(NK * sizeof(int)); c.idx_ref = lm_malloc(NK * sizeof(int));
    ops->moe_route_fwd(c.idx_ref, c.gate, c.s, c.alpha, c.z, c.bias, c.N, c.E, c.k, c.scale, c.renorm);
    real *dz = tu_alloc(NE);
    ops->moe_route_bwd(dz, c.P, c.s, c.idx_ref, c.N, c.E, c.k, c.scale, c.renorm);
    char what[96];
    snprintf(what, sizeof what, "route d_z (renorm=%d, bias=%d)", renorm, with_bias);
    tu_check(what, tu_gradcheck(c.z, dz, NE, rt_loss, &c, TU_H, 400, &r), TOL(1e-8, 2e-2));
    snprintf(what, sizeof what, "route FD never flipped the selection (renorm=%d)", renorm);
    tu_check(what, c.flips, 0);
    // accumulation: a second backward doubles dz (s recomputed at the unperturbed z)
    ops->moe_route_fwd(c.idx, c.gate, c.s, c.alpha, c.z, c.bias, c.N, c.E, c.k, c.scale, c.renorm);
    real *dz2 = tu_copy(dz, NE);
    ops->moe_route_bwd(dz2, c.P, c.s, c.idx_ref, c.N, c.E, c.k, c.scale, c.renorm);
    for (size_t i = 0; i < NE; i++) dz[i] *= 2;
    tu_check("route bwd accumulates", tu_max_abs_diff(dz2, dz, NE), TOL(1e-15, 1e-6));
    free(c.z); free(c.bias); free(c.gate); free(c.s); free(c.alpha); free(c.P); free(c.idx); free(c.idx_ref);
    free(dz); free(dz2);
}
static void test_route_grad(void **state) {
    (void)state;
    check_route_grad(1, 0);
    check_route_grad(0, 0);
    check_route_grad(1, 1);   // selection from s + b, gradient through s only
}

// ---------------------------------------------------------------------------
// router values: selection by s + b with lower-index ties, alpha the (k+1)-th biased
// score, gates scale·s/Σs over the chosen experts (never the bias), bit for bit
static void test_route_values(void **state) {
    (void)state;
    lm_rng r; lm_rng_seed(&r, 21);
    const int N = 64, E = 16, k = 4;
    const real scale = 2.5;
    size_t NE = (size_t)N * E, NK = (size_t)N * k;
    real *z = tu_randn(NE, &r, 2), *bias = tu_rand_uniform(E, &r, -0.08, 0.08);
    real *s = tu_alloc(NE), *gate = tu_alloc(NK), *alpha = tu_alloc(N);
    real *s0 = tu_alloc(NE), *gate0 = tu_alloc(NK), *alpha0 = tu_alloc(N), *gate_pl = tu_alloc(NK);
    int *idx = lm_malloc(NK * sizeof(int)), *idx0 = lm_malloc(NK * sizeof(int)), *idx_pl = lm_malloc(NK * sizeof(int));
    ops->moe_route_fwd(idx, gate, s, alpha, z, bias, N, E, k, scale, 1);
    ops->moe_route_fwd(idx0, gate0, s0, alpha0, z, NULL, N, E, k, scale, 1);
    ops->moe_route_fwd(idx_pl, gate_pl, s0, alpha0, z, bias, N, E, k, scale, 0);
    int bad_s = 0, bad_idx = 0, bad_alpha = 0, bad_gate = 0, bad_plain = 0, changed = 0, same = 0, bad_same = 0;
    double reordered_maxd = 0;
    bv *v = lm_malloc((size_t)E * sizeof(bv));
    for (int i = 0; i < N; i++) {
        for (int j = 0; j < E; j++) {
            bad_s += s[i * E + j] != lm_sigmoid(z[i * E + j]);
            v[j].v = s[i * E + j] + bias[j];
            v[j].j = j;
        }
        qsort(v, E, sizeof *v, bv_cmp);
        real sum = 0;
        for (int t = 0; t < k; t++) {
            bad_idx += idx[i * k + t] != v[t].j;
            bad_idx += idx_pl[i * k + t] != v[t].j;
            sum += s[i * E + v[t].j];
        }
        bad_alpha += alpha[i] != v[k].v;
        for (int t = 0; t < k; t++) {
            real st = s[i * E + idx[i * k + t]];
            bad_gate += gate[i * k + t] != scale * (st / sum);
            bad_plain += gate_pl[i * k + t] != scale * st;
        }
        // the bias moves the selection, but an expert chosen with and without the bias
        // gets the same gate whenever the chosen set is the same: bit for bit when the
        // slot order is the same too, else up to the rounding of the sum's order
        int diff_order = 0, diff_set = 0;
        for (int t = 0; t < k; t++) {
            diff_order |= idx[i * k + t] != idx0[i * k + t];
            int found = 0;
            for (int u = 0; u < k; u++) found |= idx[i * k + t] == idx0[i * k + u];
            diff_set |= !found;
        }
        if (diff_set) changed++;
        else if (!diff_order) {
            same++;
            for (int t = 0; t < k; t++) bad_same += gate[i * k + t] != gate0[i * k + t];
        } else {
            for (int t = 0; t < k; t++)
                for (int u = 0; u < k; u++)
                    if (idx[i * k + t] == idx0[i * k + u])
                        reordered_maxd = tu_worst(reordered_maxd, fabs(gate[i * k + t] - gate0[i * k + u]));
        }
    }
    tu_check("route s == sigmoid(z) (mismatches)", bad_s, 0);
    tu_check("route idx == top-k of s+b by sort (mismatches)", bad_idx, 0);
    tu_check("route alpha == (k+1)-th biased score (mismatches)", bad_alpha, 0);
    tu_check("route renorm gate == scale*s/sum_chosen s (bitwise mismatches)", bad_gate, 0);
    tu_check("route plain gate == scale*s (bitwise mismatches)", bad_plain, 0);
    tu_check("route bias leaves gates of equal selections bitwise equal (mismatches)", bad_same, 0);
    tu_check("route bias: same set in another order, gate max abs diff", reordered_maxd, TOL(1e-15, 1e-6));
    printf("   route: bias changed the chosen set of %d of %d tokens, kept set and order of %d\n", changed, N, same);
    tu_check("route bias changes some selections (tokens changed > 0 expected; 1 = none)", changed > 0 ? 0 : 1, 0);
    tu_check("route some selections unchanged (1 = none)", same > 0 ? 0 : 1, 0);
    free(v); free(z); free(bias); free(s); free(gate); free(alpha); free(s0); free(gate0); free(alpha0); free(gate_pl);
    free(idx); free(idx0); free(idx_pl);
}

// NaN logits rank below every number, then by index (ops_math.h): the chosen experts are
// the numeric ones in order, then NaN ones by index — never one twice
static void test_route_nan(void **state) {
    (void)state;
    int idx[8];
    real gate[8], s[12], alpha[2];
    // E = 6, k = 3: row 0 has NaN at experts 1 and 4; row 1 is all NaN
    real z[12] = {0.5, NAN, 2, -1, NAN, 1, /**/ NAN, NAN, NAN, NAN, NAN, NAN};
    ops->moe_route_fwd(idx, gate, s, alpha, z, NULL, 2, 6, 3, 1, 1);
    const int want[6] = {2, 5, 0, /**/ 0, 1, 2};
    int bad = 0;
    for (int t = 0; t < 6; t++) bad += idx[t] != want[t];
    tu_check("route NaN: numeric experts first, then NaN ones by index (mismatches)", bad, 0);
    tu_check("route NaN: alpha is the 4th ranked (expert 3's score)", fabs(alpha[0] - lm_sigmoid((real)-1)), TOL(1e-15, 1e-6));
    tu_check("route NaN: an all-NaN token's alpha ranks as -inf (1 = not)", alpha[1] == -(real)INFINITY ? 0 : 1, 0);
}

// exact ties and the k == E convention, on hand-built inputs
static void test_route_ties(void **state) {
    (void)state;
    int idx[6];
    real gate[6], s[12], alpha[2];
    // E = 6, k = 2: row 0 all equal; row 1 a three-way tie for first place
    real z[12] = {0, 0, 0, 0, 0, 0, /**/ 0, 1, 1, 0, 1, -1};
    ops->moe_route_fwd(idx, gate, s, alpha, z, NULL, 2, 6, 2, 1, 1);
    int bad = (idx[0] != 0) + (idx[1] != 1) + (idx[2] != 1) + (idx[3] != 2);
    bad += alpha[0] != (real)0.5;                    // sigmoid(0) = 1/2 exactly, no bias
    bad += alpha[1] != lm_sigmoid(1);                // the tied third (expert 4)
    bad += gate[0] != (real)0.5 || gate[1] != (real)0.5 || gate[2] != (real)0.5 || gate[3] != (real)0.5;
    tu_check("route ties go to the lower expert index (mismatches)", bad, 0);
    // ties created by the bias: all s equal, experts 1, 2, 4 raised equally
    real z2[6] = {2, 2, 2, 2, 2, 2}, b2[6] = {0, 0.25, 0.25, 0, 0.25, 0};
    ops->moe_route_fwd(idx, gate, s, alpha, z2, b2, 1, 6, 2, 2, 1);
    bad = (idx[0] != 1) + (idx[1] != 2) + (alpha[0] != lm_sigmoid(2) + (real)0.25);
    bad += gate[0] != (real)1 || gate[1] != (real)1;   // renormalised raw s, scale 2: the bias is absent
    tu_check("route biased ties and gates without bias (mismatches)", bad, 0);
    // k == E: every expert chosen in order; alpha = smallest biased score − 1
    real z3[3] = {0.5, -1, 2}, b3[3] = {0.1, 0, -0.1};
    ops->moe_route_fwd(idx, gate, s, alpha, z3, b3, 1, 3, 3, 1, 1);
    bad = (idx[0] != 2) + (idx[1] != 0) + (idx[2] != 1) + (alpha[0] != lm_sigmoid(-1) + (real)0 - 1);
    tu_check("route k == E: alpha = k-th biased score - 1 (mismatches)", bad, 0);
}

// ---------------------------------------------------------------------------
// plan

typedef struct {
    int N, E, k;
    int *idx, *counts, *offsets, *row_token, *slot_row;
    real *s;
} plan_t;

static plan_t make_plan(int N, int E, int k, const real *bias, int capacity, lm_rng *r, real **z_out) {
    plan_t p = {.N = N, .E = E, .k = k};
    size_t NK = (size_t)N * k;
    real *z = tu_randn((size_t)N * E, r, 1.5);
    real *gate = tu_alloc(NK), *alpha = tu_alloc(N);
    p.s = tu_alloc((size_t)N * E);
    p.idx = lm_malloc((NK ? NK : 1) * sizeof(int));
    p.counts = lm_malloc(E * sizeof(int));
    p.offsets = lm_malloc((E + 1) * sizeof(int));
    p.row_token = lm_malloc((NK ? NK : 1) * sizeof(int));
    p.slot_row = lm_malloc((NK ? NK : 1) * sizeof(int));
    ops->moe_route_fwd(p.idx, gate, p.s, alpha, z, bias, N, E, k, 1, 1);
    ops->moe_plan(p.counts, p.offsets, p.row_token, p.slot_row, p.idx, p.s, N, E, k, capacity);
    free(gate); free(alpha);
    if (z_out) *z_out = z;
    else free(z);
    return p;
}
static void free_plan(plan_t *p) {
    free(p->idx); free(p->counts); free(p->offsets); free(p->row_token); free(p->slot_row); free(p->s);
}

// structural invariants shared by dropless and capped plans; returns violations
static int plan_violations(const plan_t *p, int capacity) {
    const int N = p->N, E = p->E, k = p->k;
    int bad = 0;
    const int rows = p->offsets[E];
    int *direct = lm_malloc(E * sizeof(int)), *seen = lm_malloc(((size_t)N * k + 1) * sizeof(int));
    for (int a = 0; a < N * k; a++) direct[p->idx[a]]++;
    bad += p->offsets[0] != 0;
    for (int e = 0; e < E; e++) {
        bad += p->counts[e] != direct[e];
        int keep = capacity < 0 ? direct[e] : lm_min(direct[e], capacity);
        bad += p->offsets[e + 1] - p->offsets[e] != keep;
        for (int r = p->offsets[e] + 1; r < p->offsets[e + 1]; r++) bad += p->row_token[r] <= p->row_token[r - 1];
    }
    // every (token, slot) names a row of its expert serving it, or −1 only when capped
    int dropped = 0;
    for (int i = 0; i < N; i++)
        for (int t = 0; t < k; t++) {
            int r = p->slot_row[i * k + t], e = p->idx[i * k + t];
            if (r < 0) { dropped++; continue; }
            bad += r >= rows || p->row_token[r] != i || r < p->offsets[e] || r >= p->offsets[e + 1];
            if (r < rows) seen[r]++;
        }
    for (int r = 0; r < rows; r++) bad += seen[r] != 1;
    for (int r = rows; r < N * k; r++) bad += p->row_token[r] != -1;
    bad += dropped != N * k - rows;
    if (capacity < 0) bad += dropped != 0 || rows != N * k;
    free(direct); free(seen);
    return bad;
}

static void test_plan_dropless(void **state) {
    (void)state;
    lm_rng r; lm_rng_seed(&r, 31);
    plan_t p = make_plan(50, 8, 3, NULL, -1, &r, NULL);
    tu_check("plan dropless: counts, segments by token, each (token,slot) once (violations)",
             plan_violations(&p, -1), 0);
    free_plan(&p);
    // N = 0: nothing routed, offsets all 0
    plan_t q = make_plan(0, 4, 2, NULL, -1, &r, NULL);
    int bad = 0;
    for (int e = 0; e <= 4; e++) bad += q.offsets[e] != 0;
    for (int e = 0; e < 4; e++) bad += q.counts[e] != 0;
    tu_check("plan N = 0 (violations)", bad, 0);
    free_plan(&q);
}

static void test_plan_capacity(void **state) {
    (void)state;
    lm_rng r; lm_rng_seed(&r, 32);
    const int N = 60, E = 8, k = 3, C = 14;   // mean load 22.5: most experts overflow
    // a bias that skews loads, so some experts are far over capacity and some under
    real bias[8] = {0.4, 0.3, 0.2, 0, 0, -0.2, -0.3, -0.4};
    plan_t p = make_plan(N, E, k, bias, C, &r, NULL);
    tu_check("plan capacity: structure (violations)", plan_violations(&p, C), 0);
    // survivors are the highest-s tokens: every kept (s, token) beats every dropped one
    int bad = 0, under = 0, over = 0;
    for (int e = 0; e < E; e++) {
        under += p.counts[e] < C;
        over += p.counts[e] > C;
        for (int i = 0; i < N; i++)
            for (int t = 0; t < k; t++) {
                if (p.idx[i * k + t] != e || p.slot_row[i * k + t] >= 0) continue;
                real sd = p.s[i * E + e];   // a dropped token of expert e
                for (int rr = p.offsets[e]; rr < p.offsets[e + 1]; rr++) {
                    int kt = p.row_token[rr];
                    real sk = p.s[kt * E + e];
                    bad += !(sk > sd || (sk == sd && kt < i));
                }
            }
    }
    tu_check("plan capacity keeps the highest-score tokens (violations)", bad, 0);
    tu_check("plan capacity test has experts over and under C (1 = not)", over > 0 && under > 0 ? 0 : 1, 0);
    free_plan(&p);

    // hand-built ties: 4 identical tokens all choose experts {0, 1}; C = 2 keeps tokens 0, 1
    int idx[8] = {0, 1, 0, 1, 0, 1, 0, 1}, counts[4], offsets[5], row_token[8], slot_row[8];
    real s[16];
    for (int i = 0; i < 16; i++) s[i] = (real)0.7;
    ops->moe_plan(counts, offsets, row_token, slot_row, idx, s, 4, 4, 2, 2);
    int want_sr[8] = {0, 2, 1, 3, -1, -1, -1, -1}, want_rt[8] = {0, 1, 0, 1, -1, -1, -1, -1};
    bad = (counts[0] != 4) + (counts[1] != 4) + (counts[2] != 0) + (counts[3] != 0);
    bad += (offsets[1] != 2) + (offsets[2] != 4) + (offsets[3] != 4) + (offsets[4] != 4);
    for (int a = 0; a < 8; a++) bad += (slot_row[a] != want_sr[a]) + (row_token[a] != want_rt[a]);
    tu_check("plan capacity ties go to the lower token index (mismatches)", bad, 0);

    // C = 0 drops everything; C ≥ every count equals the dropless plan bit for bit
    lm_rng_seed(&r, 33);
    plan_t z0 = make_plan(20, 4, 2, NULL, 0, &r, NULL);
    tu_check("plan capacity 0 drops all (violations)", plan_violations(&z0, 0) + (z0.offsets[4] != 0), 0);
    free_plan(&z0);
    lm_rng_seed(&r, 34);
    plan_t big = make_plan(20, 4, 2, NULL, 20, &r, NULL);
    lm_rng_seed(&r, 34);
    plan_t dl = make_plan(20, 4, 2, NULL, -1, &r, NULL);
    bad = memcmp(big.offsets, dl.offsets, 5 * sizeof(int)) != 0;
    bad += memcmp(big.row_token, dl.row_token, 40 * sizeof(int)) != 0;
    bad += memcmp(big.slot_row, dl.slot_row, 40 * sizeof(int)) != 0;
    tu_check("plan capacity >= N equals dropless (mismatches)", bad, 0);
    free_plan(&big); free_plan(&dl);
}

// ---------------------------------------------------------------------------
// gather: loss = Σ xp ⊙ P
typedef struct { int E, C; const plan_t *p; real *x, *xp, *P; } ga_ctx;
static double ga_loss(void *q) {
    ga_ctx *c = q;
    ops->moe_gather_fwd(c->xp, c->x, c->p->row_token, c->p->offsets, c->E, c->C);
    return tu_dot(c->xp, c->P, (size_t)c->p->offsets[c->E] * c->C);
}
static void test_gather(void **state) {
    (void)state;
    lm_rng r; lm_rng_seed(&r, 41);
    const int N = 12, E = 6, k = 3, C = 37;   // C spans two channel blocks of the backward
    plan_t p = make_plan(N, E, k, NULL, -1, &r, NULL);
    ga_ctx c = {.E = E, .C = C, .p = &p};
    c.x = tu_randn((size_t)N * C, &r, 1); c.xp = tu_alloc((size_t)N * k * C); c.P = tu_randn((size_t)N * k * C, &r, 1);
    ga_loss(&c);
    int bad = 0;
    for (int rr = 0; rr < p.offsets[E]; rr++)
        bad += memcmp(c.xp + (size_t)rr * C, c.x + (size_t)p.row_token[rr] * C, C * sizeof(real)) != 0;
    tu_check("gather fwd copies rows exactly (mismatches)", bad, 0);
    real *dx = tu_alloc((size_t)N * C);
    ops->moe_gather_bwd(dx, c.P, p.row_token, p.offsets, E, C, N * k);
    tu_check("gather d_x (k rows per token)", tu_gradcheck(c.x, dx, (size_t)N * C, ga_loss, &c, TU_H, 300, &r),
             TOL(1e-8, 1e-2));
    free(c.x); free(c.xp); free(c.P); free(dx); free_plan(&p);
}

// ---------------------------------------------------------------------------
// grouped matmul: loss = Σ out ⊙ P over the used rows
typedef struct { int E, C, OC, R; const int *offsets; real *inp, *W, *out, *P; } gm_ctx;
static double gm_loss(void *q) {
    gm_ctx *c = q;
    ops->grouped_matmul_fwd(c->out, c->inp, c->W, c->offsets, c->E, c->C, c->OC, c->R);
    return tu_dot(c->out, c->P, (size_t)c->offsets[c->E] * c->OC);
}
static void test_grouped_matmul(void **state) {
    (void)state;
    lm_rng r; lm_rng_seed(&r, 51);
    // expert segments of 5, 0 (empty), 3, 7, 1 rows; 2 spare rows past offsets[E]
    const int E = 5, C = 9, OC = 6, R = 18;
    int offsets[6] = {0, 5, 5, 8, 15, 16};
    gm_ctx c = {.E = E, .C = C, .OC = OC, .R = R, .offsets = offsets};
    c.inp = tu_randn((size_t)R * C, &r, 1); c.W = tu_randn((size_t)E * OC * C, &r, 0.5);
    c.out = tu_alloc((size_t)R * OC); c.P = tu_randn((size_t)R * OC, &r, 1);
    for (int i = 16 * OC; i < R * OC; i++) c.out[i] = 7;   // must stay untouched
    gm_loss(&c);
    double maxd = 0;
    for (int e = 0; e < E; e++)
        for (int rr = offsets[e]; rr < offsets[e + 1]; rr++)
            for (int o = 0; o < OC; o++) {
                double acc = 0;
                for (int q = 0; q < C; q++) acc += (double)c.inp[rr * C + q] * c.W[((size_t)e * OC + o) * C + q];
                maxd = tu_worst(maxd, fabs(acc - c.out[rr * OC + o]));
            }
    tu_check("grouped_matmul fwd vs direct loop (max abs)", maxd, TOL(1e-12, 1e-5));
    int untouched = 0;
    for (int i = 16 * OC; i < R * OC; i++) untouched += c.out[i] != 7;
    tu_check("grouped_matmul leaves rows past offsets[E] (mismatches)", untouched, 0);
    real *dinp = tu_alloc((size_t)R * C), *dW = tu_alloc((size_t)E * OC * C);
    ops->grouped_matmul_bwd(dinp, dW, c.P, c.inp, c.W, offsets, E, C, OC, R);
    tu_check("grouped_matmul d_inp", tu_gradcheck(c.inp, dinp, (size_t)16 * C, gm_loss, &c, TU_H, 300, &r),
             TOL(1e-8, 1e-2));
    tu_check("grouped_matmul d_W (incl. empty expert)",
             tu_gradcheck(c.W, dW, (size_t)E * OC * C, gm_loss, &c, TU_H, 300, &r), TOL(1e-8, 1e-2));
    // NULL gradients are allowed and the rest still accumulates
    real *dW2 = tu_copy(dW, (size_t)E * OC * C);
    ops->grouped_matmul_bwd(NULL, dW2, c.P, c.inp, c.W, offsets, E, C, OC, R);
    for (int i = 0; i < E * OC * C; i++) dW[i] *= 2;
    tu_check("grouped_matmul bwd accumulates (dinp NULL)", tu_rel_rms(dW2, dW, (size_t)E * OC * C), TOL(1e-14, 1e-6));
    free(c.inp); free(c.W); free(c.out); free(c.P); free(dinp); free(dW); free(dW2);
}

// ---------------------------------------------------------------------------
// combine with dropped slots: loss = Σ y ⊙ P
typedef struct { int N, k, C; const int *slot_row; real *y, *yp, *gate, *P; } cb_ctx;
static double cb_loss(void *q) {
    cb_ctx *c = q;
    memset(c->y, 0, (size_t)c->N * c->C * sizeof(real));
    ops->moe_combine_fwd(c->y, c->yp, c->gate, c->slot_row, c->N, c->k, c->C);
    return tu_dot(c->y, c->P, (size_t)c->N * c->C);
}
static void test_combine(void **state) {
    (void)state;
    lm_rng r; lm_rng_seed(&r, 61);
    const int N = 16, E = 4, k = 2, C = 7;
    plan_t p = make_plan(N, E, k, NULL, 5, &r, NULL);   // capacity 5 < mean load 8: drops
    const int rows = p.offsets[E];
    cb_ctx c = {.N = N, .k = k, .C = C, .slot_row = p.slot_row};
    c.y = tu_alloc((size_t)N * C); c.yp = tu_randn((size_t)N * k * C, &r, 1);
    c.gate = tu_rand_uniform((size_t)N * k, &r, 0.2, 1.5); c.P = tu_randn((size_t)N * C, &r, 1);
    int ndrop = 0;
    for (int a = 0; a < N * k; a++) ndrop += p.slot_row[a] < 0;
    // y starts from a residual and is accumulated into
    real *res = tu_randn((size_t)N * C, &r, 1);
    memcpy(c.y, res, (size_t)N * C * sizeof(real));
    ops->moe_combine_fwd(c.y, c.yp, c.gate, p.slot_row, N, k, C);
    double maxd = 0;
    for (int i = 0; i < N; i++)
        for (int q = 0; q < C; q++) {
            double acc = res[i * C + q];
            for (int t = 0; t < k; t++)
                if (p.slot_row[i * k + t] >= 0) acc += (double)c.gate[i * k + t] * c.yp[p.slot_row[i * k + t] * C + q];
            maxd = tu_worst(maxd, fabs(acc - c.y[i * C + q]));
        }
    tu_check("combine fwd (+= into residual, dropped skipped) vs loop", maxd, TOL(1e-12, 1e-5));
    tu_check("combine test has dropped slots (1 = none)", ndrop > 0 ? 0 : 1, 0);
    real *dyp = tu_alloc((size_t)N * k * C), *dg = tu_alloc((size_t)N * k);
    ops->moe_combine_bwd(dyp, dg, c.P, c.yp, c.gate, p.slot_row, N, k, C);
    tu_check("combine d_yp", tu_gradcheck(c.yp, dyp, (size_t)rows * C, cb_loss, &c, TU_H, 300, &r), TOL(1e-8, 1e-2));
    tu_check("combine d_gate (dropped slots get 0)", tu_gradcheck(c.gate, dg, (size_t)N * k, cb_loss, &c, TU_H, 300, &r),
             TOL(1e-8, 1e-2));
    double dropped_grad = 0;
    for (int a = 0; a < N * k; a++) if (p.slot_row[a] < 0) dropped_grad += fabs(dg[a]);
    tu_check("combine d_gate of dropped slots is exactly 0", dropped_grad, 0);
    free(c.y); free(c.yp); free(c.gate); free(c.P); free(res); free(dyp); free(dg); free_plan(&p);
}

// ---------------------------------------------------------------------------
// aux loss: through s = sigmoid(z), counts held fixed
typedef struct { int N, E, k; real coef; const int *counts; real *z, *s; } ax_ctx;
static double ax_loss(void *q) {
    ax_ctx *c = q;
    for (int a = 0; a < c->N * c->E; a++) c->s[a] = lm_sigmoid(c->z[a]);
    return ops->moe_aux_fwd(c->s, c->counts, c->N, c->E, c->k, c->coef);
}
static void test_aux_loss(void **state) {
    (void)state;
    lm_rng r; lm_rng_seed(&r, 71);
    const int N = 20, E = 6, k = 2;
    real *zz;
    plan_t p = make_plan(N, E, k, NULL, -1, &r, &zz);
    ax_ctx c = {.N = N, .E = E, .k = k, .coef = 0.01, .counts = p.counts, .z = zz, .s = tu_alloc((size_t)N * E)};
    double L = ax_loss(&c);
    // independent form: a·E·Σ_j f_j P_j
    double want = 0;
    for (int j = 0; j < E; j++) {
        double P = 0;
        for (int i = 0; i < N; i++) {
            double S = 0;
            for (int l = 0; l < E; l++) S += c.s[i * E + l];
            P += c.s[i * E + j] / S;
        }
        want += (double)p.counts[j] / (N * k) * P / N;
    }
    want *= 0.01 * E;
    tu_check("aux loss value vs a*E*sum f_j P_j (rel)", fabs(L - want) / want, TOL(1e-13, 1e-6));
    real *dz = tu_alloc((size_t)N * E);
    ops->moe_aux_bwd(dz, c.s, p.counts, N, E, k, c.coef, 1.5);
    for (int a = 0; a < N * E; a++) dz[a] /= 1.5;   // dloss scaling
    // the loss is O(coef) while one logit moves it by O(coef/N) with near-cancelling
    // terms, so the rounding floor eps·L/h of central differences is ~N times higher
    // than usual: a 10× larger step in f64 keeps truncation (~h²) far below it
    tu_check("aux loss d_z", tu_gradcheck(c.z, dz, (size_t)N * E, ax_loss, &c, TOL(1e-5, 1e-2), 300, &r),
             TOL(1e-8, 2e-2));
    // balanced routing and equal scores give exactly coef: f_j = 1/E, P_j = 1/E
    int cnt[4] = {5, 5, 5, 5};
    real s4[40];
    for (int a = 0; a < 40; a++) s4[a] = (real)0.3;
    tu_check("aux loss of a uniform router == coef", fabs(ops->moe_aux_fwd(s4, cnt, 10, 4, 2, 0.01) - 0.01),
             TOL(1e-15, 1e-8));
    free(zz); free(c.s); free(dz); free_plan(&p);
}

// z-loss
typedef struct { int N, E; real coef; real *z; } zl_ctx;
static double zl_loss(void *q) {
    zl_ctx *c = q;
    return ops->moe_zloss_fwd(c->z, c->N, c->E, c->coef);
}
static void test_zloss(void **state) {
    (void)state;
    lm_rng r; lm_rng_seed(&r, 81);
    zl_ctx c = {.N = 9, .E = 7, .coef = 1e-3};
    c.z = tu_randn(63, &r, 3);
    real *dz = tu_alloc(63);
    ops->moe_zloss_bwd(dz, c.z, c.N, c.E, c.coef, 1);
    tu_check("zloss d_z", tu_gradcheck(c.z, dz, 63, zl_loss, &c, TU_H, 100, &r), TOL(1e-8, 2e-2));
    // zero logits: lse = log E, loss = coef · (log E)²; huge logits stay finite
    real z0[14] = {0}, zbig[2] = {1000, 999};
    double want = 1e-3 * log(7.0) * log(7.0);
    tu_check("zloss of zero logits == coef*(log E)^2 (rel)", fabs(ops->moe_zloss_fwd(z0, 2, 7, 1e-3) - want) / want,
             TOL(1e-14, 1e-6));
    double big = ops->moe_zloss_fwd(zbig, 1, 2, 1), wbig = pow(1000 + log1p(exp(-1.0)), 2);
    tu_check("zloss large logits (no overflow, rel)", fabs(big - wbig) / wbig, TOL(1e-14, 1e-6));
    free(c.z); free(dz);
}

// ---------------------------------------------------------------------------
// a whole routed FFN from the ops: route → plan → gather → grouped W1, W3 → GLU →
// grouped W2 → combine, against a direct per-token loop; and its gradient chain
typedef struct {
    int N, C, F, E, k, act, cap;
    real scale;
    real *x, *z, *bias, *W1, *W3, *W2, *P;
    // workspace
    int *idx, *counts, *offsets, *row_token, *slot_row, *idx_ref, flips;
    real *gate, *s, *alpha, *xp, *g, *u, *h, *yp, *y;
} ffn_ctx;

static void ffn_forward(ffn_ctx *c) {
    const int N = c->N, C = c->C, F = c->F, E = c->E, k = c->k;
    ops->moe_route_fwd(c->idx, c->gate, c->s, c->alpha, c->z, c->bias, N, E, k, c->scale, 1);
    ops->moe_plan(c->counts, c->offsets, c->row_token, c->slot_row, c->idx, c->s, N, E, k, c->cap);
    ops->moe_gather_fwd(c->xp, c->x, c->row_token, c->offsets, E, C);
    ops->grouped_matmul_fwd(c->g, c->xp, c->W1, c->offsets, E, C, F, N * k);
    ops->grouped_matmul_fwd(c->u, c->xp, c->W3, c->offsets, E, C, F, N * k);
    ops->glu_fwd(c->h, c->g, c->u, (size_t)c->offsets[E] * F, c->act, NULL);
    ops->grouped_matmul_fwd(c->yp, c->h, c->W2, c->offsets, E, F, C, N * k);
    memset(c->y, 0, (size_t)N * C * sizeof(real));
    ops->moe_combine_fwd(c->y, c->yp, c->gate, c->slot_row, N, k, C);
}
static double ffn_loss(void *q) {
    ffn_ctx *c = q;
    ffn_forward(c);
    for (int a = 0; a < c->N * c->k; a++) c->flips += c->idx[a] != c->idx_ref[a];
    return tu_dot(c->y, c->P, (size_t)c->N * c->C);
}

static void ffn_setup(ffn_ctx *c, lm_rng *r) {
    const int N = c->N, C = c->C, F = c->F, E = c->E, k = c->k;
    size_t NK = (size_t)N * k;
    c->x = tu_randn((size_t)N * C, r, 1);
    c->bias = tu_rand_uniform(E, r, -0.3, 0.3);
    c->z = gen_separated_logits(N, E, k, c->bias, 0.02, r);
    c->W1 = tu_randn((size_t)E * F * C, r, 0.5); c->W3 = tu_randn((size_t)E * F * C, r, 0.5);
    c->W2 = tu_randn((size_t)E * C * F, r, 0.5); c->P = tu_randn((size_t)N * C, r, 1);
    c->idx = lm_malloc(NK * sizeof(int)); c->idx_ref = lm_malloc(NK * sizeof(int));
    c->counts = lm_malloc(E * sizeof(int)); c->offsets = lm_malloc((E + 1) * sizeof(int));
    c->row_token = lm_malloc(NK * sizeof(int)); c->slot_row = lm_malloc(NK * sizeof(int));
    c->gate = tu_alloc(NK); c->s = tu_alloc((size_t)N * E); c->alpha = tu_alloc(N);
    c->xp = tu_alloc(NK * C); c->g = tu_alloc(NK * F); c->u = tu_alloc(NK * F); c->h = tu_alloc(NK * F);
    c->yp = tu_alloc(NK * C); c->y = tu_alloc((size_t)N * C);
}
static void ffn_free(ffn_ctx *c) {
    free(c->x); free(c->z); free(c->bias); free(c->W1); free(c->W3); free(c->W2); free(c->P);
    free(c->idx); free(c->idx_ref); free(c->counts); free(c->offsets); free(c->row_token); free(c->slot_row);
    free(c->gate); free(c->s); free(c->alpha); free(c->xp); free(c->g); free(c->u); free(c->h); free(c->yp); free(c->y);
}

// direct per-token loop over the chosen experts (drops read from slot_row when capped)
static double ffn_direct_maxdiff(const ffn_ctx *c) {
    const int C = c->C, F = c->F, k = c->k;
    double maxd = 0, *hh = lm_malloc(F * sizeof(double));
    for (int i = 0; i < c->N; i++) {
        const real *xi = c->x + (size_t)i * C;
        for (int q = 0; q < C; q++) {
            double acc = 0;
            for (int t = 0; t < k; t++) {
                if (c->slot_row[i * k + t] < 0) continue;
                int e = c->idx[i * k + t];
                for (int f = 0; f < F; f++) {
                    double a = 0, b = 0;
                    for (int p = 0; p < C; p++) {
                        a += (double)c->W1[((size_t)e * F + f) * C + p] * xi[p];
                        b += (double)c->W3[((size_t)e * F + f) * C + p] * xi[p];
                    }
                    double hv;
                    if (c->act == LM_ACT_SITU) hv = 4 * tanh(a / 4) / (1 + exp(-a)) * 25 * tanh(b / 25);
                    else hv = a / (1 + exp(-a)) * b;
                    hh[f] = hv;
                }
                double o = 0;
                for (int f = 0; f < F; f++) o += (double)c->W2[((size_t)e * C + q) * F + f] * hh[f];
                acc += (double)c->gate[i * k + t] * o;
            }
            maxd = tu_worst(maxd, fabs(acc - c->y[(size_t)i * C + q]) / (1 + fabs(acc)));
        }
    }
    free(hh);
    return maxd;
}

static void test_moe_ffn(void **state) {
    (void)state;
    lm_rng r; lm_rng_seed(&r, 91);
    ffn_ctx c = {.N = 14, .C = 10, .F = 6, .E = 6, .k = 2, .act = LM_ACT_SWIGLU, .cap = -1, .scale = 2.446};
    ffn_setup(&c, &r);
    ffn_forward(&c);
    tu_check("moe ffn (dropless, swiglu) vs per-token loop (rel)", ffn_direct_maxdiff(&c), TOL(1e-12, 1e-5));
    c.act = LM_ACT_SITU;
    ffn_forward(&c);
    tu_check("moe ffn (dropless, situ) vs per-token loop (rel)", ffn_direct_maxdiff(&c), TOL(1e-12, 1e-5));
    c.act = LM_ACT_SWIGLU; c.cap = 3;   // mean load 14·2/6 ≈ 4.7
    ffn_forward(&c);
    int rows = c.offsets[c.E];
    tu_check("moe ffn (capacity 3, drops) vs per-token loop (rel)", ffn_direct_maxdiff(&c), TOL(1e-12, 1e-5));
    tu_check("moe ffn capacity run dropped something (1 = no)", rows < c.N * c.k ? 0 : 1, 0);

    // gradient of the whole chain (dropless) against finite differences
    c.cap = -1;
    ffn_forward(&c);
    memcpy(c.idx_ref, c.idx, (size_t)c.N * c.k * sizeof(int));
    const int N = c.N, C = c.C, F = c.F, E = c.E, k = c.k;
    size_t NK = (size_t)N * k;
    real *dyp = tu_alloc(NK * C), *dgate = tu_alloc(NK), *dh = tu_alloc(NK * F), *dg = tu_alloc(NK * F),
         *du = tu_alloc(NK * F), *dxp = tu_alloc(NK * C), *dx = tu_alloc((size_t)N * C), *dz = tu_alloc((size_t)N * E),
         *dW1 = tu_alloc((size_t)E * F * C), *dW3 = tu_alloc((size_t)E * F * C), *dW2 = tu_alloc((size_t)E * C * F);
    ops->moe_combine_bwd(dyp, dgate, c.P, c.yp, c.gate, c.slot_row, N, k, C);
    ops->grouped_matmul_bwd(dh, dW2, dyp, c.h, c.W2, c.offsets, E, F, C, (int)NK);
    ops->glu_bwd(dg, du, dh, c.g, c.u, NK * F, c.act);
    ops->grouped_matmul_bwd(dxp, dW1, dg, c.xp, c.W1, c.offsets, E, C, F, (int)NK);
    ops->grouped_matmul_bwd(dxp, dW3, du, c.xp, c.W3, c.offsets, E, C, F, (int)NK);
    ops->moe_gather_bwd(dx, dxp, c.row_token, c.offsets, E, C, (int)NK);
    ops->moe_route_bwd(dz, dgate, c.s, c.idx, N, E, k, c.scale, 1);
    tu_check("moe ffn chain d_x", tu_gradcheck(c.x, dx, (size_t)N * C, ffn_loss, &c, TU_H, 150, &r), TOL(1e-7, 2e-2));
    tu_check("moe ffn chain d_W1", tu_gradcheck(c.W1, dW1, (size_t)E * F * C, ffn_loss, &c, TU_H, 150, &r), TOL(1e-7, 2e-2));
    tu_check("moe ffn chain d_W3", tu_gradcheck(c.W3, dW3, (size_t)E * F * C, ffn_loss, &c, TU_H, 150, &r), TOL(1e-7, 2e-2));
    tu_check("moe ffn chain d_W2", tu_gradcheck(c.W2, dW2, (size_t)E * C * F, ffn_loss, &c, TU_H, 150, &r), TOL(1e-7, 2e-2));
    tu_check("moe ffn chain d_z (router)", tu_gradcheck(c.z, dz, (size_t)N * E, ffn_loss, &c, TU_H, 150, &r), TOL(1e-7, 2e-2));
    tu_check("moe ffn FD never flipped the selection", c.flips, 0);
    free(dyp); free(dgate); free(dh); free(dg); free(du); free(dxp); free(dx); free(dz); free(dW1); free(dW3); free(dW2);
    ffn_free(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_route_grad),     cmocka_unit_test(test_route_values), cmocka_unit_test(test_route_nan),
        cmocka_unit_test(test_route_ties),     cmocka_unit_test(test_plan_dropless),
        cmocka_unit_test(test_plan_capacity),  cmocka_unit_test(test_gather),
        cmocka_unit_test(test_grouped_matmul), cmocka_unit_test(test_combine),
        cmocka_unit_test(test_aux_loss),       cmocka_unit_test(test_zloss),
        cmocka_unit_test(test_moe_ffn),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
