// test_report.c — the ablation report end to end: synthetic metrics.jsonl files for three
// variants × 2–3 seeds (MoE + block AttnRes, MoE + full AttnRes, dense PreNorm without
// moe/attnres), report.md numbers against statistics recomputed here, malformed input, the
// CLI, and report.html opened in headless Chromium (DOM after scripts, console errors,
// screenshot pixels, plus a deliberately broken copy as a negative control).
#include "harness.h"
#include "browser.h"
#include "train/report.h"
#include "train/report_data.h"
#include "train/svg.h"
#include <sys/stat.h>
#include <unistd.h>

// ---------------------------------------------------------------------------
// synthetic runs

#define N_STEPS 200
#define EVAL_EVERY 50
#define N_TASKS 3
#define N_EXPERTS 8
#define N_VARIANTS 3
static const char *const variant_names[N_VARIANTS] = {"moe-block", "moe-full", "dense-prenorm"};
static const int variant_seeds[N_VARIANTS] = {3, 2, 2};
static const char *const task_names[N_TASKS] = {"recall", "copy", "sort"};
static const int moe_layers[2] = {1, 3};

// what the test knows about each run, computed while writing it
typedef struct {
    int variant, seed;
    char path[512];
    double loss[N_STEPS + 1];   // the value that stands for each step (NaN: not finite)
    double tok_s[N_STEPS + 1];
    double last_eval_loss, last_acc[N_TASKS], last_maxvio, end_tok_s;
} truth;

#define MAX_RUNS 8
static char g_dir[256];
static truth g_runs[MAX_RUNS];
static int g_n_runs;

static double noise(lm_rng *r) { return 2 * lm_rng_uniform(r) - 1; }

// writes one `train` line (and keeps its truth); `epoch` > 0 marks a resumed re-log
static void train_line(FILE *f, truth *t, lm_rng *r, int step, int epoch, int null_loss) {
    int v = t->variant;
    double loss = 2.0 + 0.15 * v + 1.5 * exp(-step / 40.0) + 0.05 * noise(r) + 0.02 * epoch;
    double tok = 8000 + 1200 * v + 300 * t->seed + 200 * noise(r);
    t->loss[step] = null_loss ? NAN : loss;
    t->tok_s[step] = tok;
    if (null_loss) fprintf(f, "{\"type\":\"train\",\"step\":%d,\"loss\":null,\"skipped\":1", step);
    else fprintf(f, "{\"type\":\"train\",\"step\":%d,\"loss\":%.17g,\"skipped\":0", step, loss);
    fprintf(f, ",\"aux_loss\":0,\"lr\":0.001,\"grad_norm\":0.5,\"tok_s\":%.17g,\"step_ms\":%.17g,\"seq_len\":256",
            tok, 4096e3 / tok);
    if (v < 2) {
        // loads with an imbalance that decays over training; maxvio/entropy from them
        fputs(",\"moe\":[", f);
        double mv_sum = 0;
        for (int l = 0; l < 2; l++) {
            double loads[N_EXPERTS], sum = 0, mx = 0, ent = 0;
            for (int e = 0; e < N_EXPERTS; e++) {
                double amp = 0.6 * exp(-step / 80.0) + 0.05 + 0.1 * (v == 0);
                loads[e] = round(512 * (1 + amp * cos(e + 2 * l + t->seed)));
                sum += loads[e];
                mx = tu_worst(mx, loads[e]);
            }
            for (int e = 0; e < N_EXPERTS; e++) ent -= loads[e] / sum * log(loads[e] / sum);
            double mean = sum / N_EXPERTS, mv = (mx - mean) / mean;
            mv_sum += mv;
            fprintf(f, "%s{\"layer\":%d,\"maxvio\":%.17g,\"entropy\":%.17g,\"dead\":0,\"dropped\":0,"
                    "\"bias_min\":-0.1,\"bias_max\":0.1,\"bias_std\":0.05,\"logit_rms\":0.7,\"loads\":[",
                    l ? "," : "", moe_layers[l], mv, ent / log(N_EXPERTS));
            for (int e = 0; e < N_EXPERTS; e++) fprintf(f, "%s%.0f", e ? "," : "", loads[e]);
            fputs("]}", f);
        }
        fputs("]", f);
        t->last_maxvio = mv_sum / 2;
    }
    if (v < 2 && step % 10 == 0) {
        // block mode: emb, finished blocks, partial; full mode: every sublayer output
        static const char *const block_src[6][4] = {{"emb"}, {"emb", "partial"}, {"emb", "b1"},
                                                    {"emb", "b1", "partial"}, {"emb", "b1", "b2"}, {"emb", "b1", "b2"}};
        static const int block_n[6] = {1, 2, 2, 3, 3, 3};
        static const char *const block_mix[6] = {"L0.attn", "L0.ffn", "L2.attn", "L2.ffn", "L3.attn", "out"};
        static const char *const full_src[5] = {"emb", "a0", "f0", "a1", "f1"};
        static const char *const full_mix[5] = {"L0.attn", "L0.ffn", "L1.attn", "L1.ffn", "out"};
        fputs(",\"attnres\":[", f);
        int n_mix = v == 0 ? 6 : 5;
        for (int m = 0; m < n_mix; m++) {
            int ns = v == 0 ? block_n[m] : m + 1;
            const char *const *src = v == 0 ? block_src[m] : full_src;
            double w[5], z = 0;
            for (int j = 0; j < ns; j++) z += (w[j] = exp(1.5 * noise(r) + 0.3 * j));
            fprintf(f, "%s{\"mixer\":\"%s\",\"layer\":%d,\"which\":\"x\",\"sources\":[", m ? "," : "",
                    v == 0 ? block_mix[m] : full_mix[m], m / 2);
            for (int j = 0; j < ns; j++) fprintf(f, "%s\"%s\"", j ? "," : "", src[j]);
            fputs("],\"alpha\":[", f);
            for (int j = 0; j < ns; j++) fprintf(f, "%s%.6f", j ? "," : "", w[j] / z);
            fputs("]}", f);
        }
        fputs("]", f);
    }
    fputs("}\n", f);
}

