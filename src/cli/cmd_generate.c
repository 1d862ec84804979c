// cmd_generate.c — `linmoe generate` and `linmoe eval` on a checkpoint.
#include "cli/cli.h"
#include "infer/generate.h"
#include "train/checkpoint.h"
#include "train/eval.h"
#include "train/loader.h"
#include "train/tokens.h"
#include "train/train.h"

// Loads the model stored in a weights file (its config comes from the file).
static lm_model *load_model(const char *path, const lm_ops *ops) {
    lm_config c;
    if (lm_read_weights_config(path, &c) != LM_OK) return NULL;
    double tot, act;
    lm_config_count_params(&c, &tot, &act);   // weights and their gradient buffer
    if (strcmp(ops->name, "cpu") == 0 && lm_check_host_memory(tot * 2 * sizeof(real), "this model") != LM_OK) return NULL;
    lm_model *m = lm_model_create(&c, ops, 0);
    if (lm_load_weights(m, path) != LM_OK) { lm_model_free(m); return NULL; }
    return m;
}

// A weights file, a checkpoint folder, or a run folder (its latest checkpoint).
static void weights_path(const char *arg, char *out, size_t n) {
    size_t l = strlen(arg);
    char ck[2048];
    if (l > 12 && strcmp(arg + l - 12, ".safetensors") == 0) snprintf(out, n, "%s", arg);
    else if (lm_ckpt_latest(arg, ck, sizeof ck) == LM_OK) snprintf(out, n, "%s/model.safetensors", ck);
    else snprintf(out, n, "%s/model.safetensors", arg);
}
#define MODEL_HELP "a run folder (its latest checkpoint), a checkpoint folder or a model.safetensors (required)"

