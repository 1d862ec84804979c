// sampler.h — next-token sampling from logits: greedy (temperature 0), or
// temperature + top-k + top-p (nucleus) with a seeded generator.
#ifndef LM_SAMPLER_H
#define LM_SAMPLER_H
#include "core/common.h"
#include "core/rng.h"

typedef struct {
    real temperature;   // 0 = greedy
    int top_k;          // 0 = all
    real top_p;         // 1 = all
    lm_rng rng;
    // scratch
    int *idx;
    double *prob;
    int cap;
} lm_sampler;

void lm_sampler_init(lm_sampler *s, real temperature, int top_k, real top_p, uint64_t seed);
void lm_sampler_free(lm_sampler *s);
// logits [V] (host) → token id
int lm_sample(lm_sampler *s, const real *logits, int V);

#endif
