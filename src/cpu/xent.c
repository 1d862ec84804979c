// xent.c — softmax cross-entropy over the vocabulary.
#include "cpu.h"

// logits [N,V], targets [N] (< 0 ignored); losses [N], lse [N]
void cpu_xent_fwd(real *losses, real *lse, const real *logits, const int *targets, int N, int V) {
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const real *z = logits + (size_t)i * V;
        real mx = z[0];
        for (int j = 1; j < V; j++) mx = z[j] > mx ? z[j] : mx;
        real s = 0;
        for (int j = 0; j < V; j++) s += exp(z[j] - mx);
        real l = mx + log(s);
        lse[i] = l;
        losses[i] = targets[i] >= 0 ? l - z[targets[i]] : 0;
    }
}

void cpu_xent_bwd(real *dlogits, const real *logits, const real *lse, const int *targets, real dloss,
                  int N, int V) {
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        if (targets[i] < 0) continue;
        const real *z = logits + (size_t)i * V;
        real *dz = dlogits + (size_t)i * V;
        for (int j = 0; j < V; j++) dz[j] += dloss * exp(z[j] - lse[i]);
        dz[targets[i]] -= dloss;
    }
}
