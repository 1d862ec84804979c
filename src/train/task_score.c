// task_score.c — per-task exact match and loss over the examples of a task batch.
#include "train/tasks.h"

void lm_task_stats_add(lm_task_stat stats[LM_TASK_COUNT], const lm_batch *b, const real *loss, const int *pred) {
    for (int e = 0; e < b->n_ex; e++) {
        const lm_example *x = &b->ex[e];
        LM_ASSERT(x->task >= 0 && x->task < LM_TASK_COUNT);
        lm_task_stat *s = &stats[x->task];
        size_t base = (size_t)x->row * b->T;
        int all = 1;
        for (int t = x->tgt_start; t < x->tgt_start + x->n_tgt; t++) {
            if (loss) s->loss_sum += (double)loss[base + t];
            if (pred && pred[base + t] != b->targets[base + t]) all = 0;
        }
        s->n++;
        s->n_tgt += x->n_tgt;
        s->exact += pred && all;
    }
}
