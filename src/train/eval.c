// eval.c — see eval.h.
#include "train/eval.h"

lm_status lm_eval_run(lm_model *m, lm_loader *ld, int B, int T, int n_batches, lm_eval_result *r) {
    memset(r, 0, sizeof *r);
    r->T = T;
    r->bucket = (T + LM_EVAL_POS_BUCKETS - 1) / LM_EVAL_POS_BUCKETS;
    const int V = m->cfg.vocab, N = B * T;
    lm_batch b = {0};
    real *logits = lm_malloc((size_t)N * V * sizeof(real)), *losses = lm_malloc((size_t)N * sizeof(real));
    int *argmax = lm_malloc((size_t)N * sizeof(int));
    double sum = 0;
    lm_status st = LM_OK;
    for (int k = 0; k < n_batches && st == LM_OK; k++) {
        if ((st = lm_loader_next(ld, B, T, &b)) != LM_OK) break;
        lm_fwd_opts fo = {.training = 0, .capacity = -1, .aux_weight = 0};
        lm_model_forward(m, b.tokens, b.targets, B, T, fo);
        m->ops->to_host(logits, m->acts.logits, (size_t)N * V * sizeof(real));
        m->ops->to_host(losses, m->acts.losses, (size_t)N * sizeof(real));
        for (int i = 0; i < N; i++) {
            int best = 0;
            for (int v = 1; v < V; v++)
                if (logits[(size_t)i * V + v] > logits[(size_t)i * V + best]) best = v;
            argmax[i] = best;
            if (b.targets[i] < 0) continue;
            sum += losses[i];
            r->count++;
            int bk = (i % T) / r->bucket;
            r->pos_loss[bk] += losses[i];
            r->pos_count[bk]++;
        }
        lm_task_stats_add(r->task, &b, losses, argmax);
    }
    r->loss = r->count ? sum / r->count : NAN;
    lm_batch_free(&b);
    free(logits);
    free(losses);
    free(argmax);
    return st;
}

double lm_eval_mean_acc(const lm_eval_result *r) {
    double s = 0;
    int n = 0;
    for (int t = 0; t < LM_TASK_COUNT; t++)
        if (r->task[t].n) { s += (double)r->task[t].exact / r->task[t].n; n++; }
    return n ? s / n : NAN;
}

cJSON *lm_eval_json(const lm_eval_result *r) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "eval");
    cJSON_AddNumberToObject(o, "loss", isfinite(r->loss) ? r->loss : -1);
    cJSON *tasks = cJSON_AddObjectToObject(o, "tasks");
    for (int t = 0; t < LM_TASK_COUNT; t++) {
        const lm_task_stat *ts = &r->task[t];
        if (!ts->n) continue;
        cJSON *e = cJSON_AddObjectToObject(tasks, lm_task_name(t));
        cJSON_AddNumberToObject(e, "acc", (double)ts->exact / ts->n);
        cJSON_AddNumberToObject(e, "loss", ts->n_tgt ? ts->loss_sum / ts->n_tgt : 0);
        cJSON_AddNumberToObject(e, "n", (double)ts->n);
    }
    cJSON *pos = cJSON_AddArrayToObject(o, "loss_by_pos");
    for (int k = 0; k < LM_EVAL_POS_BUCKETS; k++) {
        if (!r->pos_count[k]) continue;
        cJSON *p = cJSON_CreateArray();
        cJSON_AddItemToArray(p, cJSON_CreateNumber(k * r->bucket));
        cJSON_AddItemToArray(p, cJSON_CreateNumber(r->pos_loss[k] / r->pos_count[k]));
        cJSON_AddItemToArray(pos, p);
    }
    return o;
}

void lm_eval_print(const lm_eval_result *r, FILE *f) {
    fprintf(f, "eval | loss %.4f", r->loss);
    for (int t = 0; t < LM_TASK_COUNT; t++)
        if (r->task[t].n)
            fprintf(f, " | %s %.1f%%", lm_task_name(t), 100.0 * r->task[t].exact / r->task[t].n);
    fprintf(f, "\n");
    fflush(f);
}
