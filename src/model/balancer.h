// TEMP STUB
#ifndef LM_BALANCER_H
#define LM_BALANCER_H
#include "ops.h"
typedef enum { LM_BAL_QB, LM_BAL_SIGN, LM_BAL_QUARTILE, LM_BAL_AUX, LM_BAL_NONE } lm_balance_kind;
typedef struct { int E; } lm_balancer;
static inline void lm_balancer_init(lm_balancer *b, const lm_ops *o, int k, int E, int tk, int nb, real r, real *bias) { (void)b;(void)o;(void)k;(void)E;(void)tk;(void)nb;(void)r;(void)bias; }
static inline void lm_balancer_free(lm_balancer *b, const lm_ops *o) {(void)b;(void)o;}
static inline void lm_balancer_observe(lm_balancer *b, const lm_ops *o, const real *s, const real *a, const int *c, int N) {(void)b;(void)o;(void)s;(void)a;(void)c;(void)N;}
#endif
