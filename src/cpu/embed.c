// embed.c — token embedding lookup and its scatter-add backward.
#include "cpu.h"

// out [N,C], tokens [N], table [Vocab,C]
void cpu_embed_fwd(real *out, const int *tokens, const real *table, int N, int C) {
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) memcpy(out + (size_t)i * C, table + (size_t)tokens[i] * C, C * sizeof(real));
}

// dtable [Vocab,C] += scatter of dout [N,C]. Parallel over channels, sequential over
// tokens, so repeated tokens add up in a fixed order (deterministic).
void cpu_embed_bwd(real *dtable, const int *tokens, const real *dout, int N, int C) {
    #pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++)
        for (int i = 0; i < N; i++) dtable[(size_t)tokens[i] * C + c] += dout[(size_t)i * C + c];
}
