// train.h — the training loop of `linmoe train`: context stages with a constant token
// budget per step, micro-batches, AdamW/Muon with clipping and WSD, balancing updates
// between steps, non-finite step skipping, periodic held-out evaluation, JSONL
// metrics, atomic checkpoints and bit-exact resume.
#ifndef LM_TRAIN_H
#define LM_TRAIN_H
#include "model/model.h"
#include "train/optimizer.h"

#define LM_MAX_STAGES 8
// limits on a run's shapes: positions and token counts stay within int arithmetic
#define LM_MAX_SEQ (1 << 24)
#define LM_MAX_TOKENS_PER_STEP (1L << 26)

typedef struct {
    char out_dir[1024];
    uint64_t seed;
    char data[1024];          // "tasks", a text file, or "shards:a.bin,b.bin"
    char tasks[256];          // task mix for "tasks" (e.g. "recall:2,copy")
    int max_example;          // longest task example in tokens (0 = a whole row)
    int steps;                // total optimizer steps (sum of the stages' steps when stages are given)
    int batch;                // sequences per step at the first stage's length
    int micro_batch;          // sequences per forward/backward (0 = the whole step)
    int seq_len;              // sequence length when no stages are given
    char stages[256];         // "256:300,2048:100": (seq_len:steps) list; tokens per step constant
    lm_optim_config opt;
    int eval_every, eval_batches, log_every, save_every, keep;
    int log_attnres_every;
    int max_skips;            // consecutive non-finite steps before stopping
    real qk_clip;             // QK-Clip threshold τ on MLA max logits (Muon only; 0 = off)
    int resume;               // continue from <out_dir>/latest
    int overwrite;            // out_dir holds an earlier run: start over (its checkpoints are removed)
    int no_checkpoints;       // write none (ablation runs: only their metrics are wanted)
    char init[1024];          // start from these weights (model.safetensors)
    int quiet;                // no progress lines (logs still written)
    char nan_steps[128];      // debug: steps whose gradients are poisoned with NaN ("5,6")
    int stop_at;              // debug: leave after this step (a checkpoint is saved), as if interrupted
} lm_train_opts;

void lm_train_opts_default(lm_train_opts *o);
// Runs training; prints progress; returns 0 on success, non-zero with a one-line error.
int lm_train_run(const lm_train_opts *o, const lm_config *cfg, const lm_ops *ops);

#endif