static void eval_line(FILE *f, truth *t, lm_rng *r, int step) {
    double loss = 2.1 + 0.12 * t->variant + 1.4 * exp(-step / 40.0) + 0.03 * noise(r);
    t->last_eval_loss = loss;
    fprintf(f, "{\"type\":\"eval\",\"step\":%d,\"loss\":%.17g,\"tasks\":{", step, loss);
    for (int k = 0; k < N_TASKS; k++) {
        double acc = 0.2 + 0.5 * step / N_STEPS + 0.1 * k + 0.04 * (t->variant == 1) - 0.05 * (t->variant == 2) +
                     0.03 * noise(r);
        acc = round(acc * 128) / 128;   // n = 128 examples
        t->last_acc[k] = acc;
        fprintf(f, "%s\"%s\":{\"acc\":%.17g,\"loss\":1.0,\"n\":128}", k ? "," : "", task_names[k], acc);
    }
    fputs("},\"loss_by_pos\":[[0,3.1],[32,2.4]]}\n", f);
}

// variant 0 seed 1 logs a non-finite loss at step 195; variant 1 seed 2 is resumed at step
// 101 after logging up to 120; variant 2 seed 2 has no `end` line (tok/s from the median)
static void write_run(truth *t) {
    snprintf(t->path, sizeof t->path, "%s/%s_s%d.jsonl", g_dir, variant_names[t->variant], t->seed);
    FILE *f = fopen(t->path, "w");
    assert_non_null(f);
    lm_rng r;
    lm_rng_seed(&r, (uint64_t)(100 * t->variant + t->seed));
    for (int s = 0; s <= N_STEPS; s++) t->loss[s] = t->tok_s[s] = NAN;
    t->last_maxvio = NAN;
    fprintf(f, "{\"type\":\"run\",\"name\":\"tiny\",\"seed\":%d,\"device\":\"cpu\",\"config\":{\"d_model\":64},"
            "\"train\":{\"steps\":%d},\"params_total\":%d,\"params_active\":%d,\"tokens_per_step\":4096}\n",
            t->seed, N_STEPS, 1863000 - 400000 * (t->variant == 2), 796900);
    int resumed = t->variant == 1 && t->seed == 2;
    int stop = resumed ? 120 : N_STEPS;
    for (int s = 1; s <= stop; s++) {
        train_line(f, t, &r, s, 0, t->variant == 0 && t->seed == 1 && s == 195);
        if (s % EVAL_EVERY == 0) eval_line(f, t, &r, s);
    }
    if (resumed) {
        fputs("\n", f);   // blank lines are allowed
        for (int s = 101; s <= N_STEPS; s++) {
            train_line(f, t, &r, s, 1, 0);
            if (s % EVAL_EVERY == 0) eval_line(f, t, &r, s);
        }
    }
    t->end_tok_s = NAN;
    if (!(t->variant == 2 && t->seed == 2)) {
        t->end_tok_s = 7800 + 1200 * t->variant + 250 * t->seed;
        fprintf(f, "{\"type\":\"end\",\"step\":%d,\"elapsed_s\":12.5,\"tok_s\":%.17g,\"checkpoint\":\"x\"}\n",
                N_STEPS, t->end_tok_s);
    }
    fclose(f);
}

static int setup_runs(void **state) {
    (void)state;
    snprintf(g_dir, sizeof g_dir, "/tmp/lm_test_report_XXXXXX");
    if (!mkdtemp(g_dir)) return -1;
    g_n_runs = 0;
    for (int v = 0; v < N_VARIANTS; v++)
        for (int s = 1; s <= variant_seeds[v]; s++) {
            truth *t = &g_runs[g_n_runs++];
            t->variant = v, t->seed = s;
            write_run(t);
        }
    return 0;
}

