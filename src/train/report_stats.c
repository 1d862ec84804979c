// report_stats.c — the numbers behind the report: per-run summary metrics, statistics over
// seeds, seed bands on a common step axis, smoothing, and grouping runs into variants.
#include "train/report_data.h"

const rp_col rp_cols[RP_N_COLS] = {
    [RP_TRAIN_LOSS] = {"final train loss", 0, 4, 1},
    [RP_EVAL_LOSS] = {"held-out loss", 0, 4, 1},
    [RP_TASK_ACC] = {"mean task acc (%)", 1, 2, 100},
    [RP_MAXVIO] = {"final MaxVio", 0, 4, 1},
    [RP_TOK_S] = {"tok/s", 1, 0, 1},
};

rp_stat rp_stat_of(const double *v, int n) {
    rp_stat s = {.mean = NAN, .std = NAN, .min = NAN, .max = NAN};
    double sum = 0;
    for (int i = 0; i < n; i++)
        if (isfinite(v[i])) {
            sum += v[i];
            s.min = s.n ? fmin(s.min, v[i]) : v[i];
            s.max = s.n ? fmax(s.max, v[i]) : v[i];
            s.n++;
        }
    if (!s.n) return s;
    s.mean = sum / s.n;
    double ss = 0;
    for (int i = 0; i < n; i++)
        if (isfinite(v[i])) ss += (v[i] - s.mean) * (v[i] - s.mean);
    s.std = s.n > 1 ? sqrt(ss / (s.n - 1)) : 0;
    return s;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double rp_run_metric(const rp_run *r, int c) {
    switch (c) {
    case RP_TRAIN_LOSS: {
        // the mean of the last 10% of the logged (finite) losses, at least one: one step's
        // loss is too noisy to compare variants by
        int k = (int)ceil(RP_FINAL_FRACTION * r->loss.n);
        if (k < 1) k = 1;
        double s = 0;
        for (int i = r->loss.n - k; i < r->loss.n; i++) s += r->loss.y[i];
        return r->loss.n ? s / k : NAN;
    }
    case RP_EVAL_LOSS: return r->last_eval_loss;
    case RP_TASK_ACC: {
        double s = 0;
        int n = 0;
        for (int i = 0; i < r->n_tasks; i++)
            if (isfinite(r->tasks[i].last_acc)) s += r->tasks[i].last_acc, n++;
        return n ? s / n : NAN;
    }
    case RP_MAXVIO: return r->last_maxvio;
    case RP_TOK_S: {
        // the writer's whole-run figure when the run ended; otherwise the median step,
        // which ignores warm-up and stalls
        if (isfinite(r->end_tok_s)) return r->end_tok_s;
        return lm_median(r->tok_s.y, r->tok_s.n);
    }
    }
    return NAN;
}

// ---------------------------------------------------------------------------
// bands

// s(x) by linear interpolation between logged points; NaN outside the logged range
static double interp(const rp_series *s, double x) {
    if (!s->n || x < s->x[0] || x > s->x[s->n - 1]) return NAN;
    int lo = 0, hi = s->n - 1;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (s->x[mid] <= x) lo = mid;
        else hi = mid;
    }
    if (s->x[lo] == x) return s->y[lo];
    if (s->x[hi] == x) return s->y[hi];
    double w = (x - s->x[lo]) / (s->x[hi] - s->x[lo]);
    return (1 - w) * s->y[lo] + w * s->y[hi];
}

rp_band rp_band_of(const rp_series *const *seeds, int n_seeds) {
    int total = 0;
    for (int k = 0; k < n_seeds; k++) total += seeds[k]->n;
    double *xs = lm_malloc(sizeof(double) * (size_t)(total ? total : 1));
    int n = 0;
    for (int k = 0; k < n_seeds; k++)
        for (int i = 0; i < seeds[k]->n; i++) xs[n++] = seeds[k]->x[i];
    qsort(xs, (size_t)n, sizeof(double), cmp_double);
    int u = 0;
    for (int i = 0; i < n; i++)
        if (!u || xs[i] != xs[u - 1]) xs[u++] = xs[i];
    rp_band b = {.n = u, .x = xs};
    b.mean = lm_malloc(sizeof(double) * (size_t)(u ? u : 1));
    b.lo = lm_malloc(sizeof(double) * (size_t)(u ? u : 1));
    b.hi = lm_malloc(sizeof(double) * (size_t)(u ? u : 1));
    double *v = lm_malloc(sizeof(double) * (size_t)(n_seeds ? n_seeds : 1));
    for (int i = 0; i < u; i++) {
        for (int k = 0; k < n_seeds; k++) v[k] = interp(seeds[k], xs[i]);
        rp_stat s = rp_stat_of(v, n_seeds);
        b.mean[i] = s.mean, b.lo[i] = s.min, b.hi[i] = s.max;
    }
    free(v);
    return b;
}

void rp_band_thin(rp_band *b, int max_points) {
    if (max_points < 1 || b->n <= max_points) return;
    int n = b->n;
    double *arr[4] = {b->x, b->mean, b->lo, b->hi};
    for (int i = 0; i < max_points; i++) {
        int s = (int)((long)i * n / max_points), e = (int)((long)(i + 1) * n / max_points);
        for (int a = 0; a < 4; a++) {
            double sum = 0;
            for (int k = s; k < e; k++) sum += arr[a][k];
            arr[a][i] = sum / (e - s);   // i ≤ s, so the bucket is read before it is overwritten
        }
    }
    b->n = max_points;
}

