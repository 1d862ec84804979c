// generate.h — prefill + decode for one prompt with the model's caches (KDA state,
// short-conv caches, MLA latent cache).
#ifndef LM_GENERATE_H
#define LM_GENERATE_H
#include "model/model.h"
#include "infer/sampler.h"

typedef struct {
    int max_new;          // tokens to generate at most
    int stop_token;       // stop after emitting this token (−1: never)
    int prefill_chunk;    // prompt tokens per prefill forward (0 = the whole prompt at once)
} lm_gen_opts;

// Generates after `prompt` (n_prompt ≥ 1 tokens). Writes the new tokens to out
// (capacity max_new) and returns how many were written.
int lm_generate(lm_model *m, const int *prompt, int n_prompt, int *out, const lm_gen_opts *o, lm_sampler *s);

// Samples held-out task examples and prints prompt, the model's greedy answer and the
// right one, n per task. Returns the number answered exactly.
int lm_show_task_samples(lm_model *m, int n_per_task, uint64_t seed, int max_len, FILE *f);

// Prints tokens as text: printable bytes as themselves, others escaped, specials named.
void lm_print_tokens(FILE *f, const int *tok, int n);

#endif