int lm_cmd_generate(int argc, char **argv) {
    lm_model_flags mf;
    lm_model_flags_default(&mf);
    char model[1024] = "", prompt[4096] = "";
    int max_new = 64, top_k = 0, tasks = 0, raw = 0, chunk = 0;
    real temp = 0, top_p = 1;
    uint64_t seed = 1;
    lm_flag fl[32];
    int n = 0;
    fl[n++] = (lm_flag){"model", 'm', FL_STR, model, sizeof model, MODEL_HELP};
    fl[n++] = (lm_flag){"prompt", 'P', FL_STR, prompt, sizeof prompt, "prompt text (bytes); a SEP token is appended unless --raw"};
    fl[n++] = (lm_flag){"raw", 0, FL_BOOL, &raw, 0, "continue the prompt as plain text (no SEP, no stop at EOS)"};
    fl[n++] = (lm_flag){"max-new", 'n', FL_INT, &max_new, 0, "tokens to generate at most"};
    fl[n++] = (lm_flag){"temp", 0, FL_REAL, &temp, 0, "temperature (0 = greedy)"};
    fl[n++] = (lm_flag){"top-k", 0, FL_INT, &top_k, 0, "sample among the k most likely tokens (0 = all)"};
    fl[n++] = (lm_flag){"top-p", 0, FL_REAL, &top_p, 0, "nucleus sampling mass"};
    fl[n++] = (lm_flag){"seed", 's', FL_U64, &seed, 0, "sampling seed"};
    fl[n++] = (lm_flag){"prefill-chunk", 0, FL_INT, &chunk, 0, "prompt tokens per prefill forward (0 = all at once)"};
    fl[n++] = (lm_flag){"tasks", 0, FL_INT, &tasks, 0, "instead of a prompt: answer N held-out examples per built-in task"};
    fl[n++] = (lm_flag){"threads", 't', FL_INT, &mf.threads, 0, "CPU threads (0 = all cores)"};
    fl[n++] = (lm_flag){"device", 'd', FL_STR, mf.device, sizeof mf.device, "backend: cpu or cuda"};
    int rc = lm_flags_run("generate", "usage: linmoe generate --model CKPT (--prompt TEXT | --tasks N) [flags]\n", fl, n, argc, argv);
    if (rc >= 0) return rc;
    if (!model[0]) { fprintf(stderr, "linmoe generate: error: --model is required\n"); return 1; }
    if (!prompt[0] && tasks <= 0) { fprintf(stderr, "linmoe generate: error: give --prompt or --tasks\n"); return 1; }
    if (max_new < 1 || max_new > LM_MAX_SEQ) {
        fprintf(stderr, "linmoe generate: error: --max-new must be in [1, %d]\n", LM_MAX_SEQ);
        return 1;
    }
    if (chunk < 0) { fprintf(stderr, "linmoe generate: error: --prefill-chunk must be >= 0\n"); return 1; }
    if (temp < 0 || top_p <= 0 || top_p > 1 || top_k < 0) {
        fprintf(stderr, "linmoe generate: error: need --temp >= 0, 0 < --top-p <= 1, --top-k >= 0\n");
        return 1;
    }
    const lm_ops *ops;
    if (lm_model_flags_backend(&mf, &ops) != LM_OK) { fprintf(stderr, "linmoe generate: error: %s\n", lm_last_error()); return 1; }
    char path[2200];
    weights_path(model, path, sizeof path);
    lm_model *m = load_model(path, ops);
    if (!m) { fprintf(stderr, "linmoe generate: error: %s\n", lm_last_error()); return 1; }
    if (tasks > 0) {
        lm_show_task_samples(m, tasks, seed, m->cfg.seq_len, stdout);
        lm_model_free(m);
        return 0;
    }
    // the prompt is bytes plus BOS (and SEP unless --raw): a model trained on shards with a
    // smaller vocab cannot read it
    const int need_vocab = (raw ? LM_TOK_BOS : LM_TOK_SEP) + 1;
    if (m->cfg.vocab < need_vocab) {
        fprintf(stderr, "linmoe generate: error: --prompt%s needs a byte-level model (vocab >= %d); this one has %d\n",
                raw ? " --raw" : "", need_vocab, m->cfg.vocab);
        lm_model_free(m);
        return 1;
    }
    int np = (int)strlen(prompt);
    int *tok = lm_malloc((size_t)(np + 2) * sizeof(int)), *out = lm_malloc((size_t)max_new * sizeof(int));
    int k = 0;
    tok[k++] = LM_TOK_BOS;
    for (int i = 0; i < np; i++) tok[k++] = (unsigned char)prompt[i];
    if (!raw) tok[k++] = LM_TOK_SEP;
    lm_sampler s;
    lm_sampler_init(&s, temp, top_k, top_p, seed);
    lm_gen_opts go = {.max_new = max_new, .stop_token = raw ? -1 : LM_TOK_EOS, .prefill_chunk = chunk};
    double t0 = lm_time_sec();
    int g = lm_generate(m, tok, k, out, &go, &s);
    double dt = lm_time_sec() - t0;
    lm_print_tokens(stdout, out, g > 0 && out[g - 1] == LM_TOK_EOS ? g - 1 : g);
    printf("\n");
    fprintf(stderr, "%d prompt + %d generated tokens in %.3f s\n", k, g, dt);
    lm_sampler_free(&s);
    free(tok);
    free(out);
    lm_model_free(m);
    return 0;
}

