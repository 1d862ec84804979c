// report_html.c — report.html: one self-contained page (inline CSS and SVG, no network)
// with the summary table and every chart, grouped by variant. Seeds of a variant are
// drawn as their mean with a shaded min–max band; bars show the mean with a min–max
// whisker. A few lines of inline script check that every chart holds drawn data and log a
// console error otherwise — nothing on the page depends on it.
#include "train/report_data.h"
#include "train/svg.h"

#define TRAIN_EMA_BETA 0.9    // light smoothing of per-step train loss (≈10-step time constant)
#define MAX_DRAWN_POINTS 400  // per line; longer series are bucket-averaged for drawing
#define BAND_NOTE "line = mean over seeds, band = min\xE2\x80\x93max"

typedef struct {
    svg_buf b;
    int charts;               // figures emitted, checked by the page script
    const rp_report *rep;
} html;

static const char *const css =
    "body{font:14px/1.4 \"DejaVu Sans\",Arial,sans-serif;color:#222;background:#fff;margin:0 auto;"
    "max-width:1240px;padding:14px 20px}\n"
    "h1{font-size:22px;margin:4px 0}h2{font-size:17px;margin:26px 0 8px;border-bottom:1px solid #ddd;"
    "padding-bottom:4px}\n"
    ".grid{display:flex;flex-wrap:wrap;gap:12px}figure.chart{margin:0;border:1px solid #e3e3e3;"
    "border-radius:3px}\n"
    "svg text{font-family:\"DejaVu Sans\",Arial,sans-serif}svg .title{font-size:13px;font-weight:bold;"
    "fill:#222}svg .sub{font-size:10.5px;fill:#666}svg .tick{font-size:10px;fill:#555}\n"
    "svg .label,svg .key{font-size:11px;fill:#333}svg .val{font-size:9.5px;fill:#333}"
    "svg .cellv{font-size:9px}\n"
    "svg .gl{stroke:#ececec}svg .axis,svg .frame{stroke:#999;fill:none}svg .line{fill:none;"
    "stroke-width:2;stroke-linejoin:round;stroke-linecap:round}\n"
    "svg .band{fill-opacity:.18;stroke:none}svg .whisker{stroke:#222;stroke-width:1.2;fill:none}"
    "svg .na{fill:#f2f2f2}\n"
    "table{border-collapse:collapse;font-size:13px;margin:6px 0}th,td{padding:4px 10px;"
    "border-bottom:1px solid #e5e5e5;text-align:right;white-space:nowrap}\n"
    "th{background:#f6f6f6}th:first-child,td:first-child{text-align:left}td.best{font-weight:bold;"
    "background:#e3f3e6}\n"
    ".sw{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:6px}"
    ".note{color:#666;font-size:13px}\n";

// the page's self-check (see the file comment); also records where the first two charts
// are in data-check, which the browser test uses to find them in a screenshot
static const char *const check_script =
    "<script>\n(function(){var f=document.querySelectorAll('figure.chart'),want=+document.body.dataset.charts,bad=[];\n"
    "f.forEach(function(c){var n=0;c.querySelectorAll('svg .d').forEach(function(e){var r=e.getBBox();"
    "if(r.width>0&&(r.height>0||e.tagName==='path'))n++;});if(!n)bad.push(c.id);});\n"
    "var ok=f.length===want&&!bad.length;if(!ok)console.error('linmoe report: '+f.length+' of '+want+"
    "' charts present; empty: '+(bad.join(' ')||'none'));\n"
    "document.body.dataset.check=(ok?'ok ':'fail ')+f.length+[].slice.call(f,0,2).map(function(c){"
    "var r=c.getBoundingClientRect();return ' '+[r.left,r.top,r.width,r.height].map(Math.round).join(',');}).join('');})();\n"
    "</script>\n";

// ---------------------------------------------------------------------------
// seed bands per variant

typedef const rp_series *(*series_fn)(const rp_run *r, const void *arg);

