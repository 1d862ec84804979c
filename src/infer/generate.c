// generate.c — see generate.h.
#include "infer/generate.h"
#include "train/tasks.h"
#include "train/tokens.h"
#include <ctype.h>

int lm_generate(lm_model *m, const int *prompt, int n_prompt, int *out, const lm_gen_opts *o, lm_sampler *s) {
    const lm_ops *ops = m->ops;
    const int V = m->cfg.vocab;
    lm_cache *kc = lm_cache_create(&m->cfg, ops, 1, n_prompt + o->max_new);
    lm_fwd_opts fo = {.training = 0, .capacity = -1, .cache = kc};
    real *logits = lm_malloc((size_t)V * sizeof(real));
    int chunk = o->prefill_chunk > 0 ? o->prefill_chunk : n_prompt;
    for (int p = 0; p < n_prompt; p += chunk) {
        int n = lm_min(chunk, n_prompt - p);
        lm_model_forward(m, prompt + p, NULL, 1, n, fo);
        if (p + n == n_prompt) ops->to_host(logits, m->acts.logits + (size_t)(n - 1) * V, (size_t)V * sizeof(real));
    }
    int k = 0;
    while (k < o->max_new) {
        int t = lm_sample(s, logits, V);
        out[k++] = t;
        if (t == o->stop_token || k == o->max_new) break;
        lm_model_forward(m, &t, NULL, 1, 1, fo);
        ops->to_host(logits, m->acts.logits, (size_t)V * sizeof(real));
    }
    free(logits);
    lm_cache_free(kc);
    return k;
}

void lm_print_tokens(FILE *f, const int *tok, int n) {
    for (int i = 0; i < n; i++) {
        int t = tok[i];
        if (t == LM_TOK_BOS) fputs("<bos>", f);
        else if (t == LM_TOK_EOS) fputs("<eos>", f);
        else if (t == LM_TOK_SEP) fputs(" => ", f);
        else if (t == LM_TOK_PAD) fputs("<pad>", f);
        else if (t < 256 && (isprint(t) || t == ' ')) fputc(t, f);
        else if (t == '\n') fputs("\\n", f);
        else fprintf(f, "<%d>", t);
    }
}

int lm_show_task_samples(lm_model *m, int n_per_task, uint64_t seed, int max_len, FILE *f) {
    lm_rng r;
    lm_rng_seed(&r, lm_task_heldout_seed(seed) ^ 0x5a5a5a5aULL);
    int *ex = lm_malloc((size_t)max_len * sizeof(int)), *out = lm_malloc((size_t)max_len * sizeof(int));
    lm_sampler s;
    lm_sampler_init(&s, 0, 0, 1, 0);
    int right = 0, total = 0;
    for (int task = 0; task < LM_TASK_COUNT; task++) {
        if (lm_task_min_len(task) > max_len) continue;
        for (int i = 0; i < n_per_task; i++) {
            lm_task_example e;
            // short enough to read: a quarter of the context, at least the task's minimum
            int len = lm_max(lm_task_min_len(task), max_len / 4);
            if (task == LM_TASK_PASSKEY) len = max_len;
            if (lm_task_generate(task, &r, len, ex, &e) != LM_OK) continue;
            lm_gen_opts go = {.max_new = e.answer_len + 4, .stop_token = LM_TOK_EOS};
            int n = lm_generate(m, ex, e.sep + 1, out, &go, &s);
            int ok = n == e.answer_len + 1 && memcmp(out, ex + e.sep + 1, (size_t)n * sizeof(int)) == 0;
            right += ok;
            total++;
            fprintf(f, "  %-8s %s ", lm_task_name(task), ok ? "ok  " : "MISS");
            int shown = e.sep;
            if (task == LM_TASK_PASSKEY) {   // the filler is long: show its last words
                int from = lm_max(1, e.sep - 60);
                fputs("...", f);
                lm_print_tokens(f, ex + from, e.sep - from);
            } else {
                lm_print_tokens(f, ex + 1, shown - 1);
            }
            fputs(" => ", f);
            lm_print_tokens(f, out, n > 0 && out[n - 1] == LM_TOK_EOS ? n - 1 : n);
            fputs("   (right: ", f);
            lm_print_tokens(f, ex + e.sep + 1, e.answer_len);
            fputs(")\n", f);
        }
    }
    fprintf(f, "  %d of %d answered exactly\n", right, total);
    lm_sampler_free(&s);
    free(ex);
    free(out);
    return right;
}
