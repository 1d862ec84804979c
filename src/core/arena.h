// arena.h — named tensors in one allocation (the llm.c pattern, generalised to a
// model whose layers differ from each other).
//
// A layout is built once by registering every tensor with its name, shape and the
// address of the struct field that should point at it. One allocation of
// layout.numel elements is then made, and lm_layout_bind() points the fields of any
// struct instance of the same type into it. The same layout therefore serves the
// parameters, their gradients and the optimiser moments: three instances of one
// struct bound to three allocations.
#ifndef LM_ARENA_H
#define LM_ARENA_H
#include "common.h"

enum {
    LM_T_NODECAY = 1u << 0,  // no weight decay (norm gains, biases, gate scalars, AttnRes vectors)
    LM_T_MATRIX  = 1u << 1,  // a 2-D hidden weight matrix (Muon-eligible)
    LM_T_EXPERT  = 1u << 2,  // stacked routed-expert weight [E, ...]: only top_k/E of it is active
    LM_T_EMBED   = 1u << 3,  // input embedding table: a lookup, not counted as active compute
    LM_T_BUFFER  = 1u << 4,  // state, not a trained parameter (router balancing bias)
    LM_T_INT     = 1u << 5,  // int32 elements (index tensors among activations)
    LM_T_NO_GRAD_ZERO = 1u << 6,  // activations: the backward needs no zeros in its gradient slot
                                  // (never used there, or an op's work buffer the op fills itself)
};

typedef struct {
    char name[LM_NAME_MAX];
    int ndim;
    int64_t shape[4];
    size_t offset;        // in `real` elements from the start of the allocation
    size_t numel;         // elements of the tensor's own type (int32 if LM_T_INT)
    unsigned flags;
    ptrdiff_t field;      // byte offset of the bound pointer field inside the owner struct, -1 if none
} lm_tensor_info;

typedef struct {
    lm_tensor_info *t;
    int n, cap;
    size_t numel;         // total elements, each tensor aligned to 16 elements
    const void *owner;    // the struct instance whose fields were registered
} lm_layout;

void lm_layout_init(lm_layout *L, const void *owner);
void lm_layout_free(lm_layout *L);
// Registers a tensor; `slot` is the address of a pointer field of `owner` (real * or,
// with LM_T_INT, int *), or NULL. Returns its index.
int lm_layout_add(lm_layout *L, void *slot, unsigned flags, int ndim, const int64_t *shape,
                  const char *name_fmt, ...) __attribute__((format(printf, 6, 7)));
// Points every registered field of `instance` (same type as the owner) into `base`.
void lm_layout_bind(const lm_layout *L, void *instance, real *base);
int lm_layout_find(const lm_layout *L, const char *name);   // -1 if absent

// convenience for shapes
#define LM_SHAPE(...) ((const int64_t[]){__VA_ARGS__})
#define LM_NDIM(...) ((int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))

#endif
