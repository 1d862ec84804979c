// balancer.c — see balancer.h. All arithmetic here is on E host values per layer per
// step; the per-token work (histogram of margins) is the backend's qb_hist_accum.
#include "model/balancer.h"

static const char *const kind_names[] = {
    [LM_BAL_QB] = "qb", [LM_BAL_SIGN] = "sign", [LM_BAL_QUARTILE] = "quartile",
    [LM_BAL_AUX] = "aux", [LM_BAL_NONE] = "none",
};

lm_status lm_balance_parse(const char *name, lm_balance_kind *kind) {
    for (int i = 0; i < (int)(sizeof kind_names / sizeof kind_names[0]); i++)
        if (name && strcmp(name, kind_names[i]) == 0) {
            *kind = (lm_balance_kind)i;
            return LM_OK;
        }
    lm_set_error("unknown balancing strategy '%s' (expected qb, sign, quartile, aux or none)",
                 name ? name : "(null)");
    return LM_ERR;
}

const char *lm_balance_name(lm_balance_kind kind) {
    return (unsigned)kind < sizeof kind_names / sizeof kind_names[0] ? kind_names[kind] : "?";
}

// the histogram range follows the bias: every margin α_i − s_ij = s_il + b_l − s_ij of a
// sigmoid router lies in (b_l − 1, b_l + 1) ⊂ [min b − 1, max b + 1]
static void set_range(lm_balancer *b) {
    real mn = b->bias_host[0], mx = b->bias_host[0];
    for (int j = 1; j < b->E; j++) {
        mn = b->bias_host[j] < mn ? b->bias_host[j] : mn;
        mx = b->bias_host[j] > mx ? b->bias_host[j] : mx;
    }
    b->lo = mn - 1;
    b->width = (mx + 1 - b->lo) / b->nbins;
}

static void reset_step(lm_balancer *b, const lm_ops *ops) {
    b->tokens = b->dropped = 0;
    b->nstage = 0;
    memset(b->load, 0, (size_t)b->E * sizeof(int64_t));
    if (b->hist) ops->zero(b->hist, (size_t)b->E * b->nbins * sizeof(int));
}

void lm_balancer_init(lm_balancer *b, const lm_ops *ops, lm_balance_kind kind, int E, int k,
                      int nbins, real rate) {
    LM_CHECK(E >= 1 && k >= 1 && k <= E, "balancer: need 1 <= k <= E, got k=%d E=%d", k, E);
    memset(b, 0, sizeof *b);
    b->kind = kind;
    b->E = E;
    b->k = k;
    b->nbins = nbins > 0 ? nbins : LM_QB_NBINS_DEFAULT;
    b->rate = rate >= 0 ? rate : (real)LM_BAL_RATE_DEFAULT;
    b->bias = ops->alloc((size_t)E * sizeof(real));
    b->own_bias = 1;
    b->bias_host = lm_malloc((size_t)E * sizeof(real));
    b->load = lm_malloc((size_t)E * sizeof(int64_t));
    b->last_load = lm_malloc((size_t)E * sizeof(int64_t));
    b->stage = ops->alloc((size_t)LM_BAL_STAGE * (E + 1) * sizeof(int));
    b->stage_host = lm_malloc((size_t)LM_BAL_STAGE * (E + 1) * sizeof(int));
    if (kind == LM_BAL_QB) {
        b->hist = ops->alloc((size_t)E * b->nbins * sizeof(int));
        b->sel = ops->alloc((size_t)E * 3 * sizeof(int));
        b->sel_host = lm_malloc((size_t)E * 3 * sizeof(int));
    }
    set_range(b);
    reset_step(b, ops);
}

void lm_balancer_free(lm_balancer *b, const lm_ops *ops) {
    if (b->bias && b->own_bias) ops->free(b->bias);
    if (b->hist) ops->free(b->hist);
    if (b->sel) ops->free(b->sel);
    free(b->bias_host);
    free(b->sel_host);
    free(b->load);
    free(b->last_load);
    if (b->stage) ops->free(b->stage);
    free(b->stage_host);
    memset(b, 0, sizeof *b);
}

