// eval.h — held-out evaluation: mean loss, per-task exact-match accuracy and loss,
// and loss by position.
//
// Accuracy is "every answer token is the argmax given the correct prefix", which is
// exactly whether greedy decoding reproduces the answer (the first wrong argmax is
// where greedy decoding would leave the answer), so it needs one forward per batch.
#ifndef LM_EVAL_H
#define LM_EVAL_H
#include "model/model.h"
#include "train/loader.h"
#include <cjson/cJSON.h>

#define LM_EVAL_POS_BUCKETS 16

typedef struct {
    double loss;                         // mean CE over counted targets
    long count;
    lm_task_stat task[LM_TASK_COUNT];    // per-task exact match and answer loss
    int T, bucket;                       // loss_by_pos bucket width in positions
    double pos_loss[LM_EVAL_POS_BUCKETS];
    long pos_count[LM_EVAL_POS_BUCKETS];
} lm_eval_result;

lm_status lm_eval_run(lm_model *m, lm_loader *ld, int B, int T, int n_batches, lm_eval_result *r);
cJSON *lm_eval_json(const lm_eval_result *r);          // {"type":"eval", ...} (no step)
void lm_eval_print(const lm_eval_result *r, FILE *f);  // one line
double lm_eval_mean_acc(const lm_eval_result *r);      // over tasks with examples; NAN if none

#endif
