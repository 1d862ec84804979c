// arena.c — see arena.h.
#include "arena.h"
#include <stdarg.h>

void lm_layout_init(lm_layout *L, const void *owner) {
    memset(L, 0, sizeof *L);
    L->owner = owner;
}

void lm_layout_free(lm_layout *L) {
    free(L->t);
    memset(L, 0, sizeof *L);
}

int lm_layout_add(lm_layout *L, void *slot, unsigned flags, int ndim, const int64_t *shape,
                  const char *name_fmt, ...) {
    LM_ASSERT(ndim >= 1 && ndim <= 4);
    if (L->n == L->cap) {
        L->cap = L->cap ? 2 * L->cap : 64;
        L->t = lm_realloc(L->t, (size_t)L->cap * sizeof *L->t);
    }
    lm_tensor_info *t = &L->t[L->n];
    memset(t, 0, sizeof *t);
    va_list ap;
    va_start(ap, name_fmt);
    int len = vsnprintf(t->name, sizeof t->name, name_fmt, ap);
    va_end(ap);
    LM_ASSERT(len > 0 && len < (int)sizeof t->name);
    t->ndim = ndim;
    t->numel = 1;
    for (int d = 0; d < ndim; d++) {
        LM_ASSERT(shape[d] > 0);
        t->shape[d] = shape[d];
        t->numel *= (size_t)shape[d];
    }
    t->flags = flags;
    // 16-element alignment keeps every tensor 64-byte aligned for vector loads
    L->numel = (L->numel + 15) & ~(size_t)15;
    t->offset = L->numel;
    size_t storage = flags & LM_T_INT ? (t->numel * sizeof(int) + sizeof(real) - 1) / sizeof(real) : t->numel;
    L->numel += storage;
    t->field = slot ? (const char *)slot - (const char *)L->owner : -1;
    return L->n++;
}

void lm_layout_bind(const lm_layout *L, void *instance, real *base) {
    for (int i = 0; i < L->n; i++) {
        const lm_tensor_info *t = &L->t[i];
        if (t->field < 0) continue;
        // memcpy: the field may be a real * or an int *
        void *p = base ? (void *)(base + t->offset) : NULL;
        memcpy((char *)instance + t->field, &p, sizeof p);
    }
}

int lm_layout_find(const lm_layout *L, const char *name) {
    for (int i = 0; i < L->n; i++)
        if (strcmp(L->t[i].name, name) == 0) return i;
    return -1;
}