static const rp_series *get_loss(const rp_run *r, const void *a) { (void)a; return &r->loss; }
static const rp_series *get_eval(const rp_run *r, const void *a) { (void)a; return &r->eval_loss; }
static const rp_series *get_task(const rp_run *r, const void *a) {
    for (int i = 0; i < r->n_tasks; i++)
        if (!strcmp(r->tasks[i].name, a)) return &r->tasks[i].acc;
    return NULL;
}
static const rp_moe_layer *moe_of(const rp_run *r, int layer) {
    for (int i = 0; i < r->n_moe; i++)
        if (r->moe[i].layer == layer) return &r->moe[i];
    return NULL;
}
static const rp_series *get_maxvio(const rp_run *r, const void *a) {
    const rp_moe_layer *m = moe_of(r, *(const int *)a);
    return m ? &m->maxvio : NULL;
}
static const rp_series *get_entropy(const rp_run *r, const void *a) {
    const rp_moe_layer *m = moe_of(r, *(const int *)a);
    return m ? &m->entropy : NULL;
}

// the band of one variant's seeds (each smoothed first when beta > 0), scaled for display
static rp_band variant_band(const rp_variant *v, series_fn get, const void *arg, double beta, double scale) {
    const rp_series **seeds = lm_malloc(sizeof(rp_series *) * (size_t)v->n_runs);
    rp_series *smooth = lm_malloc(sizeof(rp_series) * (size_t)v->n_runs);
    int n = 0;
    for (int k = 0; k < v->n_runs; k++) {
        const rp_series *s = get(v->runs[k], arg);
        if (!s || !s->n) continue;
        if (beta > 0) {
            smooth[n] = rp_ema(s, beta);
            s = &smooth[n];
        }
        seeds[n++] = s;
    }
    rp_band b = rp_band_of(seeds, n);
    if (beta > 0)
        for (int k = 0; k < n; k++) rp_series_free(&smooth[k]);
    free(smooth);
    free(seeds);
    for (int i = 0; i < b.n; i++) b.mean[i] *= scale, b.lo[i] *= scale, b.hi[i] *= scale;
    rp_band_thin(&b, MAX_DRAWN_POINTS);
    return b;
}

// one line per variant that has the series; nothing is emitted if none has
static void band_chart(html *h, const svg_frame *f, series_fn get, const void *arg, double beta,
                       double scale, double ymin, double ymax) {
    const rp_report *rep = h->rep;
    rp_band *bands = lm_malloc(sizeof(rp_band) * (size_t)rep->n_variants);
    svg_line *lines = lm_malloc(sizeof(svg_line) * (size_t)rep->n_variants);
    int n = 0;
    for (int i = 0; i < rep->n_variants; i++) {
        bands[i] = variant_band(&rep->variants[i], get, arg, beta, scale);
        if (!bands[i].n) continue;
        lines[n++] = (svg_line){rep->variants[i].name, svg_color(i), bands[i].n, bands[i].x,
                                bands[i].mean, bands[i].lo, bands[i].hi};
    }
    if (n) {
        svg_line_chart(&h->b, f, lines, n, ymin, ymax);
        h->charts++;
    }
    for (int i = 0; i < rep->n_variants; i++) rp_band_free(&bands[i]);
    free(bands);
    free(lines);
}

// ---------------------------------------------------------------------------
// sections

static void variant_cell(svg_buf *b, int i, const char *name) {
    svg_printf(b, "<td><span class=\"sw\" style=\"background:%s\"></span>", svg_color(i));
    svg_escape(b, name);
    svg_puts(b, "</td>");
}

static void stat_cell(svg_buf *b, const rp_stat *s, int decimals, double scale, int best) {
    char cell[96];
    rp_fmt_stat(cell, sizeof cell, s, decimals, scale);
    svg_printf(b, "<td%s>%s</td>", best ? " class=\"best\"" : "", cell);
}

