// cmd_ablate.c — `linmoe ablate`: matched runs of one base config that differ in one
// technique (same data order, steps, batch and seeds), then one report.
//
// Studies (variants): balance (qb, sign, quartile, aux, none), residual (block, full,
// prenorm), gate (bounded, unbounded), mix (hybrid 3:1, all-KDA, all-MLA). Seed k uses
// the same data stream and initial weights in every variant; seeds differ from each
// other, so each difference comes with a spread.
#include "cli/cli.h"
#include "train/report.h"
#include "train/train.h"
#include <errno.h>
#include <sys/stat.h>

typedef struct {
    const char *name;
    const char *key, *value;   // config override; value NULL = layer pattern of the variant name
} variant;

typedef struct {
    const char *name, *what;
    variant v[5];
    int n;
} study;

static const study STUDIES[] = {
    {"balance", "MoE load balancing: Quantile Balancing vs DeepSeek sign rule vs the seeds' quartile rule vs aux loss vs none",
     {{"qb", "balance", "qb"}, {"sign", "balance", "sign"}, {"quartile", "balance", "quartile"},
      {"aux", "balance", "aux"}, {"none", "balance", "none"}}, 5},
    {"residual", "residual stream: Block AttnRes vs Full AttnRes vs plain PreNorm",
     {{"block", "residual", "block"}, {"full", "residual", "full"}, {"prenorm", "residual", "prenorm"}}, 3},
    {"gate", "KDA decay gate: lower-bounded (lb -5) vs unbounded softplus",
     {{"bounded", "gate_mode", "bounded"}, {"unbounded", "gate_mode", "unbounded"}}, 2},
    {"mix", "token mixers: hybrid 3:1 KDA:MLA vs all-KDA vs all-MLA",
     {{"hybrid", NULL, NULL}, {"all-kda", NULL, NULL}, {"all-mla", NULL, NULL}}, 3},
};
#define N_STUDIES ((int)(sizeof STUDIES / sizeof *STUDIES))

static lm_status apply_variant(lm_config *c, const variant *v) {
    if (v->key) {
        if (lm_config_set(c, v->key, v->value) != LM_OK) return LM_ERR;
    } else if (strcmp(v->name, "all-kda") == 0 || strcmp(v->name, "all-mla") == 0) {
        char t = v->name[4] == 'k' ? 'K' : 'M';
        memset(c->layer_types, t, (size_t)c->n_layers);
        c->layer_types[c->n_layers] = 0;
    }
    return lm_config_finalize(c);
}

static int run_study(const study *s, const lm_config *base, const lm_train_opts *to, int seeds, const char *out,
                     const lm_ops *ops) {
    char dir[960];
    if (snprintf(dir, sizeof dir, "%s/%s", out, s->name) >= (int)sizeof dir) {
        fprintf(stderr, "linmoe ablate: error: --out path too long\n");
        return 1;
    }
    if (lm_make_dirs(dir) != LM_OK) {
        fprintf(stderr, "linmoe ablate: error: %s\n", lm_last_error());
        return 1;
    }
    printf("== study %s: %s (%d variants x %d seeds, %d steps each)\n", s->name, s->what, s->n, seeds, to->steps);
    lm_report_run runs[5 * 16];
    char paths[5 * 16][1400];
    int nr = 0;
    for (int k = 0; k < s->n; k++) {
        lm_config c = *base;
        c.layer_types[0] = 0;   // re-derive the schedule unless the variant sets it
        if (apply_variant(&c, &s->v[k]) != LM_OK) {
            fprintf(stderr, "linmoe ablate: error: variant %s: %s\n", s->v[k].name, lm_last_error());
            return 1;
        }
        for (int sd = 1; sd <= seeds; sd++) {
            lm_train_opts o = *to;
            o.seed = to->seed + (uint64_t)(sd - 1);
            snprintf(o.out_dir, sizeof o.out_dir, "%.900s/%s-seed%d", dir, s->v[k].name, sd);
            double t0 = lm_time_sec();
            int rc = lm_train_run(&o, &c, ops);
            if (rc != 0) return rc;
            printf("   %-10s seed %d done in %.0f s\n", s->v[k].name, sd, lm_time_sec() - t0);
            fflush(stdout);
            snprintf(paths[nr], sizeof paths[nr], "%s/metrics.jsonl", o.out_dir);
            runs[nr] = (lm_report_run){s->v[k].name, (int)o.seed, paths[nr]};
            nr++;
        }
    }
    char title[256];
    snprintf(title, sizeof title, "linmoe ablation: %s", s->what);
    if (lm_report_write(dir, title, runs, nr) != LM_OK) {
        fprintf(stderr, "linmoe ablate: error: report: %s\n", lm_last_error());
        return 1;
    }
    char md[1000];
    snprintf(md, sizeof md, "%s/report.md", dir);
    size_t n;
    FILE *f = fopen(md, "r");
    if (f) {
        char buf[4096];
        while ((n = fread(buf, 1, sizeof buf, f)) > 0) fwrite(buf, 1, n, stdout);
        fclose(f);
    }
    printf("wrote %s/report.html and report.md\n", dir);
    return 0;
}