static int teardown_runs(void **state) {
    (void)state;
    if (getenv("LM_KEEP_TMP")) printf("kept %s\n", g_dir);
    else tb_remove_tree(g_dir);
    return 0;
}

static int run_list(lm_report_run *out) {
    for (int i = 0; i < g_n_runs; i++)
        out[i] = (lm_report_run){variant_names[g_runs[i].variant], g_runs[i].seed, g_runs[i].path};
    return g_n_runs;
}

static void path_in(char *out, size_t n, const char *sub) { snprintf(out, n, "%s/%s", g_dir, sub); }

// ---------------------------------------------------------------------------
// independent statistics

typedef struct { int n; double mean, std; } tstat;
static tstat stat_of(const double *v, int n) {
    tstat s = {0, 0, 0};
    for (int i = 0; i < n; i++)
        if (isfinite(v[i])) s.mean += v[i], s.n++;
    if (!s.n) return s;
    s.mean /= s.n;
    for (int i = 0; i < n; i++)
        if (isfinite(v[i])) s.std += (v[i] - s.mean) * (v[i] - s.mean);
    s.std = s.n > 1 ? sqrt(s.std / (s.n - 1)) : 0;
    return s;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// the summary columns for one run, by their documented definitions
static void truth_metrics(const truth *t, double m[5]) {
    double fin[N_STEPS];
    int n = 0;
    for (int s = 1; s <= N_STEPS; s++)
        if (isfinite(t->loss[s])) fin[n++] = t->loss[s];
    int k = (int)ceil(0.1 * n);
    m[0] = 0;
    for (int i = n - k; i < n; i++) m[0] += fin[i] / k;
    m[1] = t->last_eval_loss;
    m[2] = 0;
    for (int i = 0; i < N_TASKS; i++) m[2] += t->last_acc[i] / N_TASKS;
    m[3] = t->last_maxvio;
    if (isfinite(t->end_tok_s)) m[4] = t->end_tok_s;
    else {
        double v[N_STEPS];
        int c = 0;
        for (int s = 1; s <= N_STEPS; s++)
            if (isfinite(t->tok_s[s])) v[c++] = t->tok_s[s];
        qsort(v, (size_t)c, sizeof(double), cmp_d);
        m[4] = c % 2 ? v[c / 2] : 0.5 * (v[c / 2 - 1] + v[c / 2]);
    }
}

// ---------------------------------------------------------------------------
// Markdown parsing

// the cells of the table row starting "| name |", after the row's first line `after`
static int md_row(const char *md, const char *after, const char *name, char cells[16][96]) {
    const char *p = strstr(md, after);
    if (!p) return 0;
    char key[128];
    snprintf(key, sizeof key, "\n| %s |", name);
    p = strstr(p, key);
    if (!p) return 0;
    p += strlen(key);
    int n = 0;
    while (*p && *p != '\n' && n < 16) {
        const char *e = strchr(p, '|');
        if (!e) break;
        const char *a = p, *b = e;
        while (a < b && *a == ' ') a++;
        while (b > a && b[-1] == ' ') b--;
        snprintf(cells[n++], 96, "%.*s", (int)(b - a), a);
        p = e + 1;
    }
    return n;
}

// "mean ± std" or "**mean ± std**"; returns 1 if bold
static int parse_cell(const char *cell, double *mean, double *std) {
    int bold = !strncmp(cell, "**", 2);
    *mean = *std = NAN;
    if (sscanf(cell + 2 * bold, "%lf \xC2\xB1 %lf", mean, std) < 1) fail_msg("cannot parse table cell '%s'", cell);
    return bold;
}

static void test_markdown_numbers(void **state) {
    (void)state;
    lm_report_run runs[MAX_RUNS];
    int n = run_list(runs);
    char out[512], mdpath[600];
    path_in(out, sizeof out, "out");
    if (lm_report_write(out, "synthetic ablation", runs, n)) fail_msg("%s", lm_last_error());
    snprintf(mdpath, sizeof mdpath, "%s/report.md", out);
    char *md = tb_read_text(mdpath);
    assert_non_null(md);

    static const double scale[5] = {1, 1, 100, 1, 1}, decimals[5] = {4, 4, 2, 4, 0};
    static const int higher_better[5] = {0, 0, 1, 0, 1};
    double worst = 0;   // largest |printed − recomputed| relative to the print resolution
    double means[N_VARIANTS][5];
    int bold[N_VARIANTS][5];
    for (int v = 0; v < N_VARIANTS; v++) {
        double per_seed[5][MAX_RUNS];
        int ns = 0;
        for (int i = 0; i < g_n_runs; i++)
            if (g_runs[i].variant == v) {
                double m[5];
                truth_metrics(&g_runs[i], m);
                for (int c = 0; c < 5; c++) per_seed[c][ns] = m[c];
                ns++;
            }
        char cells[16][96];
        int nc = md_row(md, "## Summary", variant_names[v], cells);
        assert_int_equal(nc, 6);
        assert_int_equal(atoi(cells[0]), ns);
        for (int c = 0; c < 5; c++) {
            tstat s = stat_of(per_seed[c], ns);
            means[v][c] = s.n ? s.mean : NAN;
            if (!s.n) {   // the dense variant has no MaxVio
                assert_string_equal(cells[c + 1], "\xE2\x80\x94");
                bold[v][c] = 0;
                continue;
            }
            double pm, ps;
            bold[v][c] = parse_cell(cells[c + 1], &pm, &ps);
            double res = pow(10, -decimals[c]);
            worst = tu_worst(worst, fabs(pm - scale[c] * s.mean) / res);
            worst = tu_worst(worst, fabs(ps - scale[c] * s.std) / res);
        }
    }
    // printed with the column's decimals, so at most half a unit of the last digit apart
    tu_check("summary table vs recomputed mean/std (units of the last printed digit)", worst, 0.5 + 1e-6);
    // bold marks exactly the best mean of each column
    int bad_bold = 0;
    for (int c = 0; c < 5; c++) {
        int best = -1;
        for (int v = 0; v < N_VARIANTS; v++)
            if (isfinite(means[v][c]) &&
                (best < 0 || (higher_better[c] ? means[v][c] > means[best][c] : means[v][c] < means[best][c])))
                best = v;
        for (int v = 0; v < N_VARIANTS; v++) bad_bold += bold[v][c] != (v == best);
    }
    tu_check("summary cells with wrong best-highlighting", bad_bold, 0);

    // per-task table: accuracy in % at the last eval
    worst = 0;
    for (int v = 0; v < N_VARIANTS; v++) {
        char cells[16][96];
        assert_int_equal(md_row(md, "## Held-out accuracy per task", variant_names[v], cells), N_TASKS);
        for (int k = 0; k < N_TASKS; k++) {
            double acc[MAX_RUNS];
            int ns = 0;
            for (int i = 0; i < g_n_runs; i++)
                if (g_runs[i].variant == v) acc[ns++] = g_runs[i].last_acc[k];
            tstat s = stat_of(acc, ns);
            double pm, ps;
            parse_cell(cells[k], &pm, &ps);
            worst = tu_worst(worst, tu_worst(fabs(pm - 100 * s.mean), fabs(ps - 100 * s.std)) / 0.01);
        }
    }
    tu_check("per-task table vs recomputed mean/std (units of 0.01 %)", worst, 0.5 + 1e-6);
    assert_non_null(strstr(md, "| recall | copy | sort |"));
    free(md);
}

// ---------------------------------------------------------------------------
// malformed input

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

// expects lm_report_write to fail with a message containing every needle
static void expect_error(const char *what, const lm_report_run *runs, int n, const char *const *needles, int nn) {
    char out[512], html[600];
    path_in(out, sizeof out, "bad_out");
    lm_status st = lm_report_write(out, NULL, runs, n);
    printf("measured [%s] %s -> \"%s\"\n", LM_REAL_NAME, what, st ? lm_last_error() : "(no error)");
    assert_int_equal(st, LM_ERR);
    for (int i = 0; i < nn; i++)
        if (!strstr(lm_last_error(), needles[i])) fail_msg("%s: error '%s' lacks '%s'", what, lm_last_error(), needles[i]);
    snprintf(html, sizeof html, "%s/report.html", out);
    assert_int_not_equal(access(html, F_OK), 0);   // nothing written on error
}

static void test_malformed(void **state) {
    (void)state;
    char bad[512], typ[512], empty[512], missing[512];
    path_in(bad, sizeof bad, "bad_json.jsonl");
    path_in(typ, sizeof typ, "bad_type.jsonl");
    path_in(empty, sizeof empty, "no_train.jsonl");
    path_in(missing, sizeof missing, "does_not_exist.jsonl");
    write_text(bad, "{\"type\":\"run\"}\n{\"type\":\"train\",\"step\":1,\"loss\":2.5}\n{\"type\":\"train\",\"step\":2,\"loss\":2.4\n");
    write_text(typ, "{\"type\":\"train\",\"step\":1,\"loss\":2.5}\n{\"type\":\"train\",\"step\":2,\"loss\":\"2.4\"}\n");
    write_text(empty, "{\"type\":\"run\",\"name\":\"x\"}\n{\"type\":\"end\",\"tok_s\":1}\n");
    lm_report_run good = {"ok", 1, g_runs[0].path};

    char line3[600], line2[600];
    snprintf(line3, sizeof line3, "%s:3:", bad);
    snprintf(line2, sizeof line2, "%s:2:", typ);
    lm_report_run r1[2] = {good, {"broken", 1, bad}};
    expect_error("bad JSON line", r1, 2, (const char *[]){line3, "JSON"}, 2);
    lm_report_run r2[1] = {{"broken", 1, typ}};
    expect_error("loss of the wrong type", r2, 1, (const char *[]){line2, "\"loss\""}, 2);
    lm_report_run r3[2] = {good, {"gone", 1, missing}};
    expect_error("missing file", r3, 2, (const char *[]){missing}, 1);
    lm_report_run r4[1] = {{"empty", 1, empty}};
    expect_error("no train lines", r4, 1, (const char *[]){empty, "train"}, 2);
    char glued[512], line1[600];
    path_in(glued, sizeof glued, "glued.jsonl");
    write_text(glued, "{\"type\":\"train\",\"step\":1,\"loss\":2.5}{\"type\":\"train\",\"step\":2,\"loss\":2.4}\n");
    snprintf(line1, sizeof line1, "%s:1:", glued);
    lm_report_run r6[1] = {{"glued", 1, glued}};
    expect_error("two objects on one line", r6, 1, (const char *[]){line1, "JSON"}, 2);
    lm_report_run r5[2] = {good, good};
    expect_error("variant:seed twice", r5, 2, (const char *[]){"ok:1", "twice"}, 2);
}

// what the loader keeps: resumed steps replaced, non-finite losses left out, optional
// fields absent for the dense variant, the last attnres/loads kept
static void test_loader(void **state) {
    (void)state;
    int worst_x = 0;
    for (int i = 0; i < g_n_runs; i++) {
        const truth *t = &g_runs[i];
        rp_run r;
        if (rp_run_load(&r, t->path)) fail_msg("%s", lm_last_error());
        int expect_n = 0;
        double max_diff = 0;
        for (int s = 1; s <= N_STEPS; s++) expect_n += isfinite(t->loss[s]);
        assert_int_equal(r.loss.n, expect_n);
        for (int k = 0, s = 1; s <= N_STEPS; s++) {
            if (!isfinite(t->loss[s])) continue;
            worst_x += r.loss.x[k] != s;
            max_diff = tu_worst(max_diff, fabs(r.loss.y[k] - t->loss[s]));
            k++;
        }
        assert_true(max_diff == 0);
        assert_int_equal(r.eval_loss.n, N_STEPS / EVAL_EVERY);
        assert_int_equal(r.n_tasks, N_TASKS);
        assert_int_equal(r.n_moe, t->variant < 2 ? 2 : 0);
        assert_int_equal(r.n_mixers, t->variant == 0 ? 6 : t->variant == 1 ? 5 : 0);
        if (t->variant < 2) {
            assert_int_equal(r.moe[0].layer, 1);
            assert_int_equal(r.moe[1].layer, 3);
            assert_int_equal(r.moe[1].n_loads, N_EXPERTS);
            assert_int_equal(r.moe[0].maxvio.n, N_STEPS);
        }
        assert_true(isfinite(r.end_tok_s) == isfinite(t->end_tok_s));
        rp_run_free(&r);
    }
    tu_check("loader: logged steps out of place (resume, skipped step)", worst_x, 0);
}

static void test_cli(void **state) {
    (void)state;
    char out[512], spec[3][700], html[600];
    path_in(out, sizeof out, "cli_out");
    for (int i = 0; i < 3; i++)
        snprintf(spec[i], sizeof spec[i], "%s:%d:%s", variant_names[g_runs[i].variant], g_runs[i].seed, g_runs[i].path);
    char *help[] = {"report", "--help"};
    assert_int_equal(lm_report_main(2, help), 0);
    char *no_out[] = {"report", spec[0]};
    assert_int_equal(lm_report_main(2, no_out), 2);
    char *bad_spec[] = {"report", "--out", out, "no-seed-here"};
    assert_int_equal(lm_report_main(4, bad_spec), 2);
    char *ok[] = {"report", "--out", out, "--title", "cli", spec[0], spec[1], spec[2]};
    assert_int_equal(lm_report_main(8, ok), 0);
    snprintf(html, sizeof html, "%s/report.html", out);
    assert_int_equal(access(html, R_OK), 0);
}

// ---------------------------------------------------------------------------
// the page in a real browser

#define WIN_W 1280
#define WIN_H 1100

typedef struct { int x, y, w, h; } region;

// counts the data marks of one <figure class="chart"> … </figure> that have a nonzero size
static int drawn_marks(const char *fig, const char *end) {
    int n = 0;
    for (const char *p = fig; (p = strstr(p, "class=\"d ")) && p < end; p++) {
        const char *tag = p;
        while (tag > fig && *tag != '<') tag--;
        const char *close = strchr(p, '>');
        char el[4096];
        snprintf(el, sizeof el, "%.*s", (int)(close - tag), tag);
        double w = 0, h = 0, r = 0;
        const char *a;
        if (!strncmp(el, "<rect", 5)) {
            if ((a = strstr(el, " width=\""))) w = atof(a + 8);
            if ((a = strstr(el, " height=\""))) h = atof(a + 9);
            n += w > 0 && h > 0;
        } else if (!strncmp(el, "<path", 5)) {
            // a line needs two points, a band a closed polygon
            n += (a = strstr(el, " d=\"M")) != NULL && strchr(a, 'L') != NULL;
        } else if (!strncmp(el, "<circle", 7)) {
            if ((a = strstr(el, " r=\""))) r = atof(a + 4);
            n += r > 0;
        }
    }
    return n;
}

// runs Chromium on a page: DOM dump + console log, then a screenshot
static void open_in_browser(const char *chromium, const char *page, const char *tag, char **dom, char **console,
                            char *png, size_t png_n) {
    char url[700], out[600], err[600], shot[620], win[64];
    snprintf(url, sizeof url, "file://%s", page);
    snprintf(win, sizeof win, "--window-size=%d,%d", WIN_W, WIN_H);
    snprintf(out, sizeof out, "%s/%s.dom", g_dir, tag);
    snprintf(err, sizeof err, "%s/%s.console", g_dir, tag);
    double t0 = lm_time_sec();
    const char *dump_args[] = {win, "--dump-dom"};
    int rc = tb_run_chromium(chromium, dump_args, 2, url, out, err, 60);
    if (rc != 0) fail_msg("chromium --dump-dom of %s failed (status %d); see %s", page, rc, err);
    *dom = tb_read_text(out);
    *console = tb_read_text(err);
    snprintf(png, png_n, "%s/%s.png", g_dir, tag);
    snprintf(shot, sizeof shot, "--screenshot=%s", png);
    snprintf(err, sizeof err, "%s/%s.shot.log", g_dir, tag);
    snprintf(out, sizeof out, "%s/%s.shot.out", g_dir, tag);
    const char *shot_args[] = {win, shot};
    rc = tb_run_chromium(chromium, shot_args, 2, url, out, err, 60);
    if (rc != 0) fail_msg("chromium --screenshot of %s failed (status %d); see %s", page, rc, err);
    printf("measured [%s] chromium DOM dump + screenshot of %s: %.1f s\n", LM_REAL_NAME, tag, lm_time_sec() - t0);
    assert_non_null(*dom);
    assert_non_null(*console);
}

// console lines Chromium logged from the page: errors, uncaught exceptions, console.*
static int console_lines(const char *log, const char *needle) {
    int n = 0;
    for (const char *p = log; p && *p;) {
        const char *e = strchr(p, '\n');
        if (!e) e = p + strlen(p);
        char line[2048];
        snprintf(line, sizeof line, "%.*s", (int)(e - p), p);
        if ((strstr(line, ":CONSOLE") || strstr(line, "Uncaught")) && (!needle || strstr(line, needle))) {
            printf("  console: %s\n", line);
            n++;
        }
        p = *e ? e + 1 : e;
    }
    return n;
}

// distinct colours, share of non-white pixels, share of coloured pixels (max − min channel
// > 16: lines, bands, bars — axes, grid and text are grey), and per variant the pixels
// within ±6 per channel of its colour
typedef struct { int distinct; double non_bg, colored, color_px[N_VARIANTS]; } pixel_stats;

static pixel_stats region_stats(const unsigned char *px, int W, int H, region r) {
    pixel_stats s = {0};
    if (r.x < 0 || r.y < 0 || r.w <= 0 || r.h <= 0 || r.x + r.w > W || r.y + r.h > H)
        fail_msg("chart region %d,%d %dx%d is not inside the %dx%d screenshot", r.x, r.y, r.w, r.h, W, H);
    unsigned char *seen = calloc(1 << 21, 1);   // one bit per 24-bit colour
    unsigned char rgb[N_VARIANTS][3];
    for (int v = 0; v < N_VARIANTS; v++) svg_color_rgb(v, rgb[v]);
    long non_bg = 0, colored = 0;
    for (int y = r.y; y < r.y + r.h; y++)
        for (int x = r.x; x < r.x + r.w; x++) {
            const unsigned char *p = px + 3 * ((size_t)y * W + x);
            uint32_t c = (uint32_t)p[0] << 16 | (uint32_t)p[1] << 8 | p[2];
            if (!(seen[c >> 3] & (1 << (c & 7)))) seen[c >> 3] |= (unsigned char)(1 << (c & 7)), s.distinct++;
            non_bg += c != 0xFFFFFF;
            int mx = p[0] > p[1] ? p[0] : p[1], mn = p[0] < p[1] ? p[0] : p[1];
            mx = mx > p[2] ? mx : p[2], mn = mn < p[2] ? mn : p[2];
            colored += mx - mn > 16;
            for (int v = 0; v < N_VARIANTS; v++)
                s.color_px[v] += abs(p[0] - rgb[v][0]) <= 6 && abs(p[1] - rgb[v][1]) <= 6 && abs(p[2] - rgb[v][2]) <= 6;
        }
    s.non_bg = (double)non_bg / ((double)r.w * r.h);
    s.colored = (double)colored / ((double)r.w * r.h);
    free(seen);
    return s;
}

// Thresholds for "this chart region shows a drawn line chart", from measurements of the
// 602×338 loss charts (printed on every run) against the two negative controls:
// - distinct colours: a rendered chart has >1000 (anti-aliased lines, bands, text); an
//   empty frame has ~6 (white + the border's anti-aliasing);
// - non-white share: ~7–10% drawn; 0.9% for the empty frame (its border);
// - coloured share (chroma > 16): lines and min–max bands are coloured, axes/grid/text are
//   grey; drawn charts measure 2–4%, axes+legend alone ~0.1% (legend swatches), so 1%;
// - per variant, pixels of its exact line colour: ~500 drawn; the legend swatch alone is
//   ~34, so 150 needs the line itself.
#define MIN_DISTINCT 40
#define MIN_NON_WHITE 0.04
#define MIN_COLORED 0.01
#define MIN_VARIANT_PX 150

static int chart_drawn(const pixel_stats *s) {
    int ok = s->distinct >= MIN_DISTINCT && s->non_bg >= MIN_NON_WHITE && s->colored >= MIN_COLORED;
    for (int v = 0; v < N_VARIANTS; v++) ok &= s->color_px[v] >= MIN_VARIANT_PX;
    return ok;
}

static void print_stats(const char *what, const pixel_stats *s) {
    printf("measured [%s] %s: %d distinct colours (min %d), %.2f%% non-white (min %.0f%%), %.2f%% coloured "
           "(min %.0f%%), variant-colour pixels %.0f/%.0f/%.0f (min %d each)\n",
           LM_REAL_NAME, what, s->distinct, MIN_DISTINCT, 100 * s->non_bg, 100 * MIN_NON_WHITE, 100 * s->colored,
           100 * MIN_COLORED, s->color_px[0], s->color_px[1], s->color_px[2], MIN_VARIANT_PX);
}

// "ok N x,y,w,h x,y,w,h" written by the page's script into <body data-check>
static int parse_check(const char *dom, char *status, int *n, region reg[2]) {
    const char *p = strstr(dom, "data-check=\"");
    if (!p) return 0;
    return sscanf(p + 12, "%7s %d %d,%d,%d,%d %d,%d,%d,%d", status, n, &reg[0].x, &reg[0].y, &reg[0].w, &reg[0].h,
                  &reg[1].x, &reg[1].y, &reg[1].w, &reg[1].h);
}

// the page with the first chart's <svg> emptied and the second chart's data marks
// (<path class="d …"/>, <circle class="d …"/>) removed
static void write_broken(const char *path, const char *src) {
    const char *fig1 = strstr(src, "<figure class=\"chart\"");
    assert_non_null(fig1);
    const char *fig2 = strstr(fig1 + 1, "<figure class=\"chart\"");
    assert_non_null(fig2);
    const char *svg_body = strchr(strstr(fig1, "<svg"), '>') + 1, *svg_end = strstr(fig1, "</svg>");
    const char *fig2_end = strstr(fig2, "</figure>");
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fwrite(src, 1, (size_t)(svg_body - src), f);
    const char *p = svg_end;
    for (;;) {
        const char *mark = strstr(p, " class=\"d ");
        if (!mark || mark > fig2_end) break;
        const char *tag = mark;
        while (*tag != '<') tag--;
        const char *close = strstr(mark, "/>");
        assert_non_null(close);
        fwrite(p, 1, (size_t)(tag - p), f);
        p = close + 2;
    }
    fputs(p, f);
    fclose(f);
}

static int count_of(const char *s, const char *needle) {
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)); p++) n++;
    return n;
}