static void summary(html *h) {
    const rp_report *rep = h->rep;
    svg_buf *b = &h->b;
    svg_puts(b, "<section id=\"summary\"><h2>Summary</h2>\n<table class=\"summary\"><tr><th>variant</th><th>seeds</th>");
    for (int c = 0; c < RP_N_COLS; c++)
        svg_printf(b, "<th>%s %s</th>", rp_cols[c].name, rp_cols[c].higher_better ? RP_UP : RP_DOWN);
    svg_puts(b, "</tr>\n");
    for (int i = 0; i < rep->n_variants; i++) {
        const rp_variant *v = &rep->variants[i];
        svg_puts(b, "<tr>");
        variant_cell(b, i, v->name);
        svg_printf(b, "<td>%d</td>", v->n_runs);
        for (int c = 0; c < RP_N_COLS; c++)
            stat_cell(b, &v->col[c], rp_cols[c].decimals, rp_cols[c].scale, rep->best[c] == i);
        svg_puts(b, "</tr>\n");
    }
    svg_printf(b, "</table>\n<p class=\"note\">Mean \xC2\xB1 sample standard deviation over seeds; "
               "highlighted = best in the column (" RP_DOWN " lower is better, " RP_UP " higher). Final train loss: mean of the last %.0f%% of logged "
               "train steps. Held-out loss and task accuracy: the last eval. Final MaxVio: mean over MoE "
               "layers on the last logged step. tok/s: the run's <code>end</code> line (median step when "
               "the run has none).</p></section>\n", 100 * RP_FINAL_FRACTION);
}

static void loss_section(html *h) {
    svg_puts(&h->b, "<section id=\"loss\"><h2>Loss</h2><div class=\"grid\">\n");
    char sub[160];
    snprintf(sub, sizeof sub, "EMA \xCE\xB2 = %.2g per seed; " BAND_NOTE, TRAIN_EMA_BETA);
    svg_frame f = {"chart-train-loss", "Train loss", sub, "step", "loss (nats/token)", 600, 330};
    band_chart(h, &f, get_loss, NULL, TRAIN_EMA_BETA, 1, NAN, NAN);
    svg_frame e = {"chart-eval-loss", "Held-out loss", BAND_NOTE, "step", "loss (nats/token)", 600, 330};
    int before = h->charts;
    band_chart(h, &e, get_eval, NULL, 0, 1, NAN, NAN);
    if (h->charts == before) svg_puts(&h->b, "<p class=\"note\">No run logged a held-out eval.</p>\n");
    svg_puts(&h->b, "</div></section>\n");
}

static void task_section(html *h) {
    const rp_report *rep = h->rep;
    svg_buf *b = &h->b;
    svg_puts(b, "<section id=\"tasks\"><h2>Held-out task accuracy</h2>\n");
    if (!rep->n_tasks) {
        svg_puts(b, "<p class=\"note\">No eval reported per-task accuracy.</p></section>\n");
        return;
    }
    int V = rep->n_variants, T = rep->n_tasks;
    double *val = lm_malloc(sizeof(double) * (size_t)(V * T)), *lo = lm_malloc(sizeof(double) * (size_t)(V * T)),
           *hi = lm_malloc(sizeof(double) * (size_t)(V * T));
    const char **keys = lm_malloc(sizeof(char *) * (size_t)V), **colors = lm_malloc(sizeof(char *) * (size_t)V);
    for (int i = 0; i < V; i++) keys[i] = rep->variants[i].name, colors[i] = svg_color(i);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < V; i++) {
            const rp_stat *s = &rep->variants[i].task[t];
            val[t * V + i] = 100 * s->mean, lo[t * V + i] = 100 * s->min, hi[t * V + i] = 100 * s->max;
        }
    svg_bars bars = {T, V, (const char *const *)rep->tasks, keys, colors, val, lo, hi};
    svg_frame f = {"chart-task-acc", "Accuracy per task at the last eval",
                   "bar = mean over seeds, whisker = min\xE2\x80\x93max", "task", "accuracy (%)", 1220, 330};
    svg_bar_chart(b, &f, &bars, 100);
    h->charts++;
    free(val), free(lo), free(hi), free(keys), free(colors);

    svg_puts(b, "<table class=\"tasks\"><tr><th>accuracy (%) at the last eval</th>");
    for (int t = 0; t < T; t++) {
        svg_puts(b, "<th>");
        svg_escape(b, rep->tasks[t]);
        svg_puts(b, "</th>");
    }
    svg_puts(b, "</tr>\n");
    for (int i = 0; i < V; i++) {
        svg_puts(b, "<tr>");
        variant_cell(b, i, rep->variants[i].name);
        for (int t = 0; t < T; t++) stat_cell(b, &rep->variants[i].task[t], 2, 100, rp_best_task(rep, t) == i);
        svg_puts(b, "</tr>\n");
    }
    svg_puts(b, "</table>\n");

    svg_puts(b, "<div class=\"grid\">\n");
    for (int t = 0; t < T; t++) {
        char id[32], title[160];
        snprintf(id, sizeof id, "chart-task-%d", t);
        snprintf(title, sizeof title, "Accuracy over training: %s", rep->tasks[t]);
        svg_frame g = {id, title, BAND_NOTE, "step", "accuracy (%)", 394, 260};
        band_chart(h, &g, get_task, rep->tasks[t], 0, 100, 0, 100);
    }
    svg_puts(b, "</div></section>\n");
}

