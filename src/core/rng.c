// rng.c — xoshiro256** (Blackman & Vigna), written from the published algorithm.
#include "rng.h"
#include <math.h>

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

void lm_rng_seed(lm_rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t lm_rng_u64(lm_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

uint32_t lm_rng_below(lm_rng *r, uint32_t n) {
    // multiply-shift: unbiased enough for n << 2^32 and fully deterministic
    return (uint32_t)(((lm_rng_u64(r) >> 32) * (uint64_t)n) >> 32);
}

double lm_rng_uniform(lm_rng *r) { return (double)(lm_rng_u64(r) >> 11) * 0x1.0p-53; }

double lm_rng_normal(lm_rng *r) {
    double u1 = lm_rng_uniform(r), u2 = lm_rng_uniform(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}