void lm_balancer_discard(lm_balancer *b, const lm_ops *ops) { reset_step(b, ops); }

void lm_balancer_attach_bias(lm_balancer *b, const lm_ops *ops, real *bias) {
    if (b->own_bias) ops->free(b->bias);
    b->bias = bias;
    b->own_bias = 0;
    lm_balancer_refresh(b, ops);
}

void lm_balancer_refresh(lm_balancer *b, const lm_ops *ops) {
    ops->to_host(b->bias_host, b->bias, (size_t)b->E * sizeof(real));
    set_range(b);
}

static size_t stage_bytes(const lm_balancer *b) { return (size_t)b->nstage * (b->E + 1) * sizeof(int); }
// the QB bin search's answer when this step's update reads it
static size_t sel_bytes(const lm_balancer *b) {
    return b->kind == LM_BAL_QB && b->hist && b->tokens > 0 ? (size_t)b->E * 3 * sizeof(int) : 0;
}
// the QB quantile's rank: ceil(k·M/E)
static int64_t qb_target(const lm_balancer *b) { return (b->k * b->tokens + b->E - 1) / b->E; }
// searches the histogram on the backend into sel (backend [E, 3])
static void qb_select(const lm_balancer *b, const lm_ops *ops, int *sel) {
    const int64_t target = qb_target(b);
    LM_CHECK(target >= 1 && target <= INT32_MAX, "balancer: qb target %lld out of range", (long long)target);
    ops->qb_hist_select(sel, b->hist, b->E, b->nbins, (int)target);
}

// folds the staged micro-batches (host copy `c`, nstage × (E+1)) into load / dropped
static void fold_stage(lm_balancer *b, const int *c0) {
    const int E = b->E;
    for (int u = 0; u < b->nstage; u++) {
        const int *c = c0 + (size_t)u * (E + 1);
        for (int j = 0; j < E; j++) b->load[j] += c[j];
        if (b->stage_rows[u]) b->dropped += (int64_t)b->stage_N[u] * b->k - c[E];
    }
    b->nstage = 0;
}

// folds the staged micro-batches into load / dropped (one download)
static void flush_stage(lm_balancer *b, const lm_ops *ops) {
    if (b->nstage == 0) return;
    ops->to_host(b->stage_host, b->stage, stage_bytes(b));
    fold_stage(b, b->stage_host);
}

void lm_balancer_observe(lm_balancer *b, const lm_ops *ops, const real *s, const real *alpha,
                         const int *counts, const int *offsets, int N) {
    if (N <= 0) return;
    if (b->nstage == LM_BAL_STAGE) flush_stage(b, ops);
    int *slot = b->stage + (size_t)b->nstage * (b->E + 1);
    ops->copy(slot, counts, (size_t)b->E * sizeof(int));   // device to device: no wait
    if (offsets) ops->copy(slot + b->E, offsets + b->E, sizeof(int));
    b->stage_N[b->nstage] = N;
    b->stage_rows[b->nstage] = offsets != NULL;
    b->nstage++;
    if (b->kind == LM_BAL_QB) {
        LM_CHECK(s && alpha, "balancer: qb needs the router scores and alpha");
        ops->qb_hist_accum(b->hist, s, alpha, b->lo, b->width, N, b->E, b->nbins);
    }
    b->tokens += N;
}

double lm_qb_bin_quantile(int h, int64_t before, int count, int nbins, double lo, double width, int64_t target) {
    if (h >= nbins) return lo + nbins * width;   // target above the total: the top edge
    double frac = (double)(target - before) / count;   // count > 0 here as target > before
    frac = frac < 0 ? 0 : frac > 1 ? 1 : frac;
    return lo + (h + frac) * width;
}