static void moe_section(html *h) {
    const rp_report *rep = h->rep;
    svg_buf *b = &h->b;
    svg_puts(b, "<section id=\"moe\"><h2>MoE load balance</h2>\n");
    if (!rep->n_layers) {
        svg_puts(b, "<p class=\"note\">No run logged MoE layers.</p></section>\n");
        return;
    }
    static const struct { const char *key, *name, *unit; series_fn get; } metric[2] = {
        {"maxvio", "MaxVio", "(max load \xE2\x88\x92 mean) / mean", get_maxvio},
        {"entropy", "Load entropy", "normalised entropy (1 = uniform)", get_entropy},
    };
    for (int m = 0; m < 2; m++) {
        svg_printf(b, "<h3>%s per MoE layer</h3><div class=\"grid\">\n", metric[m].name);
        for (int l = 0; l < rep->n_layers; l++) {
            char id[48], title[96];
            snprintf(id, sizeof id, "chart-%s-L%d", metric[m].key, rep->layers[l]);
            snprintf(title, sizeof title, "%s, layer %d", metric[m].name, rep->layers[l]);
            svg_frame f = {id, title, BAND_NOTE, "step", metric[m].unit, 394, 260};
            band_chart(h, &f, metric[m].get, &rep->layers[l], 0, 1, m == 0 ? 0 : NAN, NAN);
        }
        svg_puts(b, "</div>\n");
    }
    svg_puts(b, "</section>\n");
}

