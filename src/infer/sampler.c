// sampler.c — see sampler.h.
#include "infer/sampler.h"

void lm_sampler_init(lm_sampler *s, real temperature, int top_k, real top_p, uint64_t seed) {
    memset(s, 0, sizeof *s);
    s->temperature = temperature;
    s->top_k = top_k;
    s->top_p = top_p;
    lm_rng_seed(&s->rng, seed);
}

void lm_sampler_free(lm_sampler *s) {
    free(s->idx);
    free(s->prob);
    s->idx = NULL;
    s->prob = NULL;
}

static const double *g_prob;   // qsort context (single-threaded use)
static int by_prob_desc(const void *a, const void *b) {
    double pa = g_prob[*(const int *)a], pb = g_prob[*(const int *)b];
    if (pa != pb) return pa < pb ? 1 : -1;
    return *(const int *)a - *(const int *)b;   // ties: lower id first, deterministic
}

int lm_sample(lm_sampler *s, const real *logits, int V) {
    int best = 0;
    for (int v = 1; v < V; v++)
        if (logits[v] > logits[best]) best = v;
    if (s->temperature <= 0) return best;
    if (s->cap < V) {
        s->idx = lm_realloc(s->idx, (size_t)V * sizeof(int));
        s->prob = lm_realloc(s->prob, (size_t)V * sizeof(double));
        s->cap = V;
    }
    double sum = 0;
    for (int v = 0; v < V; v++) {
        s->prob[v] = exp(((double)logits[v] - logits[best]) / s->temperature);
        sum += s->prob[v];
        s->idx[v] = v;
    }
    for (int v = 0; v < V; v++) s->prob[v] /= sum;
    g_prob = s->prob;
    qsort(s->idx, (size_t)V, sizeof(int), by_prob_desc);
    int n = s->top_k > 0 && s->top_k < V ? s->top_k : V;
    if (s->top_p < 1) {
        double c = 0;
        for (int i = 0; i < n; i++) {
            c += s->prob[s->idx[i]];
            if (c >= s->top_p) { n = i + 1; break; }
        }
    }
    double tot = 0;
    for (int i = 0; i < n; i++) tot += s->prob[s->idx[i]];
    double u = lm_rng_uniform(&s->rng) * tot, c = 0;
    for (int i = 0; i < n; i++) {
        c += s->prob[s->idx[i]];
        if (u < c) return s->idx[i];
    }
    return s->idx[n - 1];
}
