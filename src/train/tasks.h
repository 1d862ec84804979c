// tasks.h — the built-in synthetic tasks: a seeded generator of examples with exact
// answers, and the packing of examples into training rows. This is linmoe's default
// dataset: nothing to download, every answer checkable, and lengths that follow the
// context so the same tasks serve the 256-token and the 8K-token stages.
//
// An example is   BOS  prompt-bytes  SEP  answer-bytes  EOS
// and only the answer bytes and the EOS are trained (the prompts are random, so
// predicting them is noise). Tasks, by the names logs and reports use:
//   recall   "ka=41 xq=07 mm=93 ?xq" → "07"         pairs grow with the allowed length
//   copy     "copy:qmwhe"            → "qmwhe"       4..32 letters
//   reverse  "rev:qmwhe"             → "ehwmq"       4..32 letters
//   add      "4821+907="             → "5728"        operands of 1..8 digits
//   passkey  filler + "The pass key is 48213. Remember it. " at a random depth
//            + "What is the pass key?" → "48213"     filler fills the allowed length
//   tool     "17 km in miles?"       → <call>convert(17,"km","mi")</call>   (5 templates)
// Every generator fits its example into the length it is given, shrinking the
// difficulty (pairs, letters, digits, filler) when the room is short.
#ifndef LM_TASKS_H
#define LM_TASKS_H
#include "core/common.h"
#include "core/rng.h"
#include "train/batch.h"

typedef enum {
    LM_TASK_RECALL, LM_TASK_COPY, LM_TASK_REVERSE, LM_TASK_ADD, LM_TASK_PASSKEY, LM_TASK_TOOL,
    LM_TASK_COUNT
} lm_task_id;

const char *lm_task_name(int task);           // "recall", …; "?" when out of range
int lm_task_by_name(const char *name);         // −1 when unknown
// The shortest example length (tokens, BOS..EOS) at which the task always fits.
int lm_task_min_len(int task);

// ----------------------------------------------------------------------------
// one example

typedef struct {
    int task;
    int len;         // tokens written, BOS..EOS
    int sep;         // index of SEP: prompt bytes are [1, sep), answer bytes (sep, len−1)
    int answer_len;  // = len − sep − 2
} lm_task_example;

// Writes one example of `task` into out[0 .. len) with len ≤ max_len, drawing from r.
// LM_ERR when max_len < lm_task_min_len(task).
lm_status lm_task_generate(int task, lm_rng *r, int max_len, int *out, lm_task_example *ex);
// A passkey example whose key sits at a chosen depth ∈ [0, 1] of the filler (0: before
// all of it, 1: after it), for length × depth evaluation grids.
lm_status lm_task_passkey_at(lm_rng *r, int max_len, double depth, int *out, lm_task_example *ex);

// ----------------------------------------------------------------------------
// task mix: a non-negative weight per task (relative frequency of examples)

typedef struct { double w[LM_TASK_COUNT]; } lm_task_mix;

void lm_task_mix_default(lm_task_mix *m);      // all six tasks, equal weights
// Parses "recall:2,copy,add:0.5" (a missing weight means 1; tasks not named get 0)
// or "all". LM_ERR on an unknown name, a bad weight, or all weights zero.
lm_status lm_task_mix_parse(lm_task_mix *m, const char *spec);
// Writes "recall:1,copy:1,…" (non-zero weights only) for logs.
void lm_task_mix_format(const lm_task_mix *m, char *buf, size_t n);

// ----------------------------------------------------------------------------
// the generator: a stream of packed batches

typedef struct {
    uint64_t seed;      // the seed this stream was created with (train or held-out)
    lm_task_mix mix;
    int max_len;        // longest example in tokens; 0 = as long as a row (T+1)
    lm_rng rng;         // the stream position: with the counters, all of the state
    uint64_t n_examples, n_batches;   // counters (for logs; saved with the state)
    int *row;           // scratch [T+1]
    int row_cap;
} lm_task_gen;

// The held-out stream's seed: a fixed function of the training seed that never
// returns the seed itself, so train and held-out examples come from different streams.
uint64_t lm_task_heldout_seed(uint64_t seed);

// max_len = 0 lets examples be as long as a row. LM_ERR on a negative max_len or an
// all-zero mix.
lm_status lm_task_gen_init(lm_task_gen *g, uint64_t seed, const lm_task_mix *mix, int max_len);
void lm_task_gen_free(lm_task_gen *g);
// Back to the start of the stream (the state right after init).
void lm_task_gen_rewind(lm_task_gen *g);

// Fills B rows of T tokens. Each row holds whole examples back to back from position
// 0 over T+1 slots (the last slot is seen only as the target of position T−1); each
// example gets at most min(max_len, room left in the row) tokens, and its task is
// drawn by weight among the tasks that fit that room. When none fits, the rest of the
// row is PAD. targets[b,t] = tokens of slot t+1 where slot t+1 is an answer byte or
// an example's EOS, else −1. out->ex lists every example (row, position, targets).
// LM_ERR when a task of the mix cannot fit even an empty row.
lm_status lm_task_batch(lm_task_gen *g, int B, int T, lm_batch *out);

// ----------------------------------------------------------------------------
// scoring (evaluation): per-task exact match and answer loss

typedef struct {
    long n;           // examples
    long exact;       // examples whose every counted target (answer bytes + EOS) was predicted
    long n_tgt;       // counted targets
    double loss_sum;  // Σ cross-entropy over counted targets
} lm_task_stat;

// Adds a task batch's examples to stats[task]. loss[B·T]: cross-entropy at each
// position (may be NULL); pred[B·T]: the argmax token at each position (may be NULL).
// "Every answer token is the argmax given the correct prefix" equals greedy exact match.
// Report acc = exact / n and loss = loss_sum / n_tgt.
void lm_task_stats_add(lm_task_stat stats[LM_TASK_COUNT], const lm_batch *b, const real *loss, const int *pred);

#endif