// expert loads of the last logged step, each layer divided by its mean load, averaged
// over the variant's seeds
static void load_heatmaps(html *h) {
    const rp_report *rep = h->rep;
    svg_buf *b = &h->b;
    svg_puts(b, "<section id=\"loads\"><h2>Expert load at the last logged step</h2><div class=\"grid\">\n");
    int any = 0;
    for (int i = 0; i < rep->n_variants; i++) {
        const rp_variant *v = &rep->variants[i];
        int rows = 0, cols = 0;
        int *layer = lm_malloc(sizeof(int) * (size_t)(rep->n_layers + 1));
        for (int l = 0; l < rep->n_layers; l++) {
            int has = 0;
            for (int k = 0; k < v->n_runs; k++) {
                const rp_moe_layer *m = moe_of(v->runs[k], rep->layers[l]);
                if (m && m->n_loads) has = 1, cols = lm_max(cols, m->n_loads);
            }
            if (has) layer[rows++] = rep->layers[l];
        }
        if (!rows) {
            free(layer);
            continue;
        }
        double *val = lm_malloc(sizeof(double) * (size_t)(rows * cols));
        for (int r = 0; r < rows; r++)
            for (int c = 0; c < cols; c++) {
                double s = 0;
                int n = 0;
                for (int k = 0; k < v->n_runs; k++) {
                    const rp_moe_layer *m = moe_of(v->runs[k], layer[r]);
                    if (!m || c >= m->n_loads) continue;
                    double mean = 0;
                    for (int e = 0; e < m->n_loads; e++) mean += m->loads[e];
                    mean /= m->n_loads;
                    if (mean > 0) s += m->loads[c] / mean, n++;
                }
                val[r * cols + c] = n ? s / n : NAN;
            }
        char **rl = lm_malloc(sizeof(char *) * (size_t)rows), **cl = lm_malloc(sizeof(char *) * (size_t)cols);
        for (int r = 0; r < rows; r++) {
            rl[r] = lm_malloc(24);
            snprintf(rl[r], 24, "layer %d", layer[r]);
        }
        for (int c = 0; c < cols; c++) {
            cl[c] = lm_malloc(16);
            snprintf(cl[c], 16, "%d", c);
        }
        char id[32], title[160], sub[96];
        snprintf(id, sizeof id, "chart-load-%d", i);
        snprintf(title, sizeof title, "Expert load: %s", v->name);
        snprintf(sub, sizeof sub, "load / layer mean, mean over %d seed%s; 1 = balanced", v->n_runs,
                 v->n_runs > 1 ? "s" : "");
        svg_heat hm = {rows, cols, (const char *const *)rl, (const char *const *)cl, val, 0, 1, 2,
                       SVG_DIVERGING, "load / mean", 0};
        svg_frame f = {id, title, sub, "expert", "MoE layer", 600, 0};
        svg_heatmap(b, &f, &hm);
        h->charts++;
        any = 1;
        for (int r = 0; r < rows; r++) free(rl[r]);
        for (int c = 0; c < cols; c++) free(cl[c]);
        free(rl), free(cl), free(val), free(layer);
    }
    svg_puts(b, "</div>\n");
    if (!any) svg_puts(b, "<p class=\"note\">No run logged expert loads.</p>\n");
    svg_puts(b, "</section>\n");
}

// order of AttnRes source labels: embedding, blocks by number, full-mode layer outputs
// (attention before FFN of the same layer), the partial sum, then anything else
static long source_rank(const char *s, int first_seen) {
    char *end;
    if (!strcmp(s, "emb")) return 0;
    if (s[0] == 'b' && s[1] >= '0' && s[1] <= '9') {
        long k = strtol(s + 1, &end, 10);
        if (!*end) return 1000000 + k;
    }
    if ((s[0] == 'a' || s[0] == 'f') && s[1] >= '0' && s[1] <= '9') {
        long k = strtol(s + 1, &end, 10);
        if (!*end) return 2000000 + 2 * k + (s[0] == 'f');
    }
    if (!strcmp(s, "partial")) return 3000000;
    return 4000000 + first_seen;
}

static int name_index(char **names, int n, const char *s) {
    for (int i = 0; i < n; i++)
        if (!strcmp(names[i], s)) return i;
    return -1;
}