int lm_cmd_ablate(int argc, char **argv) {
    lm_model_flags mf;
    lm_model_flags_default(&mf);
    lm_train_opts o;
    lm_train_opts_default(&o);
    char which[32] = "balance", out[1024] = "runs/ablate";
    int seeds = 3;
    o.steps = 160;
    o.batch = 8;
    o.eval_every = 40;
    o.save_every = 0;
    o.keep = 1;
    o.overwrite = 1;   // a study re-run replaces its runs
    int keep_checkpoints = 0;
    o.quiet = 1;
    o.log_attnres_every = 25;
    lm_flag fl[48];
    int n = lm_model_flags_add(&mf, fl, 0);
    fl[n++] = (lm_flag){"study", 0, FL_STR, which, sizeof which, "balance, residual, gate, mix, or all"};
    fl[n++] = (lm_flag){"seeds", 0, FL_INT, &seeds, 0, "seeds per variant"};
    fl[n++] = (lm_flag){"checkpoints", 0, FL_BOOL, &keep_checkpoints, 0,
                        "save each run's final checkpoint (off: a study writes only metrics and reports)"};
    fl[n++] = (lm_flag){"out", 'o', FL_STR, out, sizeof out, "output folder (a subfolder per study)"};
    fl[n++] = (lm_flag){"seed", 's', FL_U64, &o.seed, 0, "first seed"};
    fl[n++] = (lm_flag){"steps", 'n', FL_INT, &o.steps, 0, "optimizer steps per run"};
    fl[n++] = (lm_flag){"batch", 'b', FL_INT, &o.batch, 0, "sequences per step"};
    fl[n++] = (lm_flag){"seq", 'T', FL_INT, &o.seq_len, 0, "sequence length"};
    fl[n++] = (lm_flag){"lr", 'l', FL_REAL, &o.opt.lr, 0, "peak learning rate"};
    fl[n++] = (lm_flag){"warmup", 0, FL_INT, &o.opt.warmup, 0, "warmup steps"};
    fl[n++] = (lm_flag){"data", 0, FL_STR, o.data, sizeof o.data, "'tasks', a text file, or shards:a.bin,b.bin"};
    fl[n++] = (lm_flag){"max-example", 0, FL_INT, &o.max_example, 0, "longest task example in tokens (0 = a whole row)"};
    fl[n++] = (lm_flag){"tasks", 0, FL_STR, o.tasks, sizeof o.tasks, "task mix"};
    fl[n++] = (lm_flag){"eval-every", 0, FL_INT, &o.eval_every, 0, "held-out evaluation every N steps"};
    fl[n++] = (lm_flag){"eval-batches", 0, FL_INT, &o.eval_batches, 0, "batches per evaluation"};
    char usage[1024];
    int u = snprintf(usage, sizeof usage,
                     "usage: linmoe ablate [--study NAME] [flags]\n\nMatched runs that differ in one technique, then "
                     "<out>/<study>/report.html and report.md.\nStudies:\n");
    for (int i = 0; i < N_STUDIES && u < (int)sizeof usage; i++)
        u += snprintf(usage + u, sizeof usage - u, "  %-9s %s\n", STUDIES[i].name, STUDIES[i].what);
    int rc0 = lm_flags_run("ablate", usage, fl, n, argc, argv);
    if (rc0 >= 0) return rc0;
    if (seeds < 1 || seeds > 16) { fprintf(stderr, "linmoe ablate: error: --seeds must be in [1, 16]\n"); return 1; }
    o.no_checkpoints = !keep_checkpoints;
    lm_config base;
    const lm_ops *ops;
    if (lm_model_flags_backend(&mf, &ops) != LM_OK || lm_model_flags_config(&mf, &base) != LM_OK) {
        fprintf(stderr, "linmoe ablate: error: %s\n", lm_last_error());
        return 1;
    }
    int found = 0, rc = 0;
    if (lm_make_dirs(out) != LM_OK) {
        fprintf(stderr, "linmoe ablate: error: %s\n", lm_last_error());
        return 1;
    }
    for (int i = 0; i < N_STUDIES && rc == 0; i++) {
        if (strcmp(which, "all") != 0 && strcmp(which, STUDIES[i].name) != 0) continue;
        found = 1;
        rc = run_study(&STUDIES[i], &base, &o, seeds, out, ops);
    }
    if (!found) {
        fprintf(stderr, "linmoe ablate: error: --study '%s' is not balance, residual, gate, mix or all\n", which);
        return 1;
    }
    return rc;
}