double lm_qb_hist_quantile(const int *hist, int nbins, double lo, double width, int64_t target) {
    int64_t before = 0;
    int h = 0;
    while (h < nbins && before + hist[h] < target) before += hist[h++];
    return lm_qb_bin_quantile(h, before, h < nbins ? hist[h] : 0, nbins, lo, width, target);
}

// p-th percentile (p in [0,1]) of x [n] with linear interpolation between order
// statistics (numpy's default); x is sorted in place
static int cmp_double(const void *pa, const void *pb) {
    double a = *(const double *)pa, b = *(const double *)pb;
    return (a > b) - (a < b);
}
static double percentile_sorted(const double *x, int n, double p) {
    double pos = p * (n - 1);
    int i = (int)floor(pos);
    if (i >= n - 1) return x[n - 1];
    return x[i] + (pos - i) * (x[i + 1] - x[i]);
}

static void fill_metrics(const lm_balancer *b, lm_moe_metrics *m) {
    const int E = b->E;
    memset(m, 0, sizeof *m);
    m->E = E;
    m->tokens = b->tokens;
    m->dropped = b->dropped;
    m->loads = b->last_load;
    int64_t total = 0, mx = 0;
    for (int j = 0; j < E; j++) {
        total += b->last_load[j];
        mx = b->last_load[j] > mx ? b->last_load[j] : mx;
        m->dead += b->last_load[j] == 0;
    }
    m->assignments = total;
    if (total > 0) {
        double mean = (double)total / E, h = 0;
        m->maxvio = ((double)mx - mean) / mean;
        for (int j = 0; j < E; j++)
            if (b->last_load[j] > 0) {
                double p = (double)b->last_load[j] / total;
                h -= p * log(p);
            }
        m->entropy = E > 1 ? h / log((double)E) : 1;
    }
    double bmin = b->bias_host[0], bmax = b->bias_host[0], bsum = 0, bss = 0;
    for (int j = 0; j < E; j++) {
        double v = b->bias_host[j];
        bmin = v < bmin ? v : bmin;
        bmax = v > bmax ? v : bmax;
        bsum += v;
    }
    double bmean = bsum / E;
    for (int j = 0; j < E; j++) bss += ((double)b->bias_host[j] - bmean) * ((double)b->bias_host[j] - bmean);
    m->bias_min = bmin;
    m->bias_max = bmax;
    m->bias_std = sqrt(bss / E);
}

// qb: one exact dual coordinate step from the pooled margin histograms (moe.md §4.2-4.3);
// sel: host copy of qb_hist_select's answer [E, 3]
static void update_qb(lm_balancer *b, const int *sel) {
    const int E = b->E;
    const int64_t target = qb_target(b);
    double *bh = lm_malloc((size_t)E * sizeof(double)), mean = 0;
    for (int j = 0; j < E; j++) {
        bh[j] = lm_qb_bin_quantile(sel[3 * j], sel[3 * j + 1], sel[3 * j + 2], b->nbins, b->lo, b->width, target);
        mean += bh[j];
    }
    mean /= E;
    for (int j = 0; j < E; j++) b->bias_host[j] = (real)(bh[j] - mean);
    free(bh);
}

static void update_sign(lm_balancer *b) {
    double mean = 0;
    for (int j = 0; j < b->E; j++) mean += (double)b->last_load[j];
    mean /= b->E;
    for (int j = 0; j < b->E; j++) {
        double l = (double)b->last_load[j];
        b->bias_host[j] += l < mean ? b->rate : l > mean ? -b->rate : 0;
    }
}

static void update_quartile(lm_balancer *b) {
    double *x = lm_malloc((size_t)b->E * sizeof(double));
    for (int j = 0; j < b->E; j++) x[j] = (double)b->last_load[j];
    qsort(x, (size_t)b->E, sizeof *x, cmp_double);
    double q25 = percentile_sorted(x, b->E, 0.25), q75 = percentile_sorted(x, b->E, 0.75);
    free(x);
    for (int j = 0; j < b->E; j++) {
        double l = (double)b->last_load[j];
        if (l > q75) b->bias_host[j] -= b->rate;
        else if (l < q25) b->bias_host[j] += b->rate;
    }
}

