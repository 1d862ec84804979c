// cmd_train.c — `linmoe train`.
#include "cli/cli.h"
#include "infer/generate.h"
#include "train/checkpoint.h"
#include "train/train.h"

// no --out given: a value no one types (an empty --out stays an error, reported by the run; --help
// shows no default for a value that starts with a control character)
#define OUT_UNSET "\x01"
// runs/<name>: the config file's name without folder and extension, else the preset's (a run of
// `--preset small` had gone to runs/tiny, where a tiny run may already live)
static void default_out_dir(const lm_model_flags *mf, char *out, size_t n) {
    const char *name = mf->preset;
    int len = (int)strlen(name);
    if (mf->config_file[0]) {
        const char *slash = strrchr(mf->config_file, '/'), *base = slash ? slash + 1 : mf->config_file;
        const char *dot = strrchr(base, '.');
        name = base;
        len = dot && dot > base ? (int)(dot - base) : (int)strlen(base);
    }
    snprintf(out, n, "runs/%.*s", len, name);
}

int lm_cmd_train(int argc, char **argv) {
    lm_model_flags mf;
    lm_model_flags_default(&mf);
    lm_train_opts o;
    lm_train_opts_default(&o);
    snprintf(o.out_dir, sizeof o.out_dir, "%s", OUT_UNSET);   // without --out: default_out_dir
    char optimizer[16] = "adamw";
    int samples = 2;
    lm_flag fl[64];
    int n = lm_model_flags_add(&mf, fl, 0);
    fl[n++] = (lm_flag){"out", 'o', FL_STR, o.out_dir, sizeof o.out_dir,
                        "output folder (metrics.jsonl, checkpoints); default runs/<preset or config file name>"};
    fl[n++] = (lm_flag){"seed", 's', FL_U64, &o.seed, 0, "seed of weights and data"};
    fl[n++] = (lm_flag){"data", 0, FL_STR, o.data, sizeof o.data,
                        "'tasks' (built-in synthetic tasks), a text file, or shards:a.bin,b.bin"};
    fl[n++] = (lm_flag){"max-example", 0, FL_INT, &o.max_example, 0, "longest task example in tokens (0 = a whole row)"};
    fl[n++] = (lm_flag){"tasks", 0, FL_STR, o.tasks, sizeof o.tasks, "task mix, e.g. recall:2,copy,add or all"};
    fl[n++] = (lm_flag){"steps", 'n', FL_INT, &o.steps, 0, "optimizer steps (ignored with --stages)"};
    fl[n++] = (lm_flag){"batch", 'b', FL_INT, &o.batch, 0, "sequences per step (at the first stage's length)"};
    fl[n++] = (lm_flag){"micro-batch", 0, FL_INT, &o.micro_batch, 0, "sequences per forward/backward (0 = all)"};
    fl[n++] = (lm_flag){"seq", 'T', FL_INT, &o.seq_len, 0, "sequence length (without --stages)"};
    fl[n++] = (lm_flag){"stages", 0, FL_STR, o.stages, sizeof o.stages,
                        "context stages seq:steps,... with constant tokens per step (e.g. 256:400,2048:100)"};
    fl[n++] = (lm_flag){"optimizer", 0, FL_STR, optimizer, sizeof optimizer, "adamw, or muon (2-D matrices; AdamW for the rest)"};
    fl[n++] = (lm_flag){"lr", 'l', FL_REAL, &o.opt.lr, 0, "peak learning rate"};
    fl[n++] = (lm_flag){"warmup", 0, FL_INT, &o.opt.warmup, 0, "warmup steps"};
    fl[n++] = (lm_flag){"decay-frac", 0, FL_REAL, &o.opt.decay_frac, 0, "WSD: fraction of steps in the final decay"};
    fl[n++] = (lm_flag){"final-lr-frac", 0, FL_REAL, &o.opt.final_frac, 0, "WSD: final lr as a fraction of the peak"};
    fl[n++] = (lm_flag){"wd", 0, FL_REAL, &o.opt.wd, 0, "decoupled weight decay (not on norms, biases, gates, embeddings)"};
    fl[n++] = (lm_flag){"wd-embed", 0, FL_BOOL, &o.opt.wd_embed, 0, "also decay the embedding table"};
    fl[n++] = (lm_flag){"clip", 0, FL_REAL, &o.opt.clip, 0, "global gradient-norm clip (0 = off)"};
    fl[n++] = (lm_flag){"beta1", 0, FL_REAL, &o.opt.b1, 0, "AdamW beta1"};
    fl[n++] = (lm_flag){"beta2", 0, FL_REAL, &o.opt.b2, 0, "AdamW beta2"};
    fl[n++] = (lm_flag){"muon-momentum", 0, FL_REAL, &o.opt.muon_mu, 0, "Muon momentum (Nesterov)"};
    fl[n++] = (lm_flag){"qk-clip", 0, FL_REAL, &o.qk_clip, 0, "Muon: QK-Clip threshold on MLA max logits (0 = off)"};
    fl[n++] = (lm_flag){"eval-every", 0, FL_INT, &o.eval_every, 0, "held-out evaluation every N steps (0 = only at the end)"};
    fl[n++] = (lm_flag){"eval-batches", 0, FL_INT, &o.eval_batches, 0, "batches per evaluation"};
    fl[n++] = (lm_flag){"log-every", 0, FL_INT, &o.log_every, 0, "progress line every N steps"};
    fl[n++] = (lm_flag){"log-attnres", 0, FL_INT, &o.log_attnres_every, 0, "log AttnRes weights every N steps"};
    fl[n++] = (lm_flag){"save-every", 0, FL_INT, &o.save_every, 0, "checkpoint every N steps (and at the end)"};
    fl[n++] = (lm_flag){"keep", 0, FL_INT, &o.keep, 0, "checkpoints to keep"};
    fl[n++] = (lm_flag){"no-checkpoints", 0, FL_BOOL, &o.no_checkpoints, 0, "write no checkpoints (benchmark runs)"};
    fl[n++] = (lm_flag){"max-skips", 0, FL_INT, &o.max_skips, 0, "stop after N non-finite steps in a row (0 = never)"};
    fl[n++] = (lm_flag){"resume", 'r', FL_BOOL, &o.resume, 0, "continue bit-exactly from <out>/latest (without --out: runs/<preset>, so name the preset or the folder)"};
    fl[n++] = (lm_flag){"overwrite", 0, FL_BOOL, &o.overwrite, 0, "<out> holds an earlier run: start over (removes its checkpoints)"};
    fl[n++] = (lm_flag){"init", 0, FL_STR, o.init, sizeof o.init, "start from these weights (model.safetensors)"};
    fl[n++] = (lm_flag){"samples", 0, FL_INT, &samples, 0, "at the end, print N generated answers per task (task data; needs a checkpoint)"};
    fl[n++] = (lm_flag){"quiet", 'q', FL_BOOL, &o.quiet, 0, "no progress lines"};
    fl[n++] = (lm_flag){"debug-nan-steps", 0, FL_STR, o.nan_steps, sizeof o.nan_steps,
                        "testing: poison the gradients of these steps with NaN (e.g. 5,6)"};
    fl[n++] = (lm_flag){"debug-stop-at", 0, FL_INT, &o.stop_at, 0, "testing: stop after this step as if interrupted"};
    int rc = lm_flags_run("train", "usage: linmoe train [flags]\n\nTrains a model; writes <out>/metrics.jsonl and checkpoints.\n", fl, n, argc, argv);
    if (rc >= 0) return rc;
    if (strcmp(o.out_dir, OUT_UNSET) == 0) default_out_dir(&mf, o.out_dir, sizeof o.out_dir);
    lm_config cfg;
    const lm_ops *ops;
    int k = lm_optimizer_from_name(optimizer);
    if (k < 0) { fprintf(stderr, "linmoe train: error: --optimizer '%s' is not adamw or muon\n", optimizer); return 1; }
    o.opt.kind = k;
    if (samples < 0) { fprintf(stderr, "linmoe train: error: --samples must be >= 0\n"); return 1; }
    if (o.resume && o.init[0]) { fprintf(stderr, "linmoe train: error: use --resume or --init, not both\n"); return 1; }
    if (lm_model_flags_backend(&mf, &ops) != LM_OK || lm_model_flags_config(&mf, &cfg) != LM_OK) {
        fprintf(stderr, "linmoe train: error: %s\n", lm_last_error());
        return 1;
    }
    if (o.resume) {
        // the checkpoint's config is authoritative; refuse a different one on the command line
        char ck[2048], p[2100];
        lm_config saved;
        if (lm_ckpt_latest(o.out_dir, ck, sizeof ck) != LM_OK) {
            fprintf(stderr, "linmoe train: error: --resume: %s\n", lm_last_error());
            return 1;
        }
        snprintf(p, sizeof p, "%s/model.safetensors", ck);
        if (lm_read_weights_config(p, &saved) != LM_OK) {
            fprintf(stderr, "linmoe train: error: --resume: %s\n", lm_last_error());
            return 1;
        }
        // model flags on the command line must agree with the checkpoint; none means "as saved"
        int given = 0;
        const char *mflags[] = {"--preset", "-p", "--config", "-c", "--set", "--balance", "--residual", "--gate"};
        for (int i = 2; i < argc; i++)
            for (size_t j = 0; j < sizeof mflags / sizeof *mflags; j++)
                if (strncmp(argv[i], mflags[j], strlen(mflags[j])) == 0 &&
                    (argv[i][strlen(mflags[j])] == 0 || argv[i][strlen(mflags[j])] == '='))
                    given = 1;
        char *a = lm_config_to_json(&cfg), *b = lm_config_to_json(&saved);
        int same = strcmp(a, b) == 0;
        free(a);
        free(b);
        if (given && !same) {
            fprintf(stderr, "linmoe train: error: --resume: the model flags do not match the checkpoint's config "
                            "(%s); resume without model flags to use the saved config\n", p);
            return 1;
        }
        cfg = saved;
    }
    rc = lm_train_run(&o, &cfg, ops);
    char ck[2048];
    // the samples come from the saved weights (none with --no-checkpoints)
    if (rc == 0 && samples > 0 && strcmp(o.data, "tasks") == 0 && lm_ckpt_latest(o.out_dir, ck, sizeof ck) == LM_OK) {
        char p[2100];
        snprintf(p, sizeof p, "%s/model.safetensors", ck);
        lm_model *m = lm_model_create(&cfg, ops, o.seed);
        if (lm_load_weights(m, p) == LM_OK) {
            printf("generated answers (held-out examples, greedy decoding with caches):\n");
            int len = o.max_example > 0 ? o.max_example : o.stages[0] ? 256 : o.seq_len;
            lm_show_task_samples(m, samples, o.seed, len, stdout);
        }
        lm_model_free(m);
    }
    return rc;
}
