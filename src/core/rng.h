// rng.h — a small deterministic generator (xoshiro256**, seeded by splitmix64).
// Its whole state is four uint64 words, so a training-state file can save and
// restore it exactly (bit-exact resume).
#ifndef LM_RNG_H
#define LM_RNG_H
#include <stdint.h>

typedef struct { uint64_t s[4]; } lm_rng;

void lm_rng_seed(lm_rng *r, uint64_t seed);
uint64_t lm_rng_u64(lm_rng *r);
uint32_t lm_rng_below(lm_rng *r, uint32_t n);   // uniform in [0, n)
double lm_rng_uniform(lm_rng *r);               // uniform in [0, 1)
double lm_rng_normal(lm_rng *r);                // standard normal (Box-Muller, no cached pair)

#endif