static void attnres_heatmaps(html *h) {
    const rp_report *rep = h->rep;
    svg_buf *b = &h->b;
    svg_puts(b, "<section id=\"attnres\"><h2>AttnRes mixing weights (last logged step)</h2><div class=\"grid\">\n");
    int any = 0;
    svg_buf none = {0};
    for (int i = 0; i < rep->n_variants; i++) {
        const rp_variant *v = &rep->variants[i];
        if (!v->has_attnres) {
            svg_puts(&none, none.len ? ", " : "");
            svg_escape(&none, v->name);
            continue;
        }
        // rows: mixers in logged order; columns: the union of their sources
        char **mix = NULL, **src = NULL;
        int nm = 0, ns = 0;
        for (int k = 0; k < v->n_runs; k++)
            for (int m = 0; m < v->runs[k]->n_mixers; m++) {
                const rp_mixer *x = &v->runs[k]->mixers[m];
                if (name_index(mix, nm, x->name) < 0) {
                    mix = lm_realloc(mix, sizeof(char *) * (size_t)(nm + 1));
                    mix[nm++] = x->name;
                }
                for (int j = 0; j < x->n; j++)
                    if (name_index(src, ns, x->sources[j]) < 0) {
                        src = lm_realloc(src, sizeof(char *) * (size_t)(ns + 1));
                        src[ns++] = x->sources[j];
                    }
            }
        long *rank = lm_malloc(sizeof(long) * (size_t)ns);
        for (int j = 0; j < ns; j++) rank[j] = source_rank(src[j], j);
        for (int j = 1; j < ns; j++)   // insertion sort: stable and ns is small
            for (int k = j; k > 0 && rank[k - 1] > rank[k]; k--) {
                long t = rank[k]; rank[k] = rank[k - 1]; rank[k - 1] = t;
                char *s = src[k]; src[k] = src[k - 1]; src[k - 1] = s;
            }
        double *sum = lm_malloc(sizeof(double) * (size_t)(nm * ns));
        int *cnt = lm_malloc(sizeof(int) * (size_t)(nm * ns));
        for (int k = 0; k < v->n_runs; k++)
            for (int m = 0; m < v->runs[k]->n_mixers; m++) {
                const rp_mixer *x = &v->runs[k]->mixers[m];
                int r = name_index(mix, nm, x->name);
                for (int j = 0; j < x->n; j++) {
                    int c = name_index(src, ns, x->sources[j]);
                    if (isfinite(x->alpha[j])) sum[r * ns + c] += x->alpha[j], cnt[r * ns + c]++;
                }
            }
        for (int q = 0; q < nm * ns; q++) sum[q] = cnt[q] ? sum[q] / cnt[q] : NAN;
        char id[32], title[160], sub[96];
        snprintf(id, sizeof id, "chart-attnres-%d", i);
        snprintf(title, sizeof title, "AttnRes weights: %s", v->name);
        snprintf(sub, sizeof sub, "mean softmax weight \xCE\xB1 per source, mean over seeds");
        svg_heat hm = {nm, ns, (const char *const *)mix, (const char *const *)src, sum, 0, 0.5, 1,
                       SVG_SEQUENTIAL, "mean \xCE\xB1", 1};
        svg_frame f = {id, title, sub, "source", "mixer", 600, 0};
        svg_heatmap(b, &f, &hm);
        h->charts++;
        any = 1;
        free(mix), free(src), free(rank), free(sum), free(cnt);
    }
    svg_puts(b, "</div>\n");
    if (none.len) {
        svg_printf(b, "<p class=\"note\">No AttnRes weights logged (PreNorm residual, or not logged) for: %s.</p>\n",
                   none.s);
    }
    if (!any && !none.len) svg_puts(b, "<p class=\"note\">No variants.</p>\n");
    svg_buf_free(&none);
    svg_puts(b, "</section>\n");
}

static double median_of(const rp_series *s) { return lm_median(s->y, s->n); }