void rp_band_free(rp_band *b) {
    free(b->x);
    free(b->mean);
    free(b->lo);
    free(b->hi);
    *b = (rp_band){0};
}

rp_series rp_ema(const rp_series *s, double beta) {
    rp_series o = {0};
    double m = 0;
    for (int i = 0; i < s->n; i++) {
        m = i ? beta * m + (1 - beta) * s->y[i] : s->y[i];
        rp_series_push(&o, s->x[i], m);
    }
    return o;
}

// ---------------------------------------------------------------------------
// grouping

static int find_name(char **names, int n, const char *s) {
    for (int i = 0; i < n; i++)
        if (!strcmp(names[i], s)) return i;
    return -1;
}

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

void rp_report_build(rp_report *rep) {
    rep->variants = lm_malloc(sizeof(rp_variant) * (size_t)(rep->n_runs ? rep->n_runs : 1));
    rep->n_variants = 0;
    for (int i = 0; i < rep->n_runs; i++) {
        const rp_run *r = &rep->runs[i];
        int v = 0;
        while (v < rep->n_variants && strcmp(rep->variants[v].name, r->variant)) v++;
        rp_variant *var = &rep->variants[v];
        if (v == rep->n_variants) {
            rep->n_variants++;
            var->name = lm_strdup(r->variant);
            var->runs = lm_malloc(sizeof(rp_run *) * (size_t)rep->n_runs);
        }
        var->runs[var->n_runs++] = r;
        var->has_moe |= r->n_moe > 0;
        var->has_attnres |= r->n_mixers > 0;
        for (int t = 0; t < r->n_tasks; t++)
            if (find_name(rep->tasks, rep->n_tasks, r->tasks[t].name) < 0) {
                rep->tasks = lm_realloc(rep->tasks, sizeof(char *) * (size_t)(rep->n_tasks + 1));
                rep->tasks[rep->n_tasks++] = lm_strdup(r->tasks[t].name);
            }
        for (int l = 0; l < r->n_moe; l++) {
            int have = 0;
            for (int k = 0; k < rep->n_layers; k++) have |= rep->layers[k] == r->moe[l].layer;
            if (!have) {
                rep->layers = lm_realloc(rep->layers, sizeof(int) * (size_t)(rep->n_layers + 1));
                rep->layers[rep->n_layers++] = r->moe[l].layer;
            }
        }
    }
    if (rep->n_layers) qsort(rep->layers, (size_t)rep->n_layers, sizeof(int), cmp_int);

    double *v = lm_malloc(sizeof(double) * (size_t)(rep->n_runs ? rep->n_runs : 1));
    for (int i = 0; i < rep->n_variants; i++) {
        rp_variant *var = &rep->variants[i];
        for (int c = 0; c < RP_N_COLS; c++) {
            for (int k = 0; k < var->n_runs; k++) v[k] = rp_run_metric(var->runs[k], c);
            var->col[c] = rp_stat_of(v, var->n_runs);
        }
        var->task = lm_malloc(sizeof(rp_stat) * (size_t)(rep->n_tasks ? rep->n_tasks : 1));
        for (int t = 0; t < rep->n_tasks; t++) {
            for (int k = 0; k < var->n_runs; k++) {
                const rp_run *r = var->runs[k];
                v[k] = NAN;
                for (int j = 0; j < r->n_tasks; j++)
                    if (!strcmp(r->tasks[j].name, rep->tasks[t])) v[k] = r->tasks[j].last_acc;
            }
            var->task[t] = rp_stat_of(v, var->n_runs);
        }
    }
    free(v);
    // a "best" only means something when at least two variants have the number
    for (int c = 0; c < RP_N_COLS; c++) {
        int best = -1, have = 0;
        for (int i = 0; i < rep->n_variants; i++) {
            const rp_stat *s = &rep->variants[i].col[c];
            if (!s->n) continue;
            have++;
            double m = s->mean, bm = best >= 0 ? rep->variants[best].col[c].mean : 0;
            if (best < 0 || (rp_cols[c].higher_better ? m > bm : m < bm)) best = i;
        }
        rep->best[c] = have >= 2 ? best : -1;
    }
}

int rp_best_task(const rp_report *rep, int t) {
    int best = -1, have = 0;
    for (int i = 0; i < rep->n_variants; i++) {
        const rp_stat *s = &rep->variants[i].task[t];
        if (!s->n) continue;
        have++;
        if (best < 0 || s->mean > rep->variants[best].task[t].mean) best = i;
    }
    return have >= 2 ? best : -1;
}

void rp_report_free(rp_report *rep) {
    for (int i = 0; i < rep->n_variants; i++) {
        free(rep->variants[i].name);
        free(rep->variants[i].runs);
        free(rep->variants[i].task);
    }
    free(rep->variants);
    for (int t = 0; t < rep->n_tasks; t++) free(rep->tasks[t]);
    free(rep->tasks);
    free(rep->layers);
    for (int i = 0; i < rep->n_runs; i++) rp_run_free(&rep->runs[i]);
    free(rep->runs);
    *rep = (rp_report){0};
}

void rp_fmt_stat(char *out, size_t n, const rp_stat *s, int decimals, double scale) {
    if (!s->n) snprintf(out, n, "\xE2\x80\x94");   // em dash
    else if (s->n == 1) snprintf(out, n, "%.*f", decimals, scale * s->mean);
    else snprintf(out, n, "%.*f \xC2\xB1 %.*f", decimals, scale * s->mean, decimals, scale * s->std);
}
