// loader.h — one interface over the three data sources of `linmoe train`:
//   tasks   the built-in synthetic tasks (tasks.h), a seeded stream with a task mix
//   text    one text file read as bytes (text.h)
//   shards  a list of uint32 token-shard files (text.h)
//
// Resume: the whole stream position is a small fixed-size state (get/set), which the
// training-state file saves; a fresh loader made with the same arguments and given
// that state continues with exactly the batches the original would have produced.
//
// The state holds the position, not the configuration: a resumed run recreates the
// loader with its saved arguments (seed, mix, max length, files) and then sets the
// state. The seed (tasks) or the data's size and CRC (text/shards) are checked; the mix
// and max length are not, so a new context stage may change them and the stream
// continues from the same RNG state under the new mix.
//
// Evaluation: lm_loader_init_heldout makes the held-out loader of a training loader.
// For tasks it is the same generator and mix on lm_task_heldout_seed(seed); for text
// and shards it reads the last 5% of the data, which the training loader never reads.
// Call lm_loader_rewind before each evaluation to score the same batches every time.
#ifndef LM_LOADER_H
#define LM_LOADER_H
#include "train/batch.h"
#include "train/tasks.h"
#include "train/text.h"

typedef enum { LM_LOADER_TASKS = 1, LM_LOADER_TEXT = 2, LM_LOADER_SHARDS = 3 } lm_loader_kind;

typedef struct {
    lm_loader_kind kind;
    int heldout;              // 1 for an evaluation loader
    lm_task_gen tasks;        // kind == LM_LOADER_TASKS
    lm_token_reader reader;   // kind == LM_LOADER_TEXT or LM_LOADER_SHARDS
} lm_loader;

// The state blob: word 0 = magic "LMDS" << 32 | version, word 1 = kind | heldout << 8,
// then the source's identity (task seed, or token count + CRC + region) and position
// (task RNG + counters, or offset + batch count); unused words are zero.
#define LM_LOADER_STATE_WORDS 16
#define LM_LOADER_STATE_VERSION 1

// model_vocab: the model's vocab; the data's token ids must be below it.
// max_len: the longest task example in tokens, 0 = up to a whole row.
lm_status lm_loader_init_tasks(lm_loader *l, uint64_t seed, const lm_task_mix *mix, int max_len, int model_vocab);
lm_status lm_loader_init_text(lm_loader *l, const char *path, int model_vocab);
lm_status lm_loader_init_shards(lm_loader *l, const char *const *paths, int n, int model_vocab);
// The training loader named by a --data value: "tasks" (with mix, seed and max_len),
// "shards:a.bin,b.bin" (a comma-separated list, at most 256 files), or a text file's path.
lm_status lm_loader_init_spec(lm_loader *l, const char *data, uint64_t seed, const lm_task_mix *mix, int max_len,
                              int model_vocab);
// The held-out loader of `train` (which must be a training loader). For text/shards it
// shares train's mapped files; free it before train or after, either works.
lm_status lm_loader_init_heldout(lm_loader *eval, const lm_loader *train);
void lm_loader_free(lm_loader *l);

// The next batch: B rows of T tokens (see tasks.h / text.h for what a row holds).
lm_status lm_loader_next(lm_loader *l, int B, int T, lm_batch *out);

void lm_loader_get_state(const lm_loader *l, uint64_t state[LM_LOADER_STATE_WORDS]);
// LM_ERR (loader unchanged) when the state is corrupt, of another version, or was saved
// by a loader of another kind, seed or data.
lm_status lm_loader_set_state(lm_loader *l, const uint64_t state[LM_LOADER_STATE_WORDS]);
void lm_loader_rewind(lm_loader *l);
// One line for logs, e.g. "tasks seed 1 mix recall:1,copy:1 (train)".
void lm_loader_describe(const lm_loader *l, char *buf, size_t n);

#endif