static void throughput_section(html *h) {
    const rp_report *rep = h->rep;
    int V = rep->n_variants;
    svg_puts(&h->b, "<section id=\"speed\"><h2>Throughput</h2><div class=\"grid\">\n");
    double *val = lm_malloc(sizeof(double) * (size_t)V), *lo = lm_malloc(sizeof(double) * (size_t)V),
           *hi = lm_malloc(sizeof(double) * (size_t)V), *seed = lm_malloc(sizeof(double) * (size_t)rep->n_runs);
    const char **keys = lm_malloc(sizeof(char *) * (size_t)V), **colors = lm_malloc(sizeof(char *) * (size_t)V);
    for (int i = 0; i < V; i++) keys[i] = rep->variants[i].name, colors[i] = svg_color(i);
    for (int pass = 0; pass < 2; pass++) {
        int have = 0;
        for (int i = 0; i < V; i++) {
            const rp_variant *v = &rep->variants[i];
            rp_stat s = v->col[RP_TOK_S];
            if (pass == 1) {
                for (int k = 0; k < v->n_runs; k++) seed[k] = median_of(&v->runs[k]->step_ms);
                s = rp_stat_of(seed, v->n_runs);
            }
            val[i] = s.mean, lo[i] = s.min, hi[i] = s.max;
            have += s.n > 0;
        }
        if (!have) continue;
        static const char *const group[2] = {"tokens / second", "ms / step"};
        svg_bars bars = {1, V, &group[pass], keys, colors, val, lo, hi};
        svg_frame f = pass == 0
                          ? (svg_frame){"chart-tok-s", "Throughput", "bar = mean over seeds, whisker = min\xE2\x80\x93max",
                                        "variant", "tokens / second", 600, 300}
                          : (svg_frame){"chart-step-ms", "Step time (median step per run)",
                                        "bar = mean over seeds, whisker = min\xE2\x80\x93max", "variant", "ms / step",
                                        600, 300};
        svg_bar_chart(&h->b, &f, &bars, NAN);
        h->charts++;
    }
    free(val), free(lo), free(hi), free(seed), free(keys), free(colors);
    svg_puts(&h->b, "</div></section>\n");
}

static void fmt_count(char *out, size_t n, double v) {
    if (!isfinite(v)) snprintf(out, n, "\xE2\x80\x94");
    else if (v >= 1e9) snprintf(out, n, "%.2fB", v / 1e9);
    else if (v >= 1e6) snprintf(out, n, "%.2fM", v / 1e6);
    else if (v >= 1e3) snprintf(out, n, "%.1fk", v / 1e3);
    else snprintf(out, n, "%.0f", v);
}

static void runs_table(html *h) {
    const rp_report *rep = h->rep;
    svg_buf *b = &h->b;
    svg_puts(b, "<section id=\"runs\"><h2>Runs</h2>\n<table><tr><th>variant</th><th>seed</th><th>last step</th>"
                "<th>evals</th><th>params</th><th>active params</th><th>metrics</th></tr>\n");
    for (int i = 0; i < rep->n_variants; i++)
        for (int k = 0; k < rep->variants[i].n_runs; k++) {
            const rp_run *r = rep->variants[i].runs[k];
            char pt[32], pa[32];
            fmt_count(pt, sizeof pt, r->params_total);
            fmt_count(pa, sizeof pa, r->params_active);
            svg_puts(b, "<tr>");
            variant_cell(b, i, r->variant);
            svg_printf(b, "<td>%d</td><td>%.0f</td><td>%d</td><td>%s</td><td>%s</td><td style=\"text-align:left\">",
                       r->seed, r->loss.x[r->loss.n - 1], r->eval_loss.n, pt, pa);
            svg_escape(b, r->path);
            svg_puts(b, "</td></tr>\n");
        }
    svg_puts(b, "</table></section>\n");
}

char *rp_render_html(const rp_report *rep) {
    html h = {.rep = rep};
    summary(&h);
    loss_section(&h);
    task_section(&h);
    moe_section(&h);
    load_heatmaps(&h);
    attnres_heatmaps(&h);
    throughput_section(&h);
    runs_table(&h);

    svg_buf page = {0};
    svg_puts(&page, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>");
    svg_escape(&page, rep->title);
    svg_printf(&page, "</title>\n<style>\n%s</style></head>\n<body data-charts=\"%d\">\n<header><h1>", css, h.charts);
    svg_escape(&page, rep->title);
    svg_printf(&page, "</h1><p class=\"note\">%d runs, %d variants, %d charts. Written by <code>linmoe report</code>."
               "</p></header>\n", rep->n_runs, rep->n_variants, h.charts);
    svg_puts(&page, h.b.s ? h.b.s : "");
    svg_puts(&page, check_script);
    svg_puts(&page, "</body></html>\n");
    svg_buf_free(&h.b);
    return page.s;
}
