// batch.c — see batch.h.
#include "train/batch.h"
#include "core/common.h"

void lm_batch_reserve(lm_batch *b, int B, int T) {
    LM_ASSERT(B > 0 && T > 0);
    size_t n = (size_t)B * (size_t)T;
    if (n > b->cap_tok) {
        free(b->tokens);
        free(b->targets);
        b->tokens = lm_malloc(n * sizeof(int));
        b->targets = lm_malloc(n * sizeof(int));
        b->cap_tok = n;
    }
    b->B = B;
    b->T = T;
    b->n_ex = 0;
}

void lm_batch_add_example(lm_batch *b, lm_example e) {
    if (b->n_ex == b->cap_ex) {
        b->cap_ex = b->cap_ex ? 2 * b->cap_ex : 64;
        b->ex = lm_realloc(b->ex, (size_t)b->cap_ex * sizeof(lm_example));
    }
    b->ex[b->n_ex++] = e;
}

void lm_batch_free(lm_batch *b) {
    free(b->tokens);
    free(b->targets);
    free(b->ex);
    memset(b, 0, sizeof *b);
}
