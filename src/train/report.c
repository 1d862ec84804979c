// report.c — lm_report_write (load runs → group into variants → write report.html and
// report.md) and the `linmoe report` command line.
#include "train/report.h"
#include "train/report_data.h"
#include "core/safetensors.h"   // lm_write_file_atomic
#include <errno.h>

static lm_status write_text(const char *dir, const char *name, const char *text) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *path = lm_malloc(n);
    snprintf(path, n, "%s/%s", dir, name);
    lm_status st = lm_write_file_atomic(path, text, strlen(text));
    free(path);
    return st;
}

lm_status lm_report_write(const char *out_dir, const char *title, const lm_report_run *runs, int n_runs) {
    if (!out_dir || !out_dir[0]) { lm_set_error("report: no output folder given"); return LM_ERR; }
    if (!runs || n_runs < 1) { lm_set_error("report: no runs given"); return LM_ERR; }
    for (int i = 0; i < n_runs; i++) {
        if (!runs[i].variant || !runs[i].variant[0] || !runs[i].jsonl_path) {
            lm_set_error("report: run %d has no variant name or metrics path", i + 1);
            return LM_ERR;
        }
        for (int k = 0; k < i; k++)
            if (!strcmp(runs[k].variant, runs[i].variant) && runs[k].seed == runs[i].seed) {
                lm_set_error("report: run %s:%d given twice ('%s' and '%s')", runs[i].variant, runs[i].seed,
                             runs[k].jsonl_path, runs[i].jsonl_path);
                return LM_ERR;
            }
    }
    rp_report rep = {.title = title && title[0] ? title : "linmoe ablation report", .n_runs = n_runs};
    rep.runs = lm_malloc(sizeof(rp_run) * (size_t)n_runs);
    lm_status st = LM_OK;
    for (int i = 0; i < n_runs && !st; i++) {
        st = rp_run_load(&rep.runs[i], runs[i].jsonl_path);
        rep.runs[i].variant = lm_strdup(runs[i].variant);
        rep.runs[i].seed = runs[i].seed;
    }
    char *html = NULL, *md = NULL;
    if (!st) {
        rp_report_build(&rep);
        html = rp_render_html(&rep);
        md = rp_render_markdown(&rep);
        st = lm_make_dirs(out_dir);
    }
    if (!st) st = write_text(out_dir, "report.html", html);
    if (!st) st = write_text(out_dir, "report.md", md);
    free(html);
    free(md);
    rp_report_free(&rep);
    return st;
}

// ---------------------------------------------------------------------------
// command line

static void usage(FILE *f) {
    fputs("usage: linmoe report --out DIR [--title TEXT] VARIANT:SEED:METRICS.jsonl ...\n"
          "\n"
          "Writes DIR/report.html (one self-contained page: summary table, loss curves, task\n"
          "accuracy, MoE balance, expert-load and AttnRes heatmaps, throughput) and DIR/report.md\n"
          "(the summary tables) from the metrics.jsonl files of `linmoe train` runs. Runs with the\n"
          "same VARIANT are seeds of one variant: charts show their mean and min-max band, tables\n"
          "mean +- std.\n"
          "\n"
          "  --out DIR      output folder (created if missing)\n"
          "  --title TEXT   page title (default: \"linmoe ablation report\")\n"
          "  -h, --help     this text\n"
          "\n"
          "example: linmoe report --out runs/report prenorm:1:runs/pn1/metrics.jsonl \\\n"
          "           prenorm:2:runs/pn2/metrics.jsonl block:1:runs/b1/metrics.jsonl\n",
          f);
}

// "VARIANT:SEED:PATH" (the path may itself contain ':'); argv is left untouched, the
// variant name is a copy the caller frees
static int parse_run(const char *spec, lm_report_run *r) {
    const char *a = strchr(spec, ':');
    const char *b = a ? strchr(a + 1, ':') : NULL;
    if (!a || !b || a == spec || !b[1]) return 0;
    char *end;
    errno = 0;
    long seed = strtol(a + 1, &end, 10);
    if (end == a + 1 || end != b || errno || seed < -2147483647L || seed > 2147483647L) return 0;
    char *variant = lm_malloc((size_t)(a - spec) + 1);
    memcpy(variant, spec, (size_t)(a - spec));
    *r = (lm_report_run){variant, (int)seed, b + 1};
    return 1;
}

int lm_report_main(int argc, char **argv) {
    const char *out = NULL, *title = NULL;
    lm_report_run *runs = lm_malloc(sizeof(lm_report_run) * (size_t)(argc > 0 ? argc : 1));
    int n = 0, rc = 0, help = 0;
    for (int i = 1; i < argc && !rc && !help; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            help = 1;
        } else if (!strcmp(a, "--out") || !strcmp(a, "--title")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "linmoe: error: %s needs a value\n", a);
                rc = 2;
            } else if (a[2] == 'o') out = argv[++i];
            else title = argv[++i];
        } else if (!strncmp(a, "--out=", 6)) out = a + 6;
        else if (!strncmp(a, "--title=", 8)) title = a + 8;
        else if (a[0] == '-') {
            fprintf(stderr, "linmoe: error: unknown option '%s' (see linmoe report --help)\n", a);
            rc = 2;
        } else if (parse_run(a, &runs[n])) {
            n++;
        } else {
            fprintf(stderr, "linmoe: error: '%s' is not VARIANT:SEED:PATH (SEED an integer)\n", a);
            rc = 2;
        }
    }
    if (!rc && !help && (!out || !n)) {
        fprintf(stderr, "linmoe: error: %s (see linmoe report --help)\n",
                !out ? "--out DIR is required" : "no runs given");
        rc = 2;
    }
    if (!rc && !help) {
        if (lm_report_write(out, title, runs, n)) {
            fprintf(stderr, "linmoe: error: %s\n", lm_last_error());
            rc = 1;
        } else {
            printf("wrote %s/report.html and %s/report.md (%d run%s)\n", out, out, n, n == 1 ? "" : "s");
        }
    }
    for (int i = 0; i < n; i++) free((char *)runs[i].variant);
    free(runs);
    return rc;
}