int lm_cmd_eval(int argc, char **argv) {
    lm_model_flags mf;
    lm_model_flags_default(&mf);
    lm_train_opts td;   // the training defaults: same task mix and example length
    lm_train_opts_default(&td);
    char model[1024] = "", data[1024] = "tasks", mix[256];
    snprintf(mix, sizeof mix, "%s", td.tasks);
    int batches = 8, B = 8, T = 0, max_example = td.max_example;
    uint64_t seed = 1;
    lm_flag fl[32];
    int n = 0;
    fl[n++] = (lm_flag){"model", 'm', FL_STR, model, sizeof model, MODEL_HELP};
    fl[n++] = (lm_flag){"data", 0, FL_STR, data, sizeof data, "'tasks', a text file, or shards:a.bin,b.bin (held-out part)"};
    fl[n++] = (lm_flag){"tasks", 0, FL_STR, mix, sizeof mix, "task mix for task data"};
    fl[n++] = (lm_flag){"max-example", 0, FL_INT, &max_example, 0, "longest task example in tokens (0 = a whole row)"};
    fl[n++] = (lm_flag){"seed", 's', FL_U64, &seed, 0, "the training seed (held-out tasks derive from it)"};
    fl[n++] = (lm_flag){"batches", 'n', FL_INT, &batches, 0, "batches to evaluate"};
    fl[n++] = (lm_flag){"batch", 'b', FL_INT, &B, 0, "sequences per batch"};
    fl[n++] = (lm_flag){"seq", 'T', FL_INT, &T, 0, "sequence length (0 = the model's)"};
    fl[n++] = (lm_flag){"threads", 't', FL_INT, &mf.threads, 0, "CPU threads (0 = all cores)"};
    fl[n++] = (lm_flag){"device", 'd', FL_STR, mf.device, sizeof mf.device, "backend: cpu or cuda"};
    int rc = lm_flags_run("eval", "usage: linmoe eval --model CKPT [flags]\n\nHeld-out loss, per-task accuracy and loss by position.\n", fl, n, argc, argv);
    if (rc >= 0) return rc;
    if (!model[0]) { fprintf(stderr, "linmoe eval: error: --model is required\n"); return 1; }
    if (batches < 1 || B < 1) { fprintf(stderr, "linmoe eval: error: --batches and --batch must be positive\n"); return 1; }
    if (T < 0 || T > LM_MAX_SEQ) {
        fprintf(stderr, "linmoe eval: error: --seq must be 0 (the model's) or in [1, %d]\n", LM_MAX_SEQ);
        return 1;
    }
    const lm_ops *ops;
    if (lm_model_flags_backend(&mf, &ops) != LM_OK) { fprintf(stderr, "linmoe eval: error: %s\n", lm_last_error()); return 1; }
    char path[2200];
    weights_path(model, path, sizeof path);
    lm_model *m = load_model(path, ops);
    if (!m) { fprintf(stderr, "linmoe eval: error: %s\n", lm_last_error()); return 1; }
    if (T == 0) T = m->cfg.seq_len;
    if ((long)B * T > LM_MAX_TOKENS_PER_STEP) {
        fprintf(stderr, "linmoe eval: error: %ld tokens per batch is more than %ld\n", (long)B * T, (long)LM_MAX_TOKENS_PER_STEP);
        lm_model_free(m);
        return 1;
    }
    lm_loader tr, ev;
    lm_task_mix tm;
    lm_status st = strcmp(data, "tasks") == 0 ? lm_task_mix_parse(&tm, mix) : LM_OK;
    if (st == LM_OK) st = lm_loader_init_spec(&tr, data, seed, &tm, max_example, m->cfg.vocab);
    if (st == LM_OK) st = lm_loader_init_heldout(&ev, &tr);
    if (st != LM_OK) { fprintf(stderr, "linmoe eval: error: %s\n", lm_last_error()); lm_model_free(m); return 1; }
    lm_eval_result r;
    if (lm_eval_run(m, &ev, B, T, batches, &r) != LM_OK) {
        fprintf(stderr, "linmoe eval: error: %s\n", lm_last_error());
        lm_loader_free(&ev);
        lm_loader_free(&tr);
        lm_model_free(m);
        return 1;
    }
    lm_eval_print(&r, stdout);
    printf("loss by position:");
    for (int k = 0; k < LM_EVAL_POS_BUCKETS; k++)
        if (r.pos_count[k]) printf(" %d:%.3f", k * r.bucket, r.pos_loss[k] / r.pos_count[k]);
    printf("\n");
    lm_loader_free(&ev);
    lm_loader_free(&tr);
    lm_model_free(m);
    return 0;
}