static void test_browser(void **state) {
    (void)state;
    const char *chromium = tb_chromium();
    // a missing browser is a failure, not a skip: `make test` installs it (make deps)
    if (!chromium) fail_msg("chromium not found on PATH (nor $LM_CHROMIUM); run `make deps` to install it");
    double t0 = lm_time_sec();
    lm_report_run runs[MAX_RUNS];
    int n = run_list(runs);
    char out[512], page[600];
    path_in(out, sizeof out, "html");
    if (lm_report_write(out, "synthetic ablation", runs, n)) fail_msg("%s", lm_last_error());
    snprintf(page, sizeof page, "%s/report.html", out);
    char *src = tb_read_text(page);
    assert_non_null(src);
    // self-contained: no external fetches of any kind
    assert_int_equal(count_of(src, "http://"), count_of(src, "http://www.w3.org/2000/svg"));   // xmlns only
    assert_null(strstr(src, "https://"));
    assert_null(strstr(src, " src="));
    assert_null(strstr(src, "<link"));

    // charts the page must have: 2 loss, task bars + one per task, MaxVio and entropy per
    // MoE layer, one load heatmap per MoE variant, one AttnRes heatmap per AttnRes variant,
    // tok/s and step time
    int expect = 2 + (1 + N_TASKS) + 2 * 2 + 2 + 2 + 2;

    char *dom, *console, png[620];
    open_in_browser(chromium, page, "good", &dom, &console, png, sizeof png);
    // (a) DOM after scripts ran: every chart figure holds an SVG with drawn data marks
    int charts = 0, min_marks = 1 << 30;
    for (const char *p = dom; (p = strstr(p, "<figure class=\"chart\"")); p++) {
        const char *end = strstr(p, "</figure>");
        assert_non_null(end);
        const char *svg = strstr(p, "<svg");
        if (!svg || svg > end) fail_msg("chart %d has no <svg>", charts);
        int m = drawn_marks(p, end);
        if (m < min_marks) min_marks = m;
        charts++;
    }
    printf("measured [%s] charts in the DOM = %d (expected %d), fewest drawn data marks in a chart = %d\n",
           LM_REAL_NAME, charts, expect, min_marks);
    assert_int_equal(charts, expect);
    tu_check("charts without a drawn data mark", min_marks >= 1 ? 0 : 1, 0);
    char status[8] = "";
    int seen = 0;
    region reg[2];
    int got = parse_check(dom, status, &seen, reg);
    printf("measured [%s] page self-check: %s %d charts; first charts at %d,%d %dx%d and %d,%d %dx%d\n", LM_REAL_NAME,
           status, seen, reg[0].x, reg[0].y, reg[0].w, reg[0].h, reg[1].x, reg[1].y, reg[1].w, reg[1].h);
    assert_int_equal(got, 10);
    assert_string_equal(status, "ok");
    assert_int_equal(seen, expect);
    // (b) no console errors or uncaught exceptions
    tu_check("console errors/uncaught exceptions from the report", console_lines(console, NULL), 0);

    // (c) the screenshot: the first two charts (train and held-out loss) are drawn
    int W, H;
    unsigned char *px = tb_read_png_rgb(png, &W, &H);
    assert_non_null(px);
    assert_int_equal(W, WIN_W);
    for (int k = 0; k < 2; k++) {
        pixel_stats s = region_stats(px, W, H, reg[k]);
        print_stats(k ? "screenshot, held-out loss chart" : "screenshot, train loss chart", &s);
        tu_check("screenshot: chart regions failing the drawn-chart thresholds", !chart_drawn(&s), 0);
    }
    free(px);

    // negative controls, in one broken copy of the page: the first chart's SVG emptied
    // (a blank frame), and the second chart's data marks cut out (axes, labels and legend
    // left). The page must log a console error naming both, and both screenshot regions
    // must fail the thresholds above.
    char broken[600];
    snprintf(broken, sizeof broken, "%s/broken.html", out);
    write_broken(broken, src);
    char *bdom, *bconsole, bpng[620];
    open_in_browser(chromium, broken, "broken", &bdom, &bconsole, bpng, sizeof bpng);
    int errors = console_lines(bconsole, "linmoe report:");
    printf("measured [%s] negative control: %d console error(s) from the page's self-check\n", LM_REAL_NAME, errors);
    assert_true(errors >= 1);
    assert_true(console_lines(bconsole, "chart-train-loss chart-eval-loss") >= 1);
    region breg[2];
    assert_int_equal(parse_check(bdom, status, &seen, breg), 10);
    assert_string_equal(status, "fail");
    px = tb_read_png_rgb(bpng, &W, &H);
    assert_non_null(px);
    pixel_stats s0 = region_stats(px, W, H, breg[0]), s1 = region_stats(px, W, H, breg[1]);
    print_stats("negative control, blank chart", &s0);
    print_stats("negative control, axes+legend only", &s1);
    // each control fails the thresholds on every criterion that its damage removes
    assert_false(chart_drawn(&s0));
    assert_false(chart_drawn(&s1));
    assert_true(s0.distinct < MIN_DISTINCT && s0.non_bg < MIN_NON_WHITE && s0.colored < MIN_COLORED);
    assert_true(s1.colored < MIN_COLORED);
    for (int v = 0; v < N_VARIANTS; v++) assert_true(s0.color_px[v] < MIN_VARIANT_PX && s1.color_px[v] < MIN_VARIANT_PX);
    free(px);
    printf("measured [%s] browser checks took %.1f s\n", LM_REAL_NAME, lm_time_sec() - t0);
    free(src), free(dom), free(console), free(bdom), free(bconsole);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_markdown_numbers),
        cmocka_unit_test(test_loader),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_cli),
        cmocka_unit_test(test_browser),
    };
    return cmocka_run_group_tests(tests, setup_runs, teardown_runs);
}