// the update once the staged counts are folded in; sel: host copy of the QB search's answer
// (sel_bytes(b) > 0) or NULL to search and download here
static void finish_update(lm_balancer *b, const lm_ops *ops, lm_moe_metrics *m, const int *sel) {
    memcpy(b->last_load, b->load, (size_t)b->E * sizeof(int64_t));
    if (m) fill_metrics(b, m);   // before the bias changes: metrics describe the step just run
    if (b->tokens > 0) {
        switch (b->kind) {
        case LM_BAL_QB:
            if (!sel) {
                qb_select(b, ops, b->sel);
                ops->to_host(b->sel_host, b->sel, sel_bytes(b));
                sel = b->sel_host;
            }
            update_qb(b, sel);
            break;
        case LM_BAL_SIGN: update_sign(b); break;
        case LM_BAL_QUARTILE: update_quartile(b); break;
        case LM_BAL_AUX:
        case LM_BAL_NONE: break;
        }
        ops->to_device(b->bias, b->bias_host, (size_t)b->E * sizeof(real));
        set_range(b);
    }
    reset_step(b, ops);
}

void lm_balancer_update(lm_balancer *b, const lm_ops *ops, lm_moe_metrics *m) {
    flush_stage(b, ops);
    finish_update(b, ops, m, NULL);
}

void lm_balancers_update(lm_balancer *const *bs, int n, const lm_ops *ops, lm_moe_metrics *ms, lm_bal_xfer *x) {
    // layout of the one download: per balancer its staged counts, then its QB search answer
    size_t total = 0;
    for (int i = 0; i < n; i++)
        if (bs[i]) total += stage_bytes(bs[i]) + sel_bytes(bs[i]);
    if (total > x->cap) {
        if (x->dev) ops->free(x->dev);
        x->dev = ops->alloc(total);
        x->host = lm_realloc(x->host, total);
        x->cap = total;
    }
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        if (!bs[i]) continue;
        const size_t sb = stage_bytes(bs[i]), qb = sel_bytes(bs[i]);
        if (sb) ops->copy((char *)x->dev + at, bs[i]->stage, sb);   // device to device: no wait
        if (qb) qb_select(bs[i], ops, (int *)((char *)x->dev + at + sb));
        at += sb + qb;
    }
    if (total) ops->to_host(x->host, x->dev, total);
    at = 0;
    for (int i = 0; i < n; i++) {
        lm_balancer *b = bs[i];
        if (!b) continue;
        const size_t sb = stage_bytes(b), qb = sel_bytes(b);
        fold_stage(b, (const int *)((char *)x->host + at));
        finish_update(b, ops, ms ? &ms[i] : NULL, qb ? (const int *)((char *)x->host + at + sb) : NULL);
        at += sb + qb;
    }
}

void lm_bal_xfer_free(lm_bal_xfer *x, const lm_ops *ops) {
    if (x->dev) ops->free(x->dev);
    free(x->host);
    memset(x, 0, sizeof *x);
}

void lm_balancer_get_bias(const lm_balancer *b, real *host) {
    memcpy(host, b->bias_host, (size_t)b->E * sizeof(real));
}

void lm_balancer_set_bias(lm_balancer *b, const lm_ops *ops, const real *host) {
    memcpy(b->bias_host, host, (size_t)b->E * sizeof(real));
    ops->to_device(b->bias, b->bias_host, (size_t)b->E * sizeof(real));
    set_range(b);
}

int lm_moe_capacity(double cf0, int relax_steps, int step, int N, int E, int k) {
    if (cf0 <= 0 || step >= relax_steps) return -1;
    double full = (double)E / k;   // the factor at which an expert can take every token
    double cf = cf0 + (full - cf0) * step / relax_steps;
    double c = ceil(cf * N * k / E);
    return c >= N ? N : (int)c;
}
