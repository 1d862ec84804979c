// checkpoint.h — weights as safetensors (HF-compatible names, the config in the
// metadata) and a training-state file (optimizer moments, step, data position, RNG),
// both written atomically into a checkpoint folder that appears by one rename.
//
// Layout of an output folder:
//   <out>/ckpt_000600/model.safetensors   weights (+ balancing biases), metadata: config
//   <out>/ckpt_000600/state.safetensors   AdamW/Muon moments, metadata: step, loader state…
//   <out>/latest                          name of the newest complete checkpoint
// A save writes ckpt_000600.tmp/, fsyncs, renames it to ckpt_000600, then rewrites
// `latest` atomically and prunes old checkpoints (keep-last-N). A crash (kill -9) at
// any point leaves the previous checkpoint and `latest` intact.
#ifndef LM_CHECKPOINT_H
#define LM_CHECKPOINT_H
#include "model/model.h"
#include "train/optimizer.h"

#define LM_STATE_WORDS 32

typedef struct {
    long step;                         // optimizer steps completed
    long skipped_total;                // steps skipped for non-finite values
    uint64_t loader[LM_STATE_WORDS];   // data stream position (loader state blob)
    uint64_t loader_eval[LM_STATE_WORDS];
    double elapsed_s;                  // training wall time so far
    char train_json[4096];             // the training options, for resume checks and logs
} lm_train_state;

// weights only (model.safetensors)
lm_status lm_save_weights(const lm_model *m, const char *path, long step);
// Reads the model config stored in a weights file (to build the model before loading).
lm_status lm_read_weights_config(const char *path, lm_config *c);
// Loads weights into an existing model; refuses a file whose config differs.
lm_status lm_load_weights(lm_model *m, const char *path);

// A complete checkpoint folder
lm_status lm_ckpt_save(const char *out_dir, const lm_model *m, const lm_optim *o, const lm_train_state *st,
                       int keep_last, char *saved_path, size_t saved_len);
// Removes every checkpoint folder (finished or interrupted) and `latest` from out_dir, so a
// fresh run that replaces an earlier one cannot be confused with it.
void lm_ckpt_clear(const char *out_dir);
// Whether out_dir holds an earlier run, and what was found in `what`: 1 = one with a valid
// 'latest' (resumable), 2 = only traces of one (ckpt_* folders, a metrics.jsonl, a broken
// 'latest'), 0 = none
int lm_ckpt_dir_holds_run(const char *out_dir, char *what, size_t len);
// Path of the newest complete checkpoint in out_dir (via `latest`); LM_ERR if none.
lm_status lm_ckpt_latest(const char *out_dir, char *path, size_t len);
// Restores model weights, optimizer moments and the training state.
lm_status lm_ckpt_load(const char *ckpt_dir, lm_model *m, lm_optim *o, lm_train_state *st);

#endif
